package badger_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
	storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore { return open(t, t.TempDir()) })
	t.Run("guarded", func(t *testing.T) {
		storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
			return openGuarded(t, t.TempDir(), badger.GuardOptions{})
		})
	})
}

// TestEpochSurvivesARestart: a normal restart keeps the marker (no false
// alarm); a directory of its own starts without one.
func TestEpochSurvivesARestart(t *testing.T) {
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
