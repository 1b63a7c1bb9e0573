package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestTerminatedSessionsAreReplaced: an administrator's
// pg_terminate_backend (a sweep of idle sessions, a connection limit
// enforcer) ends the sessions the pool holds. The next call on each such
// connection meets the server's FATAL 57P01, although its statement never
// ran; every store operation is idempotent for its caller (a reservation
// finds its own token, a commit keeps its answer), so the call is run again
// on a new connection instead of answering 503.
func TestTerminatedSessionsAreReplaced(t *testing.T) {
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{
		Table: "term", ConnectTimeout: postgres.DefaultConnectTimeout, StatementTimeout: postgres.DefaultStatementTimeout,
	})
	c := ctx(t)
	key := "r/-/k"
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	steps := []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"Reserve", func(ctx context.Context) error {
			rec, err := s.Reserve(ctx, key, res)
			if err == nil && rec != nil {
				t.Errorf("Reserve = %+v; want the key reserved", rec)
			}
			return err
		}},
		{"Get", func(ctx context.Context) error { _, err := s.Get(ctx, key); return err }},
		{"MarkInDoubt", func(ctx context.Context) error { return s.MarkInDoubt(ctx, key, "t", time.Hour) }},
		{"ScheduleLookup", func(ctx context.Context) error { return s.ScheduleLookup(ctx, key, 0) }},
		{"DueLookups", func(ctx context.Context) error { _, err := s.DueLookups(ctx, 10); return err }},
		{"ClaimLookup", func(ctx context.Context) error { return s.ClaimLookup(ctx, key, "l", time.Minute, true) }},
		{"ResolveLookup", func(ctx context.Context) error {
			return s.ResolveLookup(ctx, key, "l", store.LookupResult{RetryAfter: time.Hour})
		}},
		{"Commit", func(ctx context.Context) error { return s.Commit(ctx, key, "t", resp, time.Hour) }},
		{"Ping", s.Ping},
		{"Unscheduled", func(ctx context.Context) error { _, err := s.Unscheduled(ctx, "r/", 10); return err }},
		{"Sweep", func(ctx context.Context) error { _, err := s.Sweep(ctx); return err }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, key, "t") }},
	}
	for _, step := range steps {
		if _, err := s.Get(c, "r/-/warm"); err != nil { // a pooled connection to terminate
			t.Fatalf("Get before %s: %v", step.name, err)
		}
		if got := srv.MustExec(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'idemproxy'`); got == "0" {
			t.Fatalf("no session of the store to terminate before %s", step.name)
		}
		time.Sleep(50 * time.Millisecond) // the server's FATAL reaches the pooled connection
		if err := call(t, step.name, step.f); err != nil {
			t.Errorf("%s after its pooled session was terminated: %v; want it run on a new connection", step.name, err)
		}
	}
}
