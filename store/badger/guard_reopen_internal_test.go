package badger

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// waitReopen waits until g has been reopened n times.
func waitReopen(t *testing.T, g *Guard, n uint64) {
	t.Helper()
	for dl := time.Now().Add(10 * time.Second); g.Reopens() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(dl) {
			t.Fatal("the guard did not reopen the store")
		}
	}
}

// openGuardInternal opens a guarded store in a temporary directory,
// closed when the test ends.
func openGuardInternal(t *testing.T) *Guard {
	t.Helper()
	g, err := OpenGuarded(Options{Dir: t.TempDir()}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// TestReopenKeepsLiveReservations: a reopen inside the running process
// must not turn the reservations of requests still at the upstream in
// doubt (which a forced admin lookup could then release while the upstream
// is charging): they stay in flight and their owners can commit them.
func TestReopenKeepsLiveReservations(t *testing.T) {
	t.Parallel()
	g := openGuardInternal(t)
	ctx := context.Background()
	const key = "pay/-/k1"
	if rec, err := g.Reserve(ctx, key, store.Reservation{Token: "t1", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v; want nil, nil", rec, err)
	}
	g.fail(errors.New("simulated fault"))
	waitReopen(t, g, 1)

	rec, err := g.Get(ctx, key)
	if err != nil || rec == nil {
		t.Fatalf("Get after reopen = %v, %v", rec, err)
	}
	if rec.State != store.StateInFlight {
		t.Errorf("state after reopen = %s, want %s (its request is still running)", rec.State, store.StateInFlight)
	}
	if err := g.ClaimLookup(ctx, key, "lk", time.Minute, true); !errors.Is(err, store.ErrNotInDoubt) {
		t.Errorf("forced ClaimLookup of a live reservation = %v, want ErrNotInDoubt", err)
	}
	if err := g.Commit(ctx, key, "t1", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Errorf("Commit by the owner after reopen = %v, want nil", err)
	}
}

// TestCorruptRecordIsNotAStoreFault: one undecodable record is that key's
// problem: the reconciler's pass over it, and a Get of it, must not mark
// the whole store broken (every protected request a 503).
func TestCorruptRecordIsNotAStoreFault(t *testing.T) {
	t.Parallel()
	g := openGuardInternal(t)
	ctx := context.Background()
	k := []byte("pay/-/bad")
	err := g.cur.Store.update(func(txn *wtxn) error {
		if err := txn.SetEntry(bdg.NewEntry(k, []byte{recordVersion, 0xff}).WithMeta(metaInDoubt)); err != nil {
			return err
		}
		return txn.SetEntry(bdg.NewEntry(indexKey(time.Now().Add(-time.Second).UnixMilli(), k), nil).WithMeta(metaIndex))
	})
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := g.DueLookups(ctx, 10); err != nil || len(keys) != 0 {
		t.Errorf("DueLookups = %q, %v; want none, nil (the corrupt record is skipped)", keys, err)
	}
	if keys, err := g.Unscheduled(ctx, "pay/", 10); err != nil || len(keys) != 0 {
		t.Errorf("Unscheduled = %q, %v; want none, nil", keys, err)
	}
	if _, err := g.Get(ctx, string(k)); !errors.Is(err, errCorrupt) {
		t.Errorf("Get of the corrupt record = %v, want a corrupt-record error", err)
	}
	if err := g.Ping(ctx); err != nil {
		t.Errorf("Ping after touching one corrupt record = %v, want nil", err)
	}
	if _, err := g.Get(ctx, "pay/-/other"); err != nil {
		t.Errorf("Get of another key = %v, want nil", err)
	}
}

// TestReopenNotHeldBySlowOperation: an operation stuck in Badger (here a
// reservation waiting for a writer that does not finish its batch) must
// not hold up the reopen of a store that failed meanwhile, nor make the
// operations that follow queue behind it: the failed store is taken out at
// once and they fail fast. The failed store is closed only once the stuck
// operation has returned, so what it wrote is not lost to the reopen.
func TestReopenNotHeldBySlowOperation(t *testing.T) {
	t.Parallel()
	g := openGuardInternal(t)
	ctx := context.Background()
	old := g.cur
	old.w.wait = time.Minute // stuck for as long as the test holds it
	release := holdWriter(t, old.Store)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	reserved := make(chan error, 1)
	go func() {
		_, err := g.Reserve(ctx, "pay/-/slow", reservation1)
		reserved <- err
	}()
	waitQueued(t, old.Store, 1)
	g.fail(errors.New("simulated fault"))
	for dl := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		g.mu.RLock()
		out := g.cur != old
		g.mu.RUnlock()
		if out {
			break
		}
		if time.Now().After(dl) {
			t.Fatal("the reopen did not take the failed store out while an operation on it was stuck")
		}
	}
	if _, err := g.Get(ctx, "pay/-/other"); !errors.Is(err, errBroken) {
		t.Errorf("Get while the failed store is being reopened = %v, want ErrBroken at once", err)
	}
	select {
	case err := <-reserved:
		t.Fatalf("the stuck reservation returned (%v) before its writer was released", err)
	default:
	}
	release()
	released = true
	if err := <-reserved; err != nil {
		t.Fatalf("the stuck reservation, once its writer was released = %v, want nil", err)
	}
	waitReopen(t, g, 1)
	if rec, err := g.Get(ctx, "pay/-/slow"); err != nil || rec == nil || rec.State != store.StateInFlight {
		t.Errorf("the stuck reservation on the reopened store = %+v, %v; want it in flight", rec, err)
	}
}

// TestBrokenGuardDoesNothing: a Guard whose store is not open (failed, or
// never opened: below the floor at start) answers every method without
// touching a store: RunGC and Sizes do nothing, operations fail.
func TestBrokenGuardDoesNothing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		open func(t *testing.T) *Guard
	}{
		{"failed", func(t *testing.T) *Guard {
			g := openGuardInternal(t)
			g.fail(errors.New("simulated fault"))
			return g
		}},
		{"never opened", func(t *testing.T) *Guard {
			g, err := OpenGuarded(Options{Dir: t.TempDir()}, GuardOptions{MinFreeBytes: 1 << 30,
				FreeBytes: func(string) (uint64, error) { return 1 << 20, nil }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			return g
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.open(t)
			if n := g.RunGC(); n != 0 {
				t.Errorf("RunGC = %d, want 0", n)
			}
			if lsm, vlog := g.Sizes(); lsm != 0 || vlog != 0 {
				t.Errorf("Sizes = %d, %d; want 0, 0", lsm, vlog)
			}
			if _, err := g.Get(context.Background(), "k"); !errors.Is(err, errBroken) {
				t.Errorf("Get = %v, want ErrBroken", err)
			}
			if err := g.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		})
	}
}

// TestGuardCloseReleasesAStalledReservation: a reservation whose caller is
// answered errStalled while the Guard closes (its batch stuck) is
// released before the store closes, as one answered errStalled at any
// other time: its request was refused and never forwarded, and left behind
// the key would read in flight and then in doubt for its whole TTL after
// the restart.
func TestGuardCloseReleasesAStalledReservation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	g, err := OpenGuarded(Options{Dir: dir}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := g.cur.Store
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	commit := s.w.commit
	s.w.commit = func(txn *bdg.Txn) error {
		once.Do(func() { close(entered) })
		<-unblock
		return commit(txn)
	}
	s.w.wait = time.Second
	const key = "pay/-/stuck"
	reserved := make(chan error, 1)
	go func() {
		_, err := g.Reserve(context.Background(), key, reservation1)
		reserved <- err
	}()
	<-entered // the reservation's batch is being committed, and stuck
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	if err := <-reserved; !errors.Is(err, errStalled) {
		t.Fatalf("Reserve behind a stuck batch = %v, want %v", err, errStalled)
	}
	close(unblock)
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if rec, err := s2.Get(context.Background(), key); err != nil || rec != nil {
		t.Errorf("the stalled reservation after Close and a restart = %+v, %v; want no record", rec, err)
	}
}
