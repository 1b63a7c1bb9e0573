package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// batched returns a Store whose every write goes through a batch (the
// batch statement), even one made while nothing else runs.
func batched(t *testing.T, srv *pgtest.Server, opts postgres.Options) *postgres.Store {
	s := newStore(t, srv, opts)
	s.AlwaysBatch()
	return s
}

// TestConformanceBatched runs the conformance suites on Stores whose every
// write is run by the batch statement, in each query exec mode the store
// supports: what a batch answers is what the single statements answer.
func TestConformanceBatched(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, mode := range []string{"", "exec", "simple_protocol"} {
		dsn := srv.DSN()
		if mode != "" {
			dsn += "&default_query_exec_mode=" + mode
		}
		t.Run("mode="+mode, func(t *testing.T) {
			t.Run("store", func(t *testing.T) {
				storetest.Run(t, func(t *testing.T) store.Store { return batched(t, srv, postgres.Options{DSN: dsn}) })
			})
			t.Run("reconcile", func(t *testing.T) {
				storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
					return batched(t, srv, postgres.Options{DSN: dsn})
				})
			})
		})
	}
}

// gate holds the Store's writes in its queue: it runs a commit alone (the
// Store being idle) of a record whose row another session has locked, so
// that every write made until open is called queues behind it and then
// goes to the database in one batch.
type gate struct {
	t    *testing.T
	s    *postgres.Store
	tx   pgx.Tx
	done chan error
}

var gates atomic.Int64

