package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

func openInternal(t *testing.T) *Store {
	t.Helper()
	s, err := Open(Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// holdWriter occupies the writer with a closure (one that needs no sync)
// that blocks until the returned function is called, so that whatever is
// queued meanwhile lands in the next batch, together.
func holdWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, unblock, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- s.updateLazy(func(*wtxn) error {
			select {
			case <-started:
			default:
				close(started)
			}
			<-unblock
			return nil
		})
	}()
	<-started
	return func() {
		close(unblock)
		if err := <-done; err != nil {
			t.Errorf("holding closure: %v", err)
		}
	}
}

// waitQueued waits until n closures are queued behind the writer.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.w.q.Len() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d closures queued, want %d", s.w.q.Len(), n)
		}
	}
}

// countCommits wraps the writer's commit to count the batches committed.
func countCommits(s *Store) *int {
	var n int
	commit := s.w.commit
	s.w.commit = func(txn *bdg.Txn) error { n++; return commit(txn) }
	return &n
}

// TestOneKeyReservedOnceInOneBatch: concurrent reservations of one key that
// are applied in one transaction see each other: exactly one wins, the
// others get its in-flight record, and they share one commit.
func TestOneKeyReservedOnceInOneBatch(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 16, maxBatchOps - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := openInternal(t)
			release := holdWriter(t, s)
			commits := countCommits(s)
			type res struct {
				tok string
				rec *store.Record
				err error
			}
			out := make(chan res, n)
			for i := range n {
				tok := fmt.Sprintf("t%d", i)
				go func() {
					rec, err := s.Reserve(context.Background(), "k", store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
					out <- res{tok, rec, err}
				}()
			}
			waitQueued(t, s, n)
			release()
			var winners []string
			for range n {
				r := <-out
				switch {
				case r.err != nil:
					t.Fatalf("reserve %s: %v", r.tok, r.err)
				case r.rec == nil:
					winners = append(winners, r.tok)
				case r.rec.State != store.StateInFlight:
					t.Errorf("loser %s saw state %s, want in_flight", r.tok, r.rec.State)
				}
			}
			if len(winners) != 1 {
				t.Fatalf("winners = %v, want exactly one", winners)
			}
			rec, err := s.Get(context.Background(), "k")
			if err != nil || rec == nil || rec.Token != winners[0] {
				t.Fatalf("stored %+v %v, want the winner %s", rec, err, winners[0])
			}
			// The holding batch's commit, then one for all n reservations.
			if *commits != 2 {
				t.Errorf("%d commits, want 2 (the n reservations in one batch)", *commits)
			}
		})
	}
}

// TestFailedBatchFailsEveryCaller: when a batch's commit fails, every
// caller in it gets the error and none of their writes is stored; the
// next batch works again.
func TestFailedBatchFailsEveryCaller(t *testing.T) {
	t.Parallel()
	s := openInternal(t)
	release := holdWriter(t, s)
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := s.Reserve(context.Background(), fmt.Sprintf("k%d", i), store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			errs <- err
		}()
	}
	waitQueued(t, s, n)
	// The holding closure's batch commits; the next one, the n
	// reservations, fails.
	boom := errors.New("disk on fire")
	commit, calls := s.w.commit, 0
	s.w.commit = func(txn *bdg.Txn) error {
		calls++
		if calls == 2 {
			return boom
		}
		return commit(txn)
	}
	release()
	for range n {
		if err := <-errs; !errors.Is(err, boom) {
			t.Errorf("reserve: err = %v, want the batch's %v", err, boom)
		}
	}
	for i := range n {
		if rec, err := s.Get(context.Background(), fmt.Sprintf("k%d", i)); err != nil || rec != nil {
			t.Errorf("k%d stored after a failed batch: %+v %v", i, rec, err)
		}
	}
	if rec, err := s.Reserve(context.Background(), "k0", store.Reservation{Token: "t2", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Errorf("reserve after the failed batch: %+v %v", rec, err)
	}
}

