package badger

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

var (
	answer = store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"chargeId":"ch_1"}`), BodyStored: true}
	reservation1 = store.Reservation{Token: "t1", Fingerprint: "fp1", Lease: time.Minute, TTL: time.Hour}
)

// stored reads key from Badger itself.
func stored(t *testing.T, s *Store, key string) *record {
	t.Helper()
	var rec *record
	err := s.db.View(func(txn *bdg.Txn) error {
		var err error
		rec, _, err = get(txn, []byte(key))
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return rec
}

func mustReserve(t *testing.T, s *Store, key string, res store.Reservation) {
	t.Helper()
	if rec, err := s.Reserve(context.Background(), key, res); err != nil || rec != nil {
		t.Fatalf("reserve %s: %+v %v", key, rec, err)
	}
}

// returned reports whether done has a result within a while, and the
// result.
func returned(done <-chan error, within time.Duration) (bool, error) {
	select {
	case err := <-done:
		return true, err
	case <-time.After(within):
		return false, nil
	}
}

// holdWriterOnce is holdWriter whose release may be called more than once,
// and is called when the test ends (before the store closes, which waits
// for the writer), should the test fail while it holds the writer.
func holdWriterOnce(t *testing.T, s *Store) (release func()) {
	var once sync.Once
	r := holdWriter(t, s)
	release = func() { once.Do(r) }
	t.Cleanup(release)
	return release
}

// TestCommitReturnsOnceApplied: the proxy answers the client once Commit
// returns, so Commit must not return before Badger has the answer: a
// process crash (kill -9) in between would lose an answer a client got
// (its retry would find the key in doubt). What Badger holds once Commit
// returned survives a crash: a copy of its files taken while it runs
// (the page cache, which is what kill -9 leaves), without the reservation
// log, opens with the answer.
func TestCommitReturnsOnceApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	release := holdWriterOnce(t, s)
	done := make(chan error, 1)
	go func() { done <- s.Commit(ctx, "k", "t1", answer, time.Hour) }()
	waitQueued(t, s, 1)
	if ok, err := returned(done, 200*time.Millisecond); ok {
		t.Fatalf("Commit returned (%v) while the writer was held: before Badger had the answer", err)
	}
	// Nothing of it is visible before it is applied: a duplicate must not
	// be replayed an answer that a crash could still take.
	for name, read := range map[string]func() (*store.Record, error){
		"Get": func() (*store.Record, error) { return s.Get(ctx, "k") },
		"List": func() (*store.Record, error) {
			l, _, err := s.List(ctx, store.ListQuery{State: store.StateCompleted, Limit: 10})
			if err != nil || len(l) == 0 {
				return nil, err
			}
			return &store.Record{State: l[0].State}, nil
		},
	} {
		if rec, err := read(); err != nil || (rec != nil && rec.State == store.StateCompleted) {
			t.Errorf("%s before the commit is applied: %+v %v, want not completed", name, rec, err)
		}
	}
	release()
	if ok, err := returned(done, 10*time.Second); !ok || err != nil {
		t.Fatalf("Commit after the writer was released: returned %v, err %v", ok, err)
	}
	if rec := stored(t, s, "k"); rec == nil || rec.State != store.StateCompleted || string(rec.Response.Body) != string(answer.Body) {
		t.Fatalf("in Badger once Commit returned: %+v, want the completed answer", rec)
	}
	crashed := filepath.Join(t.TempDir(), "crashed")
	copyDir(t, s.db.Opts().Dir, crashed) // Badger's files only: not the log
	s2, err := Open(Options{Dir: crashed})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if rec, err := s2.Get(ctx, "k"); err != nil || rec == nil || rec.State != store.StateCompleted ||
		string(rec.Response.Body) != string(answer.Body) {
		t.Errorf("Badger's files as a crash leaves them: %+v %v, want the completed answer", rec, err)
	}
}

// TestCommitDoesNotWaitForTheSync: a commit waits for its batch to be
// applied and logged, but not for the fdatasync the reservations of its
// batch wait for (it needs none: Options.SyncWrites); a reservation is
// still answered only once synced.
func TestCommitDoesNotWaitForTheSync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	syncing, unblock := make(chan struct{}, 1), make(chan struct{})
	var unblockOnce sync.Once
	t.Cleanup(func() { unblockOnce.Do(func() { close(unblock) }) })
	synced := s.w.sync
	s.w.sync = func() error {
		select {
		case syncing <- struct{}{}:
		default:
		}
		<-unblock
		return synced()
	}
	release := holdWriterOnce(t, s)
	committed, reserved := make(chan error, 1), make(chan error, 1)
	go func() { committed <- s.Commit(ctx, "k", "t1", answer, time.Hour) }()
	waitQueued(t, s, 1)
	go func() {
		_, err := s.Reserve(ctx, "r", store.Reservation{Token: "t2", Lease: time.Minute, TTL: time.Hour})
		reserved <- err
	}()
	waitQueued(t, s, 2)
	release() // the commit and the reservation: one batch, one sync
	<-syncing
	ok, err := returned(committed, 10*time.Second)
	if !ok || err != nil {
		t.Fatalf("commit while its batch's sync is under way: returned %v, err %v; want answered before the sync", ok, err)
	}
	if ok, err := returned(reserved, 200*time.Millisecond); ok {
		t.Errorf("reservation answered (%v) before its sync", err)
	}
	unblockOnce.Do(func() { close(unblock) })
	if ok, err := returned(reserved, 10*time.Second); !ok || err != nil {
		t.Fatalf("reservation after the sync: returned %v, err %v", ok, err)
	}
}

// TestCommitOfAFailedBatchFails: a commit whose batch fails returns the
// error (the proxy's settler retries it) and leaves nothing completed
// anywhere: never an answer that only this process's memory holds.
func TestCommitOfAFailedBatchFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	commit := s.w.commit
	s.w.commit = func(*bdg.Txn) error { return errors.New("disk on fire") }
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); err == nil {
		t.Fatal("commit of a failed batch: no error")
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec == nil || rec.State != store.StateInFlight {
		t.Errorf("after the failed commit: %+v %v, want still in flight", rec, err)
	}
	// The retry, as the settler makes it, writes it.
	s.w.commit = commit
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); err != nil {
		t.Fatalf("retried commit: %v", err)
	}
	if rec := stored(t, s, "k"); rec == nil || rec.State != store.StateCompleted {
		t.Errorf("after the retry: %+v, want completed", rec)
	}
}

// A commit by a token that does not own the key fails; an operator's
// release queued after a commit wins.
func TestCommitOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	if err := s.Commit(ctx, "k", "other", answer, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("commit with another token: %v, want ErrNotOwner", err)
	}
	if err := s.Commit(ctx, "nobody", "t1", answer, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("commit of a key never reserved: %v, want ErrNotOwner", err)
	}
	// Released by an operator while in flight, then taken by another
	// request: the first request's commit must not show its answer.
	if err := s.Release(ctx, "k", "t1"); err != nil {
		t.Fatalf("operator release: %v", err)
	}
	mustReserve(t, s, "k", store.Reservation{Token: "t2", Lease: time.Minute, TTL: time.Hour})
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("commit after the key was taken over: %v, want ErrNotOwner", err)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != "t2" {
		t.Errorf("after the stale commit: %+v %v, want t2's reservation in flight", rec, err)
	}
	// A commit, then a release queued behind it in the same batch.
	mustReserve(t, s, "k2", reservation1)
	release := holdWriterOnce(t, s)
	committed, deleted := make(chan error, 1), make(chan error, 1)
	go func() { committed <- s.Commit(ctx, "k2", "t1", answer, time.Hour) }()
	waitQueued(t, s, 1)
	go func() { deleted <- s.Release(ctx, "k2", "t1") }()
	waitQueued(t, s, 2)
	release()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "k2"); err != nil || rec != nil {
		t.Errorf("after commit then release: %+v %v, want no record", rec, err)
	}
}

// A commit that fails because the store failed is returned to its caller,
// whose retry (the proxy's settler) writes it on the store the Guard
// reopened, within the lease.
func TestGuardCommitRetriedOnTheReopenedStore(t *testing.T) {
	t.Parallel()
	g := openGuardInternal(t)
	ctx := context.Background()
	const key = "pay/-/k1"
	if rec, err := g.Reserve(ctx, key, reservation1); err != nil || rec != nil {
		t.Fatalf("reserve: %+v %v", rec, err)
	}
	g.cur.Store.w.commit = func(*bdg.Txn) error { return errors.New("badger: panic: nil memtable") }
	if err := g.Commit(ctx, key, "t1", answer, time.Hour); err == nil {
		t.Fatal("commit on a failing store: no error")
	}
	waitReopen(t, g, 1)
	if err := g.Commit(ctx, key, "t1", answer, time.Hour); err != nil {
		t.Fatalf("commit retried on the reopened store: %v", err)
	}
	if rec, err := g.Get(ctx, key); err != nil || rec == nil || rec.State != store.StateCompleted ||
		string(rec.Response.Body) != string(answer.Body) {
		t.Fatalf("after the reopen: %+v %v, want the committed answer", rec, err)
	}
}
