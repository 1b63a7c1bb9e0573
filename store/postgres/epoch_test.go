package postgres_test

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
	srv := pgtest.Start(t)
	storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
		return newStore(t, srv, postgres.Options{})
	})
}

// TestEpochMarkerGoesWithTheKeys pins where the marker lives: in the key
// table, so that a TRUNCATE of that table (or its replacement) takes the
// marker too and the replicas see the loss; and never swept as expired.
func TestEpochMarkerGoesWithTheKeys(t *testing.T) {
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "epoch_keys", SweepInterval: -1})
	e := store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}
	if _, ok, err := s.SwapEpoch(ctx(t), "", e); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	if _, err := s.Sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Epoch(ctx(t)); err != nil || got == nil || got.ID != "e1" {
		t.Fatalf("after a sweep: Epoch = %+v, %v; want e1 kept", got, err)
	}
	srv.MustExec("TRUNCATE public.epoch_keys")
	if got, err := s.Epoch(ctx(t)); err != nil || got != nil {
		t.Fatalf("after TRUNCATE: Epoch = %+v, %v; want none", got, err)
	}
}