// TestFailingClosureFailsOnlyItsCaller: a closure that writes and then
// fails gets its own error, its writes are not committed, and the other
// closures of its batch succeed.
func TestFailingClosureFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	s := openInternal(t)
	release := holdWriter(t, s)
	bad := errors.New("bad closure")
	results := make(chan error, 3)
	for i, k := range []string{"a", "bad", "b"} {
		go func() {
			results <- s.update(func(txn *wtxn) error {
				if err := txn.Set([]byte(k), []byte("v")); err != nil {
					return err
				}
				if k == "bad" {
					return bad
				}
				return nil
			})
		}()
		waitQueued(t, s, i+1) // in this order: "a" runs before "bad", and again after
	}
	release()
	var badSeen, ok int
	for range 3 {
		switch err := <-results; {
		case errors.Is(err, bad):
			badSeen++
		case err == nil:
			ok++
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if badSeen != 1 || ok != 2 {
		t.Fatalf("bad=%d ok=%d, want 1 and 2", badSeen, ok)
	}
	err := s.db.View(func(txn *bdg.Txn) error {
		for k, want := range map[string]bool{"a": true, "b": true, "bad": false} {
			_, err := txn.Get([]byte(k))
			if got := err == nil; got != want {
				t.Errorf("%s stored = %v, want %v (%v)", k, got, want, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestBatchLargerThanATransaction: a batch whose writes exceed Badger's
// transaction size is split over several transactions, and every write
// lands.
func TestBatchLargerThanATransaction(t *testing.T) {
	t.Parallel()
	s := openInternal(t)
	release := holdWriter(t, s)
	commits := countCommits(s)
	const n = 120
	val := bytes.Repeat([]byte("x"), 15<<10) // under the value threshold: counts in full
	errs := make(chan error, n)
	for i := range n {
		go func() {
			errs <- s.update(func(txn *wtxn) error { return txn.Set(fmt.Appendf(nil, "big%d", i), val) })
		}()
	}
	waitQueued(t, s, n)
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if *commits < 2 {
		t.Errorf("%d commits, want the batch split", *commits)
	}
	err := s.db.View(func(txn *bdg.Txn) error {
		for i := range n {
			if _, err := txn.Get(fmt.Appendf(nil, "big%d", i)); err != nil {
				t.Errorf("big%d: %v", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUpdateAfterClose: writes after Close fail instead of hanging.
func TestUpdateAfterClose(t *testing.T) {
	t.Parallel()
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.Reserve(context.Background(), "k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err == nil {
		t.Fatal("reserve after close succeeded")
	}
}

// BenchmarkGroupCommit measures reserve+commit pairs from 32 goroutines
// (the load of 32 connections) and reports how many closures share a
// commit and how many syncs a reserve+commit pair costs.
func BenchmarkGroupCommit(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			s, err := Open(Options{Dir: b.TempDir(), SyncWrites: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var commits atomic.Int64
			commit := s.w.commit
			s.w.commit = func(txn *bdg.Txn) error { commits.Add(1); return commit(txn) }
			var syncs atomic.Int64
			syncFn := s.w.sync
			s.w.sync = func() error { syncs.Add(1); return syncFn() }
			ctx := context.Background()
			resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"chargeId":"ch_1","orderId":"ORD-1","amount":10}`), BodyStored: true}
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					k := fmt.Sprintf("charges/-/ORD-%d", n.Add(1))
					if _, err := s.Reserve(ctx, k, store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
						b.Fatal(err)
					}
					if err := s.Commit(ctx, k, "t", resp, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(2*b.N)/float64(max(1, commits.Load())), "ops/commit")
			b.ReportMetric(float64(syncs.Load())/float64(b.N), "syncs/op")
		})
	}
}

// TestOnlyReservationsWaitForASync: a batch of commits is applied without
// a sync (losing it leaves keys in doubt, never charged twice); a batch
// with a reservation is synced once, before its reservations return; a
// failed sync fails the callers that waited for it.
func TestOnlyReservationsWaitForASync(t *testing.T) {
	t.Parallel()
	s := openInternal(t)
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	for i := range 4 {
		if _, err := s.Reserve(ctx, fmt.Sprintf("k%d", i), res); err != nil {
			t.Fatal(err)
		}
	}
	var syncs atomic.Int64
	var failSync atomic.Bool
	boom := errors.New("fsync failed")
	sync := s.w.sync
	s.w.sync = func() error {
		syncs.Add(1)
		if failSync.Load() {
			return boom
		}
		return sync()
	}
	resp := store.Response{Status: 201, BodyStored: true}

	// Commits only: no sync.
	release := holdWriter(t, s)
	errs := make(chan error, 4)
	for i := range 3 {
		go func() { errs <- s.Commit(ctx, fmt.Sprintf("k%d", i), "t", resp, time.Hour) }()
	}
	waitQueued(t, s, 3)
	release()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := syncs.Load(); n != 0 {
		t.Errorf("%d syncs for a batch of commits, want 0", n)
	}

	// A reservation with a commit: one sync for both.
	release = holdWriter(t, s)
	go func() { errs <- s.Commit(ctx, "k3", "t", resp, time.Hour) }()
	waitQueued(t, s, 1)
	go func() { _, err := s.Reserve(ctx, "new", res); errs <- err }()
	waitQueued(t, s, 2)
	release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := syncs.Load(); n != 1 {
		t.Errorf("%d syncs for a batch with a reservation, want 1", n)
	}

	// The sync fails: the reservation that waited for it gets the error;
	// the release, answered once applied and logged, before the sync, does
	// not.
	failSync.Store(true)
	release = holdWriter(t, s)
	reserved := make(chan error, 1)
	go func() { _, err := s.Reserve(ctx, "new2", res); reserved <- err }()
	waitQueued(t, s, 1)
	go func() { errs <- s.Release(ctx, "new", "t") }()
	waitQueued(t, s, 2)
	release()
	if err := <-reserved; !errors.Is(err, boom) {
		t.Errorf("reservation: err = %v, want the failed sync's", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("release in the batch whose sync failed: err = %v, want none (it needs no sync)", err)
	}
}

// TestStuckWriterFailsInsteadOfHanging: while Badger does not apply a
// batch (a write stall on a failing disk), a write answers an error after
// the writer's wait instead of hanging its request (and, behind the guard,
// every other one); once Badger moves again, writes go through.
func TestStuckWriterFailsInsteadOfHanging(t *testing.T) {
	t.Parallel()
	s := openInternal(t)
	release := holdWriter(t, s)
	s.w.wait = 100 * time.Millisecond
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	if _, err := s.Reserve(ctx, "stuck", res); !errors.Is(err, errStalled) {
		t.Errorf("reserve behind a stuck writer: err = %v, want %v", err, errStalled)
	}
	// A full queue gives up too, rather than block in Put.
	var wg sync.WaitGroup
	for range maxBatchOps {
		wg.Go(func() { s.Release(ctx, "absent", "t") })
	}
	waitQueued(t, s, maxBatchOps)
	if _, err := s.Reserve(ctx, "queued", res); !errors.Is(err, errStalled) {
		t.Errorf("reserve into a full queue: err = %v, want %v", err, errStalled)
	}
	release()
	wg.Wait()
	s.w.wait = defaultWriteWait
	if rec, err := s.Reserve(ctx, "after", res); err != nil || rec != nil {
		t.Errorf("reserve once the writer moves: %v, %v; want nil, nil", rec, err)
	}
}

// TestStalledReservationReleased: a reservation answered errStalled (its
// request is refused, never forwarded) does not stay behind once the
// writer moves: neither when its closure had not run yet, nor when it ran
// and its batch was being committed. Left, the key would read in flight
// for its lease and then in doubt for its TTL.
func TestStalledReservationReleased(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, s *Store) (release func())
	}{
		{"queued behind a stuck batch", holdWriter},
		{"in a batch whose commit is stuck", func(t *testing.T, s *Store) func() {
			unblock := make(chan struct{})
			commit := s.w.commit
			s.w.commit = func(txn *bdg.Txn) error { <-unblock; return commit(txn) }
			return func() { close(unblock) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openInternal(t)
			release := tc.hold(t, s)
			s.w.wait = 100 * time.Millisecond
			ctx := context.Background()
			res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
			if _, err := s.Reserve(ctx, "stuck", res); !errors.Is(err, errStalled) {
				t.Fatalf("reserve behind a stuck writer: err = %v, want %v", err, errStalled)
			}
			release()
			s.w.wait = defaultWriteWait
			// Once the release queued behind it is applied, the key is
			// free: another request reserves it (until then it may find
			// the abandoned reservation, which must go).
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				rec, err := s.Reserve(ctx, "stuck", store.Reservation{Token: "t2", Lease: time.Minute, TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				if rec == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the abandoned reservation is still there: %+v", rec)
				}
			}
		})
	}
}

// TestWriteAfterFailedRotation: a Badger that failed to rotate its
// memtable (its directory removed) has none, and its write goroutine
// log.Fatalf's (y.AssertTrue) on the next write it is sent: only a read in
// the writer's own goroutine panics recoverably first. A batch whose
// closures only write (the reconciler's delete of stale index entries)
// must fail, not end the process.
func TestWriteAfterFailedRotation(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(&guarded{Store: s}, 5*time.Second)
	loseMemtable(t, s, dir)
	t.Log("the memtable is lost; a write-only batch")
	err = s.update(func(txn *wtxn) error { return txn.Delete([]byte("stale-index-entry")) })
	if err == nil {
		t.Errorf("a write-only batch on a Badger without a memtable = nil, want an error")
	}
}

// TestGCAfterFailedRotation: value-log garbage collection reads every
// entry of the log it rewrites, and a Badger that failed to rotate its
// memtable panics on that read (nil memtable) in the store's own gc
// goroutine, where nothing recovered it: the process died at the next GC
// tick. The GC now fails like any operation on a failed store.
func TestGCAfterFailedRotation(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	value := make([]byte, 1<<20)
	fill := func(round byte) {
		// Badger itself, with the store's value sizes, compacting its
		// level 0 when it closes: the second round's compaction counts
		// the first round's values as discarded.
		db, err := bdg.Open(bdg.DefaultOptions(dir).WithLogger(nil).WithValueThreshold(valueThreshold).
			WithValueLogFileSize(valueLogFileSize).WithCompactL0OnClose(true))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 24 {
			value[0] = round
			if err := db.Update(func(txn *bdg.Txn) error {
				return txn.Set(fmt.Appendf(nil, "big-%d", i), value)
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fill(1)
	fill(2) // the first values are garbage now
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(&guarded{Store: s}, 5*time.Second)
	loseMemtable(t, s, dir)
	t.Log("the memtable is lost; value-log GC")
	if n := s.RunGC(); n != 0 {
		t.Errorf("RunGC on a store without a memtable rewrote %d logs, want 0", n)
	}
}

// loseMemtable removes s's directory dir and writes to s until Badger
// fails to rotate its memtable and is left without one (a write answers
// the panic of its read).
func loseMemtable(t *testing.T, s *Store, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Answers small enough to be kept in the tree (below valueThreshold):
	// larger ones go to the value log and fill the memtable slowly.
	body := make([]byte, 48)
	for i := range 100000 {
		k := fmt.Sprintf("k%d", i)
		r := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Reserve(ctx, k, r); err != nil {
			if strings.Contains(err.Error(), "panic") {
				return
			}
			continue
		}
		s.Commit(ctx, k, r.Token, store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour)
	}
	t.Fatal("Badger never lost its memtable with its directory removed; the test proves nothing")
}

// TestWtxnRecordsEveryWrite: the writer's transaction offers no write that
// the reservation log does not see. It embeds nothing (an embedded
// *bdg.Txn would offer Badger's every method, unrecorded); its methods are
// a read and the recorded writes, and each write kind a closure can make
// is in the batch's log record.
func TestWtxnRecordsEveryWrite(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[wtxn]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Anonymous {
			t.Errorf("wtxn embeds %s: its methods would write around the log", f.Type)
		}
	}
	writes := map[string]func(*wtxn) error{
		"Set": func(txn *wtxn) error { return txn.Set([]byte("k-set"), []byte("v1")) },
		"SetEntry": func(txn *wtxn) error {
			return txn.SetEntry(bdg.NewEntry([]byte("k-entry"), []byte("v2")).WithMeta(metaCompleted))
		},
		"Delete": func(txn *wtxn) error { return txn.Delete([]byte("k-del")) },
	}
	var methods []string
	for i := range reflect.PointerTo(typ).NumMethod() {
		name := reflect.PointerTo(typ).Method(i).Name
		methods = append(methods, name)
		if _, ok := writes[name]; !ok && name != "Get" {
			t.Errorf("wtxn offers %s, neither a read nor a recorded write", name)
		}
	}
	for name := range writes {
		if !slices.Contains(methods, name) {
			t.Errorf("wtxn lacks %s", name)
		}
	}
	want := map[string]byte{"k-set": walSet, "k-entry": walSet, "k-del": walDelete}
	s := openInternal(t)
	for name, write := range writes {
		var rec walRecorder
		rec.reset()
		txn := &wtxn{txn: s.db.NewTransaction(true), rec: &rec}
		if err := write(txn); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		txn.txn.Discard()
		var got []walEntry
		if err := decodeRecord(rec.buf[walHeader:], func(e walEntry) error { got = append(got, e); return nil }); err != nil {
			t.Fatalf("%s: decode the record: %v", name, err)
		}
		if len(got) != 1 || want[string(got[0].key)] != got[0].kind {
			t.Errorf("%s: the log's record holds %+v, want the one write", name, got)
		}
	}
}
