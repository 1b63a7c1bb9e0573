package admin

import (
	"fmt"
	"testing"
	"time"
)

// TestAuthLimiterPenaltyEnds: the penalty ends authPenalty after the
// failure that started it, and failures spread wider than authWindow
// never start one.
func TestAuthLimiterPenaltyEnds(t *testing.T) {
	l := newAuthLimiter()
	t0 := time.Unix(1_700_000_000, 0)
	for i := range authMaxFailures - 1 {
		if l.fail("192.0.2.1", t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("failure %d started a penalty, want the %dth", i+1, authMaxFailures)
		}
	}
	end := t0.Add(time.Duration(authMaxFailures-1) * time.Second)
	if !l.fail("192.0.2.1", end) {
		t.Fatalf("failure %d started no penalty", authMaxFailures)
	}
	if got := l.wait("192.0.2.1", end.Add(time.Second)); got != authPenalty-time.Second {
		t.Errorf("wait a second into the penalty = %v, want %v", got, authPenalty-time.Second)
	}
	if got := l.wait("192.0.2.1", end.Add(authPenalty)); got != 0 {
		t.Errorf("wait when the penalty ends = %v, want 0", got)
	}

	// Fewer than authMaxFailures in any window: never a penalty.
	slow := newAuthLimiter()
	every := authWindow/time.Duration(authMaxFailures-1) + time.Second
	for i := range 3 * authMaxFailures {
		if slow.fail("192.0.2.9", t0.Add(time.Duration(i)*every)) {
			t.Fatalf("failure %d, one every %v, started a penalty", i+1, every)
		}
	}
}

// TestAuthLimiterMemoryIsBounded: failures from more addresses than
// authMaxClients track at most authMaxClients of them; the rest share one
// allowance, so a flood from many addresses is throttled as one client
// instead of growing the map, and an address tracked before the flood
// keeps its own allowance.
func TestAuthLimiterMemoryIsBounded(t *testing.T) {
	l := newAuthLimiter()
	now := time.Unix(1_700_000_000, 0)
	l.fail("198.51.100.1", now) // a client with its own entry
	throttled := 0
	for i := range 3 * authMaxClients {
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		if l.wait(addr, now) > 0 {
			throttled++
			continue
		}
		l.fail(addr, now)
	}
	if n := len(l.clients); n > authMaxClients {
		t.Errorf("%d clients tracked, want at most %d", n, authMaxClients)
	}
	if throttled == 0 {
		t.Errorf("no address of the flood beyond %d was throttled", authMaxClients)
	}
	if l.wait("198.51.100.1", now) != 0 {
		t.Errorf("the client tracked before the flood is throttled by the flood's allowance")
	}
	// Once their window is over, the entries make room again.
	later := now.Add(authWindow + authPenalty)
	l.fail("203.0.113.1", later)
	if l.clients["203.0.113.1"] == nil {
		t.Errorf("a new client after the window is not tracked on its own")
	}
}
