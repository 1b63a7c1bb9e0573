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
// authMaxClients, each failing often enough for a penalty, track at most
// authMaxClients of them, so a flood from many addresses cannot grow the
// table; the addresses beyond it are never throttled for the others'
// failures (TestAuthLimiterFullTableNeverRefusesAFreshClient), and a
// client tracked before the flood, which never reached authMaxFailures,
// is not throttled either.
func TestAuthLimiterMemoryIsBounded(t *testing.T) {
	l := newAuthLimiter()
	now := time.Unix(1_700_000_000, 0)
	l.fail("198.51.100.1", now) // a client with its own entry
	penalized := 0
	for i := range 3 * authMaxClients {
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		for range authMaxFailures {
			if l.wait(addr, now) > 0 {
				break
			}
			if l.fail(addr, now) {
				penalized++
			}
		}
		checkAuthTable(t, l)
	}
	if n := len(l.clients); n > authMaxClients {
		t.Errorf("%d clients tracked, want at most %d", n, authMaxClients)
	}
	if penalized != authMaxClients {
		t.Errorf("%d addresses of the flood penalized, want %d (one per entry)", penalized, authMaxClients)
	}
	if l.wait("198.51.100.1", now) != 0 {
		t.Errorf("the client tracked before the flood is throttled by the flood's failures")
	}
	// Once their penalties are over, the entries make room again.
	later := now.Add(authWindow + authPenalty)
	for range authMaxFailures {
		l.fail("203.0.113.1", later)
	}
	if l.clients["203.0.113.1"] == nil || l.wait("203.0.113.1", later) == 0 {
		t.Errorf("a new client failing %d times after the flood's penalties is not tracked and throttled", authMaxFailures)
	}
	checkAuthTable(t, l)
}

// TestAuthLimiterFullTableNeverRefusesAFreshClient: an attacker with
// authMaxClients+1 addresses (IPv6 /64s of one /48) fills the table, then
// fails authMaxFailures times from one more address. The operator, from an
// address that never failed, is not refused (it was, for authPenalty,
// renewable for ever, while failures beyond the table shared one
// penalty); the attacker's address that failed authMaxFailures times is
// refused for authPenalty, and so are the table's penalized addresses.
// Variants: the table full of addresses that failed once, and full of
// addresses under a penalty.
func TestAuthLimiterFullTableNeverRefusesAFreshClient(t *testing.T) {
	tests := []struct {
		name          string
		failuresEach  int  // failures of each address filling the table
		lastPenalized bool // whether the address failing after them must be refused
	}{
		// The reviewer's scenario: the table's entries are the least
		// recently failing, so the last address takes one.
		{"table of single failures", 1, true},
		{"table of addresses one failure short of a penalty", authMaxFailures - 1, true},
		// Every entry is under a penalty: the last address gets none, and
		// is answered 401 rather than refused with everyone else.
		{"table of penalized addresses", authMaxFailures, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newAuthLimiter()
			now := time.Unix(1_700_000_000, 0)
			for i := range authMaxClients {
				for range tt.failuresEach {
					l.fail(fmt.Sprintf("2001:db8:0:%x::/64", i), now)
				}
			}
			last := "2001:db8:1:1::/64"
			for range authMaxFailures {
				l.fail(last, now)
			}
			checkAuthTable(t, l)
			at := now.Add(time.Second)
			if w := l.wait("192.0.2.10", at); w != 0 {
				t.Errorf("the operator at 192.0.2.10, which never failed, is refused for %v, want 0", w)
			}
			if got, want := l.wait(last, at), authPenalty-time.Second; tt.lastPenalized && got != want {
				t.Errorf("wait of %s after %d failures = %v, want %v", last, authMaxFailures, got, want)
			}
			if tt.failuresEach == authMaxFailures {
				for i := range authMaxClients {
					if a := fmt.Sprintf("2001:db8:0:%x::/64", i); l.wait(a, at) == 0 {
						t.Fatalf("%s, penalized, is not refused after another address failed", a)
					}
				}
			}
		})
	}
}

// TestAuthLimiterRotatingAttacker: the attacker's next variant rotates
// over more addresses than the table holds, each failing a few times a
// round, with every tenth address failing authMaxFailures times in a
// burst. The table stays bounded, the operator at a fresh address is
// never refused, and each address that reached authMaxFailures within a
// minute is refused for the rest of its penalty, however many other
// addresses failed after it.
func TestAuthLimiterRotatingAttacker(t *testing.T) {
	l := newAuthLimiter()
	t0 := time.Unix(1_700_000_000, 0)
	addrs := authMaxClients + authMaxClients/2
	penalizedAt := map[string]time.Time{}
	now := t0
	for round := range 3 {
		for i := range addrs {
			now = t0.Add(time.Duration(round*addrs+i) * time.Millisecond)
			a := fmt.Sprintf("2001:db8:%x:%x::/64", i>>16, i&0xffff)
			n := 2
			if i%10 == 0 {
				n = authMaxFailures
			}
			for range n {
				if l.wait(a, now) > 0 {
					break // the handler answers 429 without checking the token
				}
				if l.fail(a, now) {
					penalizedAt[a] = now
				}
			}
		}
		checkAuthTable(t, l)
	}
	if len(penalizedAt) == 0 {
		t.Fatal("no address of the attacker was penalized")
	}
	if w := l.wait("192.0.2.10", now); w != 0 {
		t.Errorf("the operator at 192.0.2.10, which never failed, is refused for %v, want 0", w)
	}
	for a, at := range penalizedAt {
		if want := at.Add(authPenalty).Sub(now); want > 0 && l.wait(a, now) != want {
			t.Errorf("wait of %s, penalized at +%v = %v, want %v", a, at.Sub(t0), l.wait(a, now), want)
		}
	}
}

// checkAuthTable asserts that l holds at most authMaxClients entries, each
// on the list its penalty says.
func checkAuthTable(t *testing.T, l *authLimiter) {
	t.Helper()
	if n := len(l.clients); n > authMaxClients || n != l.free.Len()+l.penalized.Len() {
		t.Fatalf("%d clients tracked, %d free and %d penalized in the lists, want equal and at most %d",
			n, l.free.Len(), l.penalized.Len(), authMaxClients)
	}
}
