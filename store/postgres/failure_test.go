package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// hangGuard bounds each call of the outage tests; a call that has not
// returned by then counts as hanging. It is far above the store's own
// bounds (ConnectTimeout + StatementTimeout), which are what end the calls.
const hangGuard = 30 * time.Second

// call runs f with no deadline of its own and returns its error, failing
// the test if it does not return within hangGuard.
func call(t *testing.T, name string, f func(ctx context.Context) error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f(context.Background()) }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("%s did not return within %v with the database down", name, hangGuard)
		return nil
	}
}

// everyMethod is each Store and ReconcileStore method on key, as the proxy
// and the reconciler call them.
func everyMethod(s *postgres.Store, key string) []struct {
	name string
	f    func(ctx context.Context) error
} {
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	return []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"Reserve", func(ctx context.Context) error {
			_, err := s.Reserve(ctx, key+"/new", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			return err
		}},
		{"Get", func(ctx context.Context) error { _, err := s.Get(ctx, key); return err }},
		{"Commit", func(ctx context.Context) error { return s.Commit(ctx, key, "t", resp, time.Hour) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, key, "t") }},
		{"MarkInDoubt", func(ctx context.Context) error { return s.MarkInDoubt(ctx, key, "t", time.Hour) }},
		{"Ping", s.Ping},
		{"ScheduleLookup", func(ctx context.Context) error { return s.ScheduleLookup(ctx, key, 0) }},
		{"UnscheduleLookup", func(ctx context.Context) error { return s.UnscheduleLookup(ctx, key) }},
		{"ClaimLookup", func(ctx context.Context) error { return s.ClaimLookup(ctx, key, "l", time.Minute, true) }},
		{"ResolveLookup", func(ctx context.Context) error {
			return s.ResolveLookup(ctx, key, "l", store.LookupResult{RetryAfter: time.Minute})
		}},
		{"DueLookups", func(ctx context.Context) error { _, err := s.DueLookups(ctx, 10); return err }},
		{"Unscheduled", func(ctx context.Context) error { _, err := s.Unscheduled(ctx, "r/", 10); return err }},
		{"Sweep", func(ctx context.Context) error { _, err := s.Sweep(ctx); return err }},
	}
}

// TestDatabaseDownAndBack stops PostgreSQL (cleanly, with SIGKILL, and by
// freezing it with SIGSTOP, where connections open but nothing answers):
// every method fails with an error, none hangs; once the database is back
// the same Store serves again, and the records written before are there.
func TestDatabaseDownAndBack(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{
		ConnectTimeout: postgres.DefaultConnectTimeout, StatementTimeout: postgres.DefaultStatementTimeout,
	})
	c := ctx(t)
	res := store.Reservation{Token: "tok-a", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for _, down := range []struct {
		name        string
		stop, start func()
	}{
		{"stopped", srv.Stop, srv.Start},
		{"killed", srv.Kill, srv.Start},
		{"paused", srv.Pause, srv.Resume},
	} {
		t.Run(down.name, func(t *testing.T) {
			key := "r/-/" + down.name
			if rec, err := s.Reserve(c, key, res); err != nil || rec != nil {
				t.Fatalf("Reserve before the outage = %+v, %v; want nil, nil", rec, err)
			}
			down.stop()
			for _, m := range everyMethod(s, key) {
				err := call(t, m.name, m.f)
				if err == nil || errors.Is(err, store.ErrNotOwner) {
					t.Errorf("%s with the database %s = %v; want a store error", m.name, down.name, err)
				}
				t.Logf("%s: %v", m.name, err)
			}
			down.start()
			if err := s.Ping(c); err != nil {
				t.Fatalf("Ping after the restart: %v", err)
			}
			rec, err := s.Get(c, key)
			if err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != "tok-a" {
				t.Fatalf("Get after the restart = %+v, %v; want the in-flight record kept", rec, err)
			}
			if err := s.Commit(c, key, "tok-a", store.Response{Status: 200, BodyStored: true}, time.Hour); err != nil {
				t.Errorf("Commit after the restart: %v", err)
			}
			if rec, err := s.Reserve(c, key+"/after", res); err != nil || rec != nil {
				t.Errorf("Reserve after the restart = %+v, %v; want nil, nil", rec, err)
			}
		})
	}
}

