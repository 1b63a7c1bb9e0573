package badger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// A compile-time guard: the guarded store is a store.Store and a
// store.ReconcileStore, and has the concrete store's other exported methods
// of its own (it does not embed the store, which is nil while broken).
var (
	_ store.Store          = (*badger.Guard)(nil)
	_ store.ReconcileStore = (*badger.Guard)(nil)
	_ interface {
		RunGC() int
		Sizes() (int64, int64)
		Close() error
	} = (*badger.Guard)(nil)
)

func openGuarded(t testing.TB, dir string, g badger.GuardOptions) *badger.Guard {
	t.Helper()
	s, err := badger.OpenGuarded(badger.Options{Dir: dir, SyncWrites: true}, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestGuardConformance: the guard is a store like any other.
func TestGuardConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store { return openGuarded(t, t.TempDir(), badger.GuardOptions{}) })
	storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
		return openGuarded(t, t.TempDir(), badger.GuardOptions{})
	})
	storetest.RunList(t, func(t *testing.T) storetest.ListStore { return openGuarded(t, t.TempDir(), badger.GuardOptions{}) })
}

// eventually waits for cond, failing the test if it does not hold within
// a minute: a bound on liveness (the store comes back at all), generous
// enough for a loaded -race run, not a latency target.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

var res = store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}

// TestGuardDirectoryRemoved: the data directory removed while running makes
// Badger fail to rotate its memtable, and then panic (nil memtable) in the
// next operation's goroutine. The guarded store answers errors instead,
// fails Ping, and reopens itself: it serves again without a restart.
func TestGuardDirectoryRemoved(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	s := openGuarded(t, dir, badger.GuardOptions{})
	ctx := context.Background()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	failed := writeUntilFailing(ctx, s)
	if failed == 0 {
		t.Fatal("Badger never failed with its directory removed; the test proves nothing")
	}
	if err := s.Ping(ctx); err == nil {
		t.Errorf("Ping of a failed store = nil, want an error (readyz 503)")
	}
	eventually(t, "the store is reopened", func() bool { return s.Ping(ctx) == nil })
	if rec, err := s.Reserve(ctx, "after", res); err != nil || rec != nil {
		t.Fatalf("Reserve after the reopen = %+v, %v", rec, err)
	}
	if s.Reopens() == 0 {
		t.Errorf("Reopens() = 0 after a reopen")
	}
}

// writeUntilFailing reserves and commits keys with 8 KiB answers (kept in
// the memtable: they fill it fast) until 20 operations failed or 20,000
// keys were written, and returns the number of failures. After each
// failure it reads and releases the key: that is where a bare Badger whose
// memtable could not be rotated panics.
func writeUntilFailing(ctx context.Context, s *badger.Guard) int {
	body := make([]byte, 8<<10)
	failed := 0
	for i := 0; i < 20000 && failed < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		_, err := s.Reserve(ctx, k, res)
		if err == nil {
			err = s.Commit(ctx, k, res.Token, store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour)
		}
		if err != nil {
			failed++
			s.Get(ctx, k)
			s.Release(ctx, k, res.Token)
		}
	}
	return failed
}

// TestGuardFloor: below the free-space floor new reservations are refused
// and Ping fails, while the commit of a request already forwarded goes
// through; when space is back the store serves again.
func TestGuardFloor(t *testing.T) {
	t.Parallel()
	var free atomic.Uint64
	free.Store(1 << 30)
	s := openGuarded(t, t.TempDir(), badger.GuardOptions{
		MinFreeBytes: 64 << 20,
		FreeBytes:    func(string) (uint64, error) { return free.Load(), nil },
	})
	ctx := context.Background()
	if _, err := s.Reserve(ctx, "forwarded", res); err != nil {
		t.Fatal(err)
	}
	free.Store(10 << 20)
	n := 0
	eventually(t, "a reservation is refused below the floor", func() bool {
		n++ // the last figure is used for up to a second: a key per try
		_, err := s.Reserve(ctx, fmt.Sprintf("new-%d", n), res)
		return errors.Is(err, badger.ErrLowDisk)
	})
	if rec, _ := s.Get(ctx, fmt.Sprintf("new-%d", n)); rec != nil {
		t.Errorf("a refused reservation left %+v", rec)
	}
	if err := s.Ping(ctx); !errors.Is(err, badger.ErrLowDisk) {
		t.Errorf("Ping below the floor = %v, want ErrLowDisk", err)
	}
	if err := s.Commit(ctx, "forwarded", res.Token, store.Response{Status: 201}, time.Hour); err != nil {
		t.Errorf("Commit below the floor = %v, want it to go through", err)
	}
	if s.LowDiskRefusals() == 0 {
		t.Errorf("LowDiskRefusals() = 0")
	}
	free.Store(1 << 30)
	eventually(t, "reservations are taken again", func() bool {
		_, err := s.Reserve(ctx, "new", res)
		return err == nil
	})
}
