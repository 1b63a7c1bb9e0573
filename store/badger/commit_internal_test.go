package badger

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
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

// stored reads key from Badger itself, past the store's memory.
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

// A commit returns before the writer has applied it, and is visible at
// once: a retry right after the answer is replayed, never told 409.
func TestCommitVisibleBeforeApplied(t *testing.T) {
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	release := holdWriter(t, s)
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if rec := stored(t, s, "k"); rec == nil || rec.State != store.StateInFlight {
		t.Fatalf("in Badger while the writer is held: %+v, want still in flight (the commit is queued)", rec)
	}
	for name, read := range map[string]func() (*store.Record, error){
		"Get": func() (*store.Record, error) { return s.Get(ctx, "k") },
		"Reserve": func() (*store.Record, error) {
			return s.Reserve(ctx, "k", store.Reservation{Token: "t2", Lease: time.Minute, TTL: time.Hour})
		},
	} {
		rec, err := read()
		if err != nil || rec == nil || rec.State != store.StateCompleted || rec.Fingerprint != "fp1" ||
			rec.Response == nil || string(rec.Response.Body) != string(answer.Body) {
			t.Errorf("%s before the commit is applied: %+v %v, want the completed answer", name, rec, err)
		}
	}
	release()
	// The reservation t2 was answered from memory: it must not have
	// been written either.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(Options{Dir: s.db.Opts().Dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rec, err := s2.Get(ctx, "k")
	if err != nil || rec == nil || rec.State != store.StateCompleted || rec.Fingerprint != "fp1" ||
		string(rec.Response.Body) != string(answer.Body) || rec.ExpiresAt.IsZero() {
		t.Errorf("after reopening: %+v %v, want the completed answer", rec, err)
	}
	if len(s.mem.pending) != 0 || len(s.mem.owned) != 0 {
		t.Errorf("memory after the commit was applied: %d pending, %d owned, want none", len(s.mem.pending), len(s.mem.owned))
	}
}

// A commit whose batch fails stays visible and is written again while the
// lease holds.
func TestAsyncCommitRetriedAfterAFailedBatch(t *testing.T) {
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	var fails atomic.Int32
	fails.Store(2)
	commit := s.w.commit
	s.w.commit = func(txn *bdg.Txn) error {
		if fails.Add(-1) >= 0 {
			return errors.New("disk on fire")
		}
		return commit(txn)
	}
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); err != nil {
		t.Fatalf("commit: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rec := stored(t, s, "k"); rec == nil || rec.State != store.StateCompleted; rec = stored(t, s, "k") {
		if rec, err := s.Get(ctx, "k"); err != nil || rec == nil || rec.State != store.StateCompleted {
			t.Fatalf("Get while the commit is retried: %+v %v, want completed", rec, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("commit never written after the failures: %+v", rec)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if fails.Load() >= 0 {
		t.Errorf("the failing commits were not all tried: %d left", fails.Load()+1)
	}
}

// A commit that cannot be written before its lease ends is dropped: the
// key is then what Badger holds, in flight until the lease lapses and in
// doubt after, as after a failed synchronous commit; never completed in
// memory only.
func TestAsyncCommitGivesUpAtTheLease(t *testing.T) {
	ctx := context.Background()
	s := openInternal(t)
	res := reservation1
	res.Lease = 300 * time.Millisecond
	mustReserve(t, s, "k", res)
	s.w.commit = func(*bdg.Txn) error { return errors.New("disk on fire") }
	if err := s.Commit(ctx, "k", "t1", answer, time.Hour); err != nil {
		t.Fatalf("commit: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.mem.committed("k") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the failing commit is still in memory long after its lease")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec == nil || rec.State != store.StateInDoubt {
		t.Errorf("after the lease: %+v %v, want in doubt", rec, err)
	}
}

// A commit by a token that does not own the key fails at once, whether
// the store made the reservation or not; an operator's release queued
// after a commit wins.
func TestAsyncCommitOwnership(t *testing.T) {
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
	// A commit, then a release queued behind it before it is applied.
	mustReserve(t, s, "k2", reservation1)
	release := holdWriter(t, s)
	if err := s.Commit(ctx, "k2", "t1", answer, time.Hour); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- s.Release(ctx, "k2", "t1") }()
	waitQueued(t, s, 2)
	release()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "k2"); err != nil || rec != nil {
		t.Errorf("after commit then release: %+v %v, want no record", rec, err)
	}
	if rec := stored(t, s, "k2"); rec != nil {
		t.Errorf("in Badger after commit then release: %+v, want none", rec)
	}
}

// Reservations that were never settled (their store calls failed) do not
// stay in memory past their lease.
func TestUnsettledReservationsForgotten(t *testing.T) {
	s := openInternal(t)
	now := time.Now()
	for i := range 3 * minSweep {
		s.mem.own(string(rune(i)), record{Token: "t", Lease: now.Add(-time.Second).UnixMilli()}, now.UnixMilli())
	}
	if n := len(s.mem.owned); n > minSweep {
		t.Errorf("%d lapsed reservations remembered, want at most %d", n, minSweep)
	}
}

// A large answer's commit waits for the writer: pending commits outlive
// their requests' share of the buffered-bytes budget, so only small ones
// may.
func TestLargeAnswerCommitWaits(t *testing.T) {
	ctx := context.Background()
	s := openInternal(t)
	mustReserve(t, s, "k", reservation1)
	big := answer
	big.Body = make([]byte, maxAsyncBody+1)
	release := holdWriter(t, s)
	done := make(chan error, 1)
	go func() { done <- s.Commit(ctx, "k", "t1", big, time.Hour) }()
	waitQueued(t, s, 1)
	select {
	case err := <-done:
		t.Fatalf("commit of a large answer returned before the writer applied it: %v", err)
	default:
	}
	if s.mem.committed("k") != nil {
		t.Error("a large answer was kept in memory")
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rec := stored(t, s, "k"); rec == nil || rec.State != store.StateCompleted || len(rec.Response.Body) != len(big.Body) {
		t.Errorf("in Badger: %+v, want the completed large answer", rec)
	}
}

// A commit answered but not written because the store failed is written
// again by the Guard on the store it reopens, within the lease: it is not
// lost with the failed store's memory (the key would be in doubt for its
// whole TTL).
func TestGuardWritesALostCommitOnTheReopenedStore(t *testing.T) {
	g := openGuardInternal(t)
	ctx := context.Background()
	const key = "pay/-/k1"
	if rec, err := g.Reserve(ctx, key, reservation1); err != nil || rec != nil {
		t.Fatalf("reserve: %+v %v", rec, err)
	}
	g.cur.Store.w.commit = func(*bdg.Txn) error { return errors.New("badger: panic: nil memtable") }
	if err := g.Commit(ctx, key, "t1", answer, time.Hour); err != nil {
		t.Fatalf("commit: %v", err)
	}
	waitReopen(t, g, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := g.Get(ctx, key)
		if err == nil && rec != nil && rec.State == store.StateCompleted && string(rec.Response.Body) == string(answer.Body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the reopen: %+v %v, want the committed answer", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
