package postgres_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
		return newStore(t, srv, postgres.Options{})
	})
}

func TestKeyspaceConformance(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	storetest.RunKeyspaces(t, func(t *testing.T) storetest.KeyspaceStore {
		return newStore(t, srv, postgres.Options{})
	})
}

// TestKeyspaceRegistryIsNeverSwept: the registry's rows, in the key
// table, outlive a sweep of expired keys.
func TestKeyspaceRegistryIsNeverSwept(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "ks_keys", SweepInterval: -1})
	k := store.Keyspace{Name: "charges", Digest: "d1", Recipe: "json orderId; scope none; normalize none", Routes: "charges", UpdatedAt: time.Now()}
	if err := s.PutKeyspace(ctx(t), k); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Keyspaces(ctx(t)); err != nil || len(got) != 1 || got[0].Name != "charges" {
		t.Fatalf("after a sweep: Keyspaces = %+v, %v; want charges kept", got, err)
	}
}

// TestEpochMarkerGoesWithTheKeys pins where the marker lives: in the key
// table, so that a TRUNCATE of that table (or its replacement) takes the
// marker too and the replicas see the loss; and never swept as expired.
func TestEpochMarkerGoesWithTheKeys(t *testing.T) {
	t.Parallel()
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

// TestReserveChecksTheEpoch: with ExpectEpoch, a reservation on a table
// truncated since the watcher's last check is refused with
// store.ErrKeysLost in the same statement, and nothing is written;
// EpochSeen hears of it. So is a reservation in a batch.
func TestReserveChecksTheEpoch(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batched"}[batch], func(t *testing.T) {
			reserveChecksTheEpoch(t, srv, batch)
		})
	}
}

func reserveChecksTheEpoch(t *testing.T, srv *pgtest.Server, batch bool) {
	table := map[bool]string{false: "epoch_reserve", true: "epoch_reserve_batched"}[batch]
	var seen atomic.Int64
	s := newStore(t, srv, postgres.Options{Table: table, EpochSeen: func(m *store.Epoch, read bool) error {
		if read && m == nil {
			seen.Add(1)
		}
		return nil
	}})
	if batch {
		s.AlwaysBatch()
	}
	res := store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	if _, ok, err := s.SwapEpoch(ctx(t), "", store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	s.ExpectEpoch("e1")
	if rec, err := s.Reserve(ctx(t), "r/-/before", res); err != nil || rec != nil {
		t.Fatalf("Reserve with the marker in place = %+v, %v; want reserved", rec, err)
	}
	if rec, err := s.Reserve(ctx(t), "r/-/before", res); err != nil || rec != nil {
		t.Fatalf("Reserve again with the caller's token = %+v, %v; want reserved", rec, err)
	}
	srv.MustExec("TRUNCATE public." + table)
	_, err := s.Reserve(ctx(t), "r/-/after", res)
	if !errors.Is(err, store.ErrKeysLost) {
		t.Fatalf("Reserve after TRUNCATE: err = %v, want ErrKeysLost", err)
	}
	if n := strings.TrimSpace(srv.MustExec("SELECT count(*) FROM public." + table)); n != "0" {
		t.Errorf("rows after the refused reservation = %s, want 0", n)
	}
	if seen.Load() == 0 {
		t.Error("EpochSeen was not told of the missing marker")
	}
	s.ExpectEpoch("")
	if rec, err := s.Reserve(ctx(t), "r/-/unchecked", res); err != nil || rec != nil {
		t.Fatalf("Reserve without an expected epoch = %+v, %v; want reserved", rec, err)
	}
}
