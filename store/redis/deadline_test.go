package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// TestReserveAfterStallLeavesNothing: a Reserve that gave up while Redis
// was stalled must not be applied when Redis resumes and runs the command
// still in its socket buffer. Its caller answered 503 ("nothing
// forwarded"); a reservation applied now would be held by nobody and turn
// the key in doubt for its whole TTL.
func TestReserveAfterStallLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, OpTimeout: 300 * time.Millisecond})
	c := ctx(t)
	if _, err := s.Reserve(c, "k/warm", res); err != nil { // connections and clock ready
		t.Fatal(err)
	}
	srv.Pause()
	keys := []string{"k/stalled-1", "k/stalled-2", "k/stalled-3"}
	for _, k := range keys {
		if _, err := s.Reserve(c, k, res); err == nil {
			t.Fatalf("Reserve %s with Redis paused succeeded", k)
		}
	}
	srv.Resume()
	for deadline := time.Now().Add(15 * time.Second); s.Ping(c) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Redis did not come back")
		}
	}
	// Ping answered: Redis has run everything that was queued before it.
	for _, k := range keys {
		if rec, err := s.Get(c, k); err != nil || rec != nil {
			t.Errorf("after the stall %s holds %+v (%v), want no record", k, rec, err)
		}
	}
}

// TestReserveLateIsRefused: a reservation whose deadline has passed on
// Redis' clock is refused and changes nothing; one in time is applied.
func TestReserveLateIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	c := ctx(t)
	if _, err := s.Reserve(c, "k/in-time", res); err != nil {
		t.Fatalf("Reserve in time: %v", err)
	}
	// Pretend Redis' clock is an hour ahead of the deadline.
	s.clock.mu.Lock()
	s.clock.offset -= time.Hour
	s.clock.mu.Unlock()
	_, err := s.Reserve(c, "k/late", res)
	if !errors.Is(err, errReserveLate) {
		t.Errorf("late Reserve = %v, want errReserveLate", err)
	}
	if rec, err := s.Get(c, "k/late"); err != nil || rec != nil {
		t.Errorf("late Reserve left %+v (%v)", rec, err)
	}
}
