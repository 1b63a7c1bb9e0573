package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
)

// TestReserveAfterAClockStep: the offset to the database's clock is
// measured once per clockResample (30s). When a clock is stepped in
// between (NTP after a VM's pause or migration: the database's clock
// forward, or the proxy's back), the reservation's deadline, computed
// from the stale offset, lies in the database's past, and the INSERT
// refuses a key nobody holds. The store must notice (the caller is still
// waiting, yet the deadline has passed) and measure again, not answer
// 503 for every new key until the next sample.
func TestReserveAfterAClockStep(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, Options{DSN: srv.DSN(), Table: "step", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for _, step := range []time.Duration{2 * time.Second, time.Hour} {
		// The clock stepped by step since the last sample.
		s.clock.mu.Lock()
		s.clock.offset -= step
		s.clock.at = time.Now()
		s.clock.mu.Unlock()
		key := "r/-/" + step.String()
		if rec, err := s.Reserve(ctx, key, res); err != nil || rec != nil {
			t.Errorf("Reserve(%s) after a clock step of %v = %+v, %v; want nil, nil (the key is free)", key, step, rec, err)
		}
	}
}
