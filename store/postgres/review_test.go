package postgres_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestBatchDeadlockRerunsAlone: the server refuses a batch for a deadlock
// (as two proxies' batches of duplicated requests can make: a reservation
// of a held key locks its row, a commit of another waits for a row) after
// the batch inserted a new key: its commit waits for a row lock, and the
// other session then waits for the key the batch inserted. The statement
// is rolled back; a caller told "reserved" must find its record in the
// table. It pins that no row of the batch reaches runBatch before the
// error (PostgreSQL runs a statement with data-modifying CTEs to the end
// before it sends a row): Reserve checks o.reserved before o.alone, so a
// row read before the error would tell "reserved" for a rolled-back
// insert.
func TestBatchDeadlockRerunsAlone(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "refused_late"
	s := newStore(t, srv, postgres.Options{Table: table})
	c := ctx(t)
	const blocked, fresh = "r/-/blocked", "r/-/fresh"
	if rec, err := s.Reserve(c, blocked, store.Reservation{Token: "b", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve(%s) = %+v, %v", blocked, rec, err)
	}
	tx := lockRow(t, srv, table, blocked)
	g := closeGate(t, srv, s, table)
	reserved := make(chan reserveResult, 1)
	go func() {
		rec, err := s.Reserve(context.Background(), fresh, store.Reservation{Token: "n", Lease: time.Minute, TTL: time.Hour})
		reserved <- reserveResult{fresh, "n", rec, err}
	}()
	committed := make(chan error, 1)
	go func() {
		committed <- s.Commit(context.Background(), blocked, "b", store.Response{Status: 200}, time.Hour)
	}()
	g.open(2)
	waitFor(t, "the batch to wait for the lock of "+blocked, func() bool { return batchWaiting(srv, table) })
	// The other session now waits for the batch's uncommitted key: a
	// deadlock, which PostgreSQL resolves by failing the batch (it waited
	// first, so its deadlock check runs first).
	_, xerr := tx.Exec(c, `INSERT INTO `+table+` (key, state, token, fingerprint, created_at, lease_expires_at, expires_at)
VALUES ($1, 'in_flight', 'x', '', now(), now() + interval '1 hour', now() + interval '1 hour') ON CONFLICT DO NOTHING`, fresh)
	t.Logf("the other session's insert: %v", xerr)
	tx.Rollback(context.Background())
	got := <-reserved
	if err := <-committed; err != nil {
		t.Errorf("Commit(%s) rerun alone after the deadlock: %v", blocked, err)
	}
	if got.err != nil || got.rec != nil {
		t.Fatalf("Reserve(%s) = %+v, %v; want it reserved by its rerun alone", fresh, got.rec, got.err)
	}
	rec, err := s.Get(c, fresh)
	if err != nil || rec == nil || rec.Token != "n" || rec.State != store.StateInFlight {
		t.Errorf("Reserve(%s) in a batch the server refused = reserved; Get = %+v, %v; want the caller's in-flight record", fresh, rec, err)
	}
}

// TestBatchOfLargeCommitsFitsTheStatementTimeout: concurrent commits of
// large answers (max_stored_body_bytes is 1 MiB by default) share one
// statement. Each alone takes far less than the statement timeout; the
// batch of them must not fail them all (57014 fails every caller of the
// batch, and the settler's retries batch them again), leaving their keys
// in flight and then in doubt for the whole TTL.
//
// The statement timeout is the machine's: 8 times the slowest of three
// commits alone (500 ms at least), measured first on the same table with
// a generous timeout, so that each alone fits it on a busy machine too;
// the 63 commits in one statement would take about 63 times one.
func TestBatchOfLargeCommitsFitsTheStatementTimeout(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "large_commits"
	c := ctx(t)
	const n = 64
	body := make([]byte, 1<<20)
	rand.Read(body)
	reserve := func(s *postgres.Store, key string) {
		t.Helper()
		if rec, err := s.Reserve(c, key, store.Reservation{Token: "t", Lease: time.Hour, TTL: time.Hour}); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v", key, rec, err)
		}
	}
	// Alone: how long one commit takes here, now.
	paced := newStore(t, srv, postgres.Options{Table: table})
	var i int
	alone := testrun.Pace(func() {
		key := "r/-/alone-" + strconv.Itoa(i)
		i++
		reserve(paced, key)
		if err := paced.Commit(c, key, "t", store.Response{Status: 200, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatalf("Commit alone: %v", err)
		}
	})
	timeout := max(500*time.Millisecond, 8*alone)
	t.Logf("one 1 MiB commit alone (with its reservation): %v; statement timeout %v", alone, timeout)
	s := newStore(t, srv, postgres.Options{Table: table, StatementTimeout: timeout})
	for i := 1; i < n; i++ {
		reserve(s, "r/-/"+strconv.Itoa(i))
	}
	g := closeGate(t, srv, s, table)
	errs := make(chan error, n)
	for i := 1; i < n; i++ {
		go func() {
			errs <- s.Commit(context.Background(), "r/-/"+strconv.Itoa(i), "t", store.Response{Status: 200, Body: body, BodyStored: true}, time.Hour)
		}()
	}
	g.open(n - 1)
	failed := 0
	var first error
	for i := 1; i < n; i++ {
		if err := <-errs; err != nil {
			failed++
			first = err
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d concurrent 1 MiB commits failed (%v); each alone fits the statement timeout", failed, n-1, first)
	}
}

// TestBatchOneLockedKeyDoesNotFailTheOthers: a batch holds reservations of
// ten free keys and one of a key whose row another session holds locked
// (an operator's transaction, another proxy's slow batch) past the
// statement timeout. statement_timeout cancels the batch (57014), which
// rolls it back; the ten free keys, which alone would be reserved at once,
// must not all fail with it (a client retrying the locked key would put it
// in every batch and fail every write of the proxy).
func TestBatchOneLockedKeyDoesNotFailTheOthers(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "one_locked"
	s := newStore(t, srv, postgres.Options{Table: table, StatementTimeout: 500 * time.Millisecond})
	const n = 10
	unblock, results := blockedBatch(t, srv, s, table, n, nil)
	time.Sleep(1500 * time.Millisecond) // past the statement timeout
	unblock()
	failed := 0
	var first error
	for i, r := range results {
		got := <-r
		if i == n {
			continue // the locked key's own reservation may fail
		}
		if got.err != nil || got.rec != nil {
			failed++
			first = got.err
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d reservations of free keys failed with the batch that waited for another key's lock (%v)", failed, n, first)
	}
}