func closeGate(t *testing.T, srv *pgtest.Server, s *postgres.Store, table string) *gate {
	t.Helper()
	c := ctx(t)
	s.Serial() // the gate's stalled commit holds every write behind it
	key := "gate/-/" + strconv.FormatInt(gates.Add(1), 10)
	if rec, err := s.Reserve(c, key, store.Reservation{Token: "g", Lease: time.Hour, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve(gate) = %+v, %v", rec, err)
	}
	tx := lockRow(t, srv, table, key)
	g := &gate{t: t, s: s, tx: tx, done: make(chan error, 1)}
	go func() { g.done <- s.Commit(context.Background(), key, "g", store.Response{Status: 200}, time.Hour) }()
	waitFor(t, "the gate's commit to wait for its row lock", func() bool {
		return srv.MustExec(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%`+table+`%'`) == "1"
	})
	return g
}

// open lets the gate's commit through once n writes are queued.
func (g *gate) open(n int) {
	g.t.Helper()
	waitFor(g.t, strconv.Itoa(n)+" writes queued", func() bool { return g.s.Queued() >= n })
	if err := g.tx.Rollback(context.Background()); err != nil {
		g.t.Fatal(err)
	}
	if err := <-g.done; err != nil {
		g.t.Errorf("the gate's commit: %v", err)
	}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// statementCalls returns pg_stat_statements' executions of the statements
// that mention table.
func statementCalls(t *testing.T, srv *pgtest.Server, table string) int {
	t.Helper()
	n, err := strconv.Atoi(srv.MustExec(`SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%` + table + `%'`))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConcurrentWritesShareStatements: writes made at the same time share
// statements. pg_stat_statements counts the statements on the table: n
// concurrent reservations, and then their n commits, take far fewer than n
// statement executions each, and every reservation and commit is applied
// as its caller was told.
func TestConcurrentWritesShareStatements(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
	srv.MustExec(`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	s := newStore(t, srv, postgres.Options{Table: "shared_stmts"})
	const n = 64
	res := func(i int) store.Reservation {
		return store.Reservation{Token: "t" + strconv.Itoa(i), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	key := func(i int) string { return "r/-/" + strconv.Itoa(i) }
	for _, phase := range []struct {
		name  string
		write func(i int) error
	}{
		{"Reserve", func(i int) error {
			rec, err := s.Reserve(context.Background(), key(i), res(i))
			if err == nil && rec != nil {
				err = fmt.Errorf("found %+v; want the key reserved", rec)
			}
			return err
		}},
		{"Commit", func(i int) error {
			return s.Commit(context.Background(), key(i), res(i).Token, store.Response{Status: 201, Body: []byte(strconv.Itoa(i)), BodyStored: true}, time.Hour)
		}},
	} {
		g := closeGate(t, srv, s, "shared_stmts")
		srv.MustExec(`SELECT pg_stat_statements_reset()`)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = phase.write(i) }()
		}
		g.open(n)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s(%s): %v", phase.name, key(i), err)
			}
		}
		// The gate's commit is one of them.
		if got := statementCalls(t, srv, "shared_stmts"); got >= n/4 {
			t.Errorf("%d concurrent %s calls took %d statement executions; want far fewer than %d (shared)", n, phase.name, got, n)
		} else {
			t.Logf("%d concurrent %s calls: %d statement executions", n, phase.name, got)
		}
	}
	c := ctx(t)
	for i := range n {
		rec, err := s.Get(c, key(i))
		if err != nil || rec == nil || rec.State != store.StateCompleted || rec.Token != res(i).Token || string(rec.Response.Body) != strconv.Itoa(i) {
			t.Errorf("Get(%s) = %+v, %v; want completed by %s with body %d", key(i), rec, err, res(i).Token, i)
		}
	}
}

// TestBatchedReservationsOfOneKey: of many reservations of the same keys
// made at once, and so queued together, exactly one per key takes it; the
// others get its record.
func TestBatchedReservationsOfOneKey(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "one_key"})
	const keys, tries = 8, 8
	g := closeGate(t, srv, s, "one_key")
	type result struct {
		key, token string
		rec        *store.Record
		err        error
	}
	results := make(chan result, keys*tries)
	for k := range keys {
		for i := range tries {
			go func() {
				key, tok := "r/-/"+strconv.Itoa(k), fmt.Sprintf("t%d-%d", k, i)
				rec, err := s.Reserve(context.Background(), key, store.Reservation{Token: tok, Fingerprint: "fp" + tok, Lease: time.Minute, TTL: time.Hour})
				results <- result{key, tok, rec, err}
			}()
		}
	}
	g.open(keys * tries)
	winners := map[string]string{}
	var lost []result
	for range keys * tries {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("Reserve(%s, %s): %v", r.key, r.token, r.err)
		case r.rec == nil:
			if w, ok := winners[r.key]; ok {
				t.Errorf("Reserve(%s): both %s and %s took the key", r.key, w, r.token)
			}
			winners[r.key] = r.token
		default:
			lost = append(lost, r)
		}
	}
	if len(winners) != keys {
		t.Errorf("%d keys taken, want %d: %v", len(winners), keys, winners)
	}
	for _, r := range lost {
		if w := winners[r.key]; r.rec.State != store.StateInFlight || r.rec.Token != w || r.rec.Fingerprint != "fp"+w {
			t.Errorf("Reserve(%s, %s) found %+v; want the in-flight record of the winner %s", r.key, r.token, r.rec, w)
		}
	}
}

// TestBatchMixedWrites: a batch of reservations, commits, releases and
// in-doubt marks, one of the commits by a former owner whose record was
// taken over after it expired. Only that commit gets ErrNotOwner (and
// changes nothing); a reservation whose key PostgreSQL's index cannot take
// fails alone, and so does one that finds a record it cannot read (a
// completed row without its answer, written by hand); every other write is
// applied.
func TestBatchMixedWrites(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "mixed"})
	c := ctx(t)
	own := func(key string) {
		if rec, err := s.Reserve(c, key, store.Reservation{Token: "own", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v", key, rec, err)
		}
	}
	for _, k := range []string{"r/-/commit", "r/-/release", "r/-/doubt"} {
		own(k)
	}
	// The former owner's record expires and a new owner takes the key.
	if rec, err := s.Reserve(c, "r/-/stolen", store.Reservation{Token: "old", Lease: time.Millisecond, TTL: 50 * time.Millisecond}); err != nil || rec != nil {
		t.Fatalf("Reserve(stolen, old) = %+v, %v", rec, err)
	}
	time.Sleep(200 * time.Millisecond)
	own("r/-/stolen")

	srv.MustExec(`INSERT INTO mixed (key, state, token, fingerprint, created_at, expires_at) VALUES ('r/-/broken', 'completed', 'x', 'fp', now(), now() + interval '1 hour')`)
	huge := make([]byte, 6000) // random: no compression fits it in an index entry
	rand.Read(huge)
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	writes := []struct {
		name    string
		f       func(ctx context.Context) error
		wantErr func(error) bool
	}{
		{"Commit(stolen) by its former owner", func(ctx context.Context) error {
			return s.Commit(ctx, "r/-/stolen", "old", resp, time.Hour)
		}, func(err error) bool { return errors.Is(err, store.ErrNotOwner) }},
		{"Reserve(huge key)", func(ctx context.Context) error {
			_, err := s.Reserve(ctx, "r/-/"+hex.EncodeToString(huge), store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			return err
		}, func(err error) bool { return err != nil && !errors.Is(err, store.ErrNotOwner) }},
		{"Reserve(broken record)", func(ctx context.Context) error {
			_, err := s.Reserve(ctx, "r/-/broken", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			return err
		}, func(err error) bool { return err != nil && !errors.Is(err, store.ErrNotOwner) }},
		{"Commit", func(ctx context.Context) error { return s.Commit(ctx, "r/-/commit", "own", resp, time.Hour) }, nil},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, "r/-/release", "own") }, nil},
		{"MarkInDoubt", func(ctx context.Context) error { return s.MarkInDoubt(ctx, "r/-/doubt", "own", time.Hour) }, nil},
	}
	for i := range 10 {
		key := "r/-/new" + strconv.Itoa(i)
		writes = append(writes, struct {
			name    string
			f       func(ctx context.Context) error
			wantErr func(error) bool
		}{"Reserve(" + key + ")", func(ctx context.Context) error {
			rec, err := s.Reserve(ctx, key, store.Reservation{Token: "new", Lease: time.Minute, TTL: time.Hour})
			if err == nil && rec != nil {
				err = fmt.Errorf("found %+v", rec)
			}
			return err
		}, nil})
	}
	g := closeGate(t, srv, s, "mixed")
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = w.f(context.Background()) }()
	}
	g.open(len(writes))
	wg.Wait()
	for i, w := range writes {
		if w.wantErr == nil && errs[i] != nil || w.wantErr != nil && !w.wantErr(errs[i]) {
			t.Errorf("%s in a batch = %v", w.name, errs[i])
		}
	}
	for _, want := range []struct {
		key   string
		state store.State
		token string
	}{
		{"r/-/stolen", store.StateInFlight, "own"},
		{"r/-/commit", store.StateCompleted, "own"},
		{"r/-/release", "", ""},
		{"r/-/doubt", store.StateInDoubt, "own"},
		{"r/-/new3", store.StateInFlight, "new"},
	} {
		rec, err := s.Get(c, want.key)
		switch {
		case err != nil:
			t.Errorf("Get(%s): %v", want.key, err)
		case want.state == "" && rec != nil:
			t.Errorf("Get(%s) = %+v; want no record", want.key, rec)
		case want.state != "" && (rec == nil || rec.State != want.state || rec.Token != want.token):
			t.Errorf("Get(%s) = %+v; want %s by %s", want.key, rec, want.state, want.token)
		}
	}
}

// blockBatch locks the row of key (which must exist) from another session,
// so that a batch reserving key waits for it, at the database; the lock
// ends with the returned function.
func blockBatch(t *testing.T, srv *pgtest.Server, table, key string) func() {
	t.Helper()
	tx := lockRow(t, srv, table, key)
	return func() { tx.Rollback(context.Background()) }
}

// lockRow locks the row of key in table (which must exist) with SELECT
// ... FOR UPDATE in a transaction of another session, and returns that
// transaction: the lock holds until it ends, or the test does.
func lockRow(t *testing.T, srv *pgtest.Server, table, key string) pgx.Tx {
	t.Helper()
	c := ctx(t)
	conn, err := pgx.Connect(c, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(c, `SELECT 1 FROM `+table+` WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// batchWaiting reports whether a batch statement on table waits for a
// row lock.
func batchWaiting(srv *pgtest.Server, table string) bool {
	return srv.MustExec(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH p AS%`+table+`%'`) == "1"
}

// blockedBatch queues, behind a gate, n reservations of new keys and one
// of blocker, a key whose row another session has locked, and lets them go
// as one batch. The batch inserts the new keys (they sort before blocker)
// and then waits for the lock: blockedBatch returns then, with the
// function that ends the lock and the callers' results, in key order, the
// blocker's last. ctxs[i], when set, is the context of the i-th caller.
func blockedBatch(t *testing.T, srv *pgtest.Server, s *postgres.Store, table string, n int, ctxs map[int]context.Context) (unblock func(), results []chan reserveResult) {
	t.Helper()
	c := ctx(t)
	const blocker = "r/-/~blocker"
	if rec, err := s.Reserve(c, blocker, store.Reservation{Token: "b", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve(blocker) = %+v, %v", rec, err)
	}
	unblock = blockBatch(t, srv, table, blocker)
	t.Cleanup(unblock)
	g := closeGate(t, srv, s, table)
	for i := range n + 1 {
		key, tok := "r/-/"+strconv.Itoa(i), "t"+strconv.Itoa(i)
		if i == n {
			key, tok = blocker, "b2"
		}
		rctx := ctxs[i]
		if rctx == nil {
			rctx = context.Background()
		}
		r := make(chan reserveResult, 1)
		results = append(results, r)
		go func() {
			rec, err := s.Reserve(rctx, key, store.Reservation{Token: tok, Lease: time.Minute, TTL: time.Hour})
			r <- reserveResult{key, tok, rec, err}
		}()
	}
	g.open(n + 1)
	waitFor(t, "the batch to wait for the blocker's lock", func() bool { return batchWaiting(srv, table) })
	return unblock, results
}

type reserveResult struct {
	key, token string
	rec        *store.Record
	err        error
}

// TestBatchOnATerminatedSession: the session running a batch is ended
// (pg_terminate_backend, as an administrator or a failover does) while the
// batch waits at the database, after it inserted some of its keys, and so
// is the session the store tries it again on. Every caller in the batch
// gets an error, none a reservation, and nothing of the batch is applied.
func TestBatchOnATerminatedSession(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "term_batch"})
	const n = 20
	unblock, results := blockedBatch(t, srv, s, "term_batch", n, nil)
	terminated := 0
	for i, r := range results {
		var got reserveResult
	wait:
		for {
			select {
			case got = <-r:
				break wait
			case <-time.After(20 * time.Millisecond):
				if batchWaiting(srv, "term_batch") {
					terminated += mustInt(t, srv.MustExec(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'WITH p AS%term_batch%' AND pid <> pg_backend_pid()`))
				}
			}
		}
		if got.err == nil {
			t.Errorf("Reserve(%s) in the batch whose sessions were terminated = %+v, nil; want an error", got.key, got.rec)
		}
		if i == 0 {
			t.Logf("Reserve(%s): %v", got.key, got.err)
		}
	}
	if terminated < 2 {
		t.Errorf("terminated %d sessions; want the batch's and its retry's", terminated)
	}
	unblock()
	if got := srv.MustExec(`SELECT count(*) FROM term_batch WHERE token LIKE 't%'`); got != "0" {
		t.Errorf("%s records of the terminated batch in the table; want none", got)
	}
	c := ctx(t)
	if rec, err := s.Reserve(c, "r/-/0", store.Reservation{Token: "after", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Errorf("Reserve after the batch = %+v, %v; want the key free", rec, err)
	}
}

// TestBatchCallerGivingUp: a caller whose context ends while its batch is
// at the database returns at once with its context's error; the batch goes
// on for the others, who get their answers.
func TestBatchCallerGivingUp(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "give_up"})
	const n = 10
	quit, cancel := context.WithCancel(context.Background())
	defer cancel()
	unblock, results := blockedBatch(t, srv, s, "give_up", n, map[int]context.Context{3: quit})
	cancel()
	select {
	case got := <-results[3]:
		if !errors.Is(got.err, context.Canceled) {
			t.Errorf("Reserve(%s) whose caller gave up = %+v, %v; want context.Canceled", got.key, got.rec, got.err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the caller that gave up did not return while its batch waited")
	}
	if !batchWaiting(srv, "give_up") {
		t.Error("the batch no longer waits at the database after one caller gave up")
	}
	unblock()
	for i, r := range results {
		if i == 3 {
			continue
		}
		got := <-r
		switch {
		case i == n:
			if got.err != nil || got.rec == nil || got.rec.Token != "b" {
				t.Errorf("Reserve(%s) = %+v, %v; want the blocker's record", got.key, got.rec, got.err)
			}
		case got.err != nil || got.rec != nil:
			t.Errorf("Reserve(%s) = %+v, %v; want it reserved", got.key, got.rec, got.err)
		}
	}
}

func mustInt(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRowLockStallsOnlyItsKey: another session holds one key's row (SELECT
// ... FOR UPDATE in an open transaction). The write of that key waits for
// the lock, and the writes of other keys made meanwhile, reservations and
// commits, complete while it waits; once the lock is let go the held
// key's write completes too.
func TestRowLockStallsOnlyItsKey(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "lock_one_key"
	// Longer than the lock is held: the held key's write must wait, not
	// time out.
	s := newStore(t, srv, postgres.Options{Table: table, StatementTimeout: 2 * time.Minute})
	c := ctx(t)
	const held = "r/-/held"
	res := func(tok string) store.Reservation {
		return store.Reservation{Token: tok, Fingerprint: "fp", Lease: 5 * time.Minute, TTL: time.Hour}
	}
	if rec, err := s.Reserve(c, held, res("h")); err != nil || rec != nil {
		t.Fatalf("Reserve(held) = %+v, %v", rec, err)
	}
	tx := lockRow(t, srv, table, held)
	heldDone := make(chan error, 1)
	go func() {
		heldDone <- s.Commit(context.Background(), held, "h", store.Response{Status: 201, BodyStored: true}, time.Hour)
	}()
	waitFor(t, "the held key's commit to wait for its row lock", func() bool {
		return srv.MustExec(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%`+table+`%'`) == "1"
	})

	// Other keys, written while the held key's commit waits: several
	// rounds, so that some queue behind it and others behind them.
	const n = 40
	others, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, tok := "r/-/"+strconv.Itoa(i), "t"+strconv.Itoa(i)
			if rec, err := s.Reserve(others, key, res(tok)); err != nil || rec != nil {
				errs <- fmt.Errorf("Reserve(%s) while another key's row is locked = %+v, %w", key, rec, err)
				return
			}
			if err := s.Commit(others, key, tok, store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
				errs <- fmt.Errorf("Commit(%s) while another key's row is locked: %w", key, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case err := <-heldDone:
		t.Fatalf("the held key's commit returned (%v) while its row was locked", err)
	default:
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-heldDone:
		if err != nil {
			t.Errorf("the held key's commit after the lock was let go: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the held key's commit did not complete after the lock was let go")
	}
	if rec, err := s.Get(c, held); err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Errorf("held key after its commit = %+v, %v; want completed", rec, err)
	}
}

// TestReleaseWithAFullQueueWaitsForItsReservation: a reservation in a
// batch that waits at the database (another key's row lock) is given up by
// its caller (its context ends), who takes it back with Release, as the
// proxy does, while the queue is full. The release must not run before the
// reservation it takes back: run alone at once, it finds nothing to delete
// (the insert is not committed yet), and the key is left in flight, then
// in doubt, for a request that was never forwarded.
func TestReleaseWithAFullQueueWaitsForItsReservation(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "release_full"
	s := newStore(t, srv, postgres.Options{Table: table, StatementTimeout: 2 * time.Minute})
	given, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	unblock, results := blockedBatch(t, srv, s, table, 1, map[int]context.Context{0: given})
	giveUp()
	r := <-results[0]
	if r.err == nil {
		t.Fatalf("Reserve(%s) whose caller gave up = %+v, nil; want its context's error", r.key, r.rec)
	}

	// The queue full, behind the waiting batch.
	filled := fillQueue(t, s)
	released := releaseBehind(s, r.key, r.token)
	unblock()
	if err := <-released; err != nil && !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Release(%s): %v", r.key, err)
	}
	filled.Wait()
	for _, r := range results[1:] {
		<-r
	}
	if rec, err := s.Get(ctx(t), r.key); err != nil || rec != nil {
		t.Errorf("%s after its reservation was taken back = %+v, %v; want no record", r.key, rec, err)
	}
}

// TestFullQueueWriteOfAQueuedKeyWaitsItsTurn: a write made while the
// queue is full, of a key that has a write queued, waits behind it. Run
// alone at once, it put its key in line for the next batch a second time,
// and that batch took the key's one queued write twice (the second time
// from an empty queue: a panic, which ends the process).
func TestFullQueueWriteOfAQueuedKeyWaitsItsTurn(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const table = "full_queued_key"
	s := newStore(t, srv, postgres.Options{Table: table})
	g := closeGate(t, srv, s, table)
	const key = "r/-/queued"
	reserved := make(chan error, 1)
	go func() {
		rec, err := s.Reserve(context.Background(), key, store.Reservation{Token: "a", Lease: time.Minute, TTL: time.Hour})
		if err == nil && rec != nil {
			err = fmt.Errorf("found %+v", rec)
		}
		reserved <- err
	}()
	waitFor(t, "the key's reservation queued", func() bool { return s.Queued() == 1 })
	filled := fillQueue(t, s)
	released := releaseBehind(s, key, "not-a")
	g.open(0)
	if err := <-reserved; err != nil {
		t.Fatalf("Reserve(%s) = %v, want it reserved", key, err)
	}
	if err := <-released; !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("Release(%s) with another token = %v, want ErrNotOwner", key, err)
	}
	filled.Wait()
	if rec, err := s.Get(ctx(t), key); err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != "a" {
		t.Errorf("%s = %+v, %v; want in flight under token a", key, rec, err)
	}
}

// fillQueue queues reservations of new keys until s's queue is full, and
// returns what waits for them.
func fillQueue(t *testing.T, s *postgres.Store) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range postgres.MaxQueued - s.Queued() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "fill/-/" + strconv.Itoa(i)
			if rec, err := s.Reserve(context.Background(), key, store.Reservation{Token: "f", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
				t.Errorf("Reserve(%s) = %+v, %v", key, rec, err)
			}
		}()
	}
	waitFor(t, "a full queue", func() bool { return s.Queued() >= postgres.MaxQueued })
	return &wg
}

// releaseBehind releases key under token in the background, with the
// queue full and a write of key ahead of it, and gives it a second to
// answer wrongly: before the write ahead of it is done. Its answer comes
// on the channel.
func releaseBehind(s *postgres.Store, key, token string) chan error {
	released := make(chan error, 1)
	go func() { released <- s.Release(context.Background(), key, token) }()
	select {
	case err := <-released:
		released <- err // answered before the write ahead of it: the bug
	case <-time.After(time.Second):
	}
	return released
}