// TestBusyPoolAndSlowStatementsAreErrors holds a row lock from outside, so
// that the store's one connection waits on it: that statement ends with
// statement_timeout's error, and a second call, finding no connection,
// gives up after the connect timeout. Neither hangs, and both work once the
// lock is gone.
func TestBusyPoolAndSlowStatementsAreErrors(t *testing.T) {
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{
		Table: "busy", MaxConns: 1, ConnectTimeout: 300 * time.Millisecond, StatementTimeout: 2 * time.Second,
	})
	c := ctx(t)
	const key = "r/-/locked"
	if rec, err := s.Reserve(c, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v", rec, err)
	}
	locker, err := pgx.Connect(c, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(c, `SELECT 1 FROM busy WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}

	slow := make(chan error, 1)
	go func() { slow <- s.Commit(context.Background(), key, "t", store.Response{Status: 200}, time.Hour) }()
	// Wait until the commit waits for the lock, holding the only connection.
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(20 * time.Millisecond) {
		n := srv.MustExec(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%busy%'`)
		if n == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the commit never waited for the row lock")
		}
	}
	err = call(t, "Get with the pool busy", func(ctx context.Context) error { _, err := s.Get(ctx, "r/-/other"); return err })
	if err == nil || !strings.Contains(err.Error(), "no connection within") {
		t.Errorf("Get with the only connection busy = %v; want a no-connection error", err)
	}
	select {
	case err := <-slow:
		if err == nil || !strings.Contains(err.Error(), "statement timeout") {
			t.Errorf("Commit waiting for a lock = %v; want statement_timeout's error", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Commit waiting for a lock did not return")
	}
	if err := tx.Rollback(c); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(c, key, "t", store.Response{Status: 200}, time.Hour); err != nil {
		t.Errorf("Commit after the lock was released: %v", err)
	}
}

// TestReservationAfterItsCallerGaveUpTakesNothing freezes the database
// while a reservation is sent: the caller gets an error (and the proxy
// would answer 503 and release the key). When the database wakes up the
// statement runs, past its deadline, and must not reserve the key, or it
// would stay in flight and then in doubt for a request never forwarded.
// A reservation in a batch carries its caller's deadline the same way.
func TestReservationAfterItsCallerGaveUpTakesNothing(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batched"}[batch], func(t *testing.T) {
			t.Parallel()
			lateReservation(t, batch)
		})
	}
}

func lateReservation(t *testing.T, batch bool) {
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{
		Table: "late", ConnectTimeout: 300 * time.Millisecond, StatementTimeout: 300 * time.Millisecond,
	})
	if batch {
		s.AlwaysBatch()
	}
	c := ctx(t)
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	// A pooled connection for the reservation to go out on.
	if rec, err := s.Reserve(c, "r/-/warm", res); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v", rec, err)
	}
	srv.Pause()
	err := call(t, "Reserve with the database frozen", func(ctx context.Context) error {
		_, err := s.Reserve(ctx, "r/-/late", res)
		return err
	})
	srv.Resume()
	if err == nil {
		t.Fatal("Reserve with the database frozen succeeded; want an error")
	}
	// Let the backends work off what they received while frozen.
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(20 * time.Millisecond) {
		busy := srv.MustExec(`SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
		if busy == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("backends still busy after the database woke up")
		}
	}
	if got := srv.MustExec(`SELECT count(*) FROM late WHERE key = 'r/-/late'`); got != "0" {
		t.Errorf("rows for the reservation whose caller gave up = %s; want 0", got)
	}
	if rec, err := s.Reserve(c, "r/-/late", res); err != nil || rec != nil {
		t.Errorf("Reserve after the database woke up = %+v, %v; want the key free", rec, err)
	}
}
