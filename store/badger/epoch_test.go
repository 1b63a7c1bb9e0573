package badger_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
	t.Parallel()
	storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore { return open(t, t.TempDir()) })
	t.Run("guarded", func(t *testing.T) {
		storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
			return openGuarded(t, t.TempDir(), badger.GuardOptions{})
		})
	})
}

func TestKeyspaceConformance(t *testing.T) {
	t.Parallel()
	storetest.RunKeyspaces(t, func(t *testing.T) storetest.KeyspaceStore { return open(t, t.TempDir()) })
	t.Run("guarded", func(t *testing.T) {
		storetest.RunKeyspaces(t, func(t *testing.T) storetest.KeyspaceStore {
			return openGuarded(t, t.TempDir(), badger.GuardOptions{})
		})
	})
}

// TestEpochSurvivesARestart: a normal restart keeps the marker (no false
// alarm); a directory of its own starts without one.
func TestEpochSurvivesARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	s, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	e := store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 4, CreatedAt: time.Now()}
	if _, ok, err := s.SwapEpoch(ctx, "", e); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openGuarded(t, dir, badger.GuardOptions{})
	got, err := s2.Epoch(ctx)
	if err != nil || got == nil || got.ID != "e1" || got.Gen != 4 {
		t.Fatalf("after a restart: Epoch = %+v, %v; want e1, gen 4", got, err)
	}
	if got, err := openGuarded(t, t.TempDir(), badger.GuardOptions{}).Epoch(ctx); err != nil || got != nil {
		t.Fatalf("a new directory: Epoch = %+v, %v; want none", got, err)
	}
}

// TestGuardSeesItsDirectoryReplaced: a data directory replaced by an
// empty one while the store is open is store.ErrKeysLost at the next
// reservation (with ExpectEpoch), and once the Guard has reopened the
// store in the new directory, its marker is gone.
func TestGuardSeesItsDirectoryReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	g := openGuarded(t, dir, badger.GuardOptions{})
	if _, ok, err := g.SwapEpoch(ctx, "", store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	g.ExpectEpoch("e1")
	res := store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	if _, err := g.Reserve(ctx, "r/-/a", res); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(ctx, "r/-/b", res); !errors.Is(err, store.ErrKeysLost) {
		t.Fatalf("Reserve after the directory was replaced: err = %v, want ErrKeysLost", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := g.Epoch(ctx)
		if err == nil {
			if m != nil {
				t.Fatalf("the marker in the new directory = %+v, want none", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Epoch still fails a minute after the directory was replaced: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := g.Reserve(ctx, "r/-/c", res); !errors.Is(err, store.ErrKeysLost) {
		t.Fatalf("Reserve on the reopened, empty store: err = %v, want ErrKeysLost", err)
	}
	g.ExpectEpoch("")
	if rec, err := g.Reserve(ctx, "r/-/a", res); err != nil || rec != nil {
		t.Fatalf("Reserve of a key of the old directory = %+v, %v; want it free (the keys are gone)", rec, err)
	}
}

// TestReservationSeesASwappedMarker: the marker a reservation found is
// not read again by the next one (epochChecked), but a swap since makes
// the next reservation read it: one for a marker no longer trusted is
// refused.
func TestReservationSeesASwappedMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := openGuarded(t, filepath.Join(t.TempDir(), "data"), badger.GuardOptions{})
	if _, ok, err := g.SwapEpoch(ctx, "", store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	g.ExpectEpoch("e1")
	res := store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	for _, k := range []string{"r/-/a", "r/-/b"} {
		if _, err := g.Reserve(ctx, k, res); err != nil {
			t.Fatalf("Reserve %s under the trusted marker: %v", k, err)
		}
	}
	if _, ok, err := g.SwapEpoch(ctx, "e1", store.Epoch{ID: "e2", State: store.EpochEstablished, Gen: 2, CreatedAt: time.Now()}); err != nil || !ok {
		t.Fatalf("SwapEpoch e1 to e2 = %v, %v", ok, err)
	}
	if _, err := g.Reserve(ctx, "r/-/c", res); !errors.Is(err, store.ErrKeysLost) {
		t.Fatalf("Reserve after the marker was swapped: err = %v, want ErrKeysLost", err)
	}
	g.ExpectEpoch("e2")
	if _, err := g.Reserve(ctx, "r/-/c", res); err != nil {
		t.Fatalf("Reserve under the new marker: %v", err)
	}
}
