package storetest

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// EpochStore is what RunEpoch tests: a store with its epoch marker.
type EpochStore interface {
	store.Store
	store.EpochStore
}

// RunEpoch runs the conformance cases of the epoch marker. newStore must
// return a store without a marker each time it is called (a fresh key
// prefix, table or directory): every case starts from a store that never
// had one.
func RunEpoch(t *testing.T, newStore func(t *testing.T) EpochStore) {
	ctx := context.Background()
	epoch := func(st store.EpochState, gen uint64) store.Epoch {
		return store.Epoch{ID: rand.Text(), State: st, Gen: gen, CreatedAt: time.Now().Truncate(time.Millisecond),
			Previous: "prev-" + rand.Text()[:6], Note: "seen: marker missing; run_id ab12 → cd34"}
	}
	cases := []struct {
		name string
		run  func(t *testing.T, s EpochStore)
	}{
		{"a store that never had a marker has none", func(t *testing.T, s EpochStore) {
			if got, err := s.Epoch(ctx); err != nil || got != nil {
				t.Fatalf("Epoch = %+v, %v; want nil, nil", got, err)
			}
		}},
		{"a marker is created when absent and read back whole", func(t *testing.T, s EpochStore) {
			e := epoch(store.EpochNew, 1)
			cur, ok, err := s.SwapEpoch(ctx, "", e)
			if err != nil || !ok {
				t.Fatalf("SwapEpoch(\"\") = %v, %v; want swapped", ok, err)
			}
			wantEpoch(t, "returned", cur, e)
			got, err := s.Epoch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantEpoch(t, "read", got, e)
		}},
		{"creating when a marker exists changes nothing", func(t *testing.T, s EpochStore) {
			first := epoch(store.EpochEstablished, 3)
			if _, ok, err := s.SwapEpoch(ctx, "", first); err != nil || !ok {
				t.Fatalf("first SwapEpoch = %v, %v", ok, err)
			}
			cur, ok, err := s.SwapEpoch(ctx, "", epoch(store.EpochNew, 1))
			if err != nil || ok {
				t.Fatalf("second SwapEpoch(\"\") = %v, %v; want not swapped", ok, err)
			}
			wantEpoch(t, "returned", cur, first)
			got, _ := s.Epoch(ctx)
			wantEpoch(t, "read", got, first)
		}},
		{"a swap from the wrong marker changes nothing, from the right one replaces it", func(t *testing.T, s EpochStore) {
			first := epoch(store.EpochNew, 1)
			s.SwapEpoch(ctx, "", first)
			lost := epoch(store.EpochLost, 2)
			cur, ok, err := s.SwapEpoch(ctx, "not-"+first.ID, lost)
			if err != nil || ok {
				t.Fatalf("SwapEpoch(wrong) = %v, %v; want not swapped", ok, err)
			}
			wantEpoch(t, "after a wrong swap", cur, first)
			cur, ok, err = s.SwapEpoch(ctx, first.ID, lost)
			if err != nil || !ok {
				t.Fatalf("SwapEpoch(right) = %v, %v; want swapped", ok, err)
			}
			wantEpoch(t, "after the swap", cur, lost)
			got, _ := s.Epoch(ctx)
			wantEpoch(t, "read", got, lost)
			// The same ID in another state (a new marker established).
			same := lost
			same.State = store.EpochAccepted
			if _, ok, err := s.SwapEpoch(ctx, lost.ID, same); err != nil || !ok {
				t.Fatalf("SwapEpoch(same ID) = %v, %v; want swapped", ok, err)
			}
			got, _ = s.Epoch(ctx)
			wantEpoch(t, "read after a change of state", got, same)
		}},
		{"of concurrent creations exactly one wins and all see it", func(t *testing.T, s EpochStore) {
			const n = 8
			var wg sync.WaitGroup
			wins := make(chan store.Epoch, n)
			seen := make(chan string, n)
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e := epoch(store.EpochNew, 1)
					cur, ok, err := s.SwapEpoch(ctx, "", e)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						wins <- e
					}
					seen <- cur.ID
				}()
			}
			wg.Wait()
			close(wins)
			close(seen)
			var won []store.Epoch
			for e := range wins {
				won = append(won, e)
			}
			if len(won) != 1 {
				t.Fatalf("%d creations won, want 1", len(won))
			}
			for id := range seen {
				if id != won[0].ID {
					t.Errorf("a creator saw marker %s, want the winner's %s", id, won[0].ID)
				}
			}
		}},
		{"the marker is no key record: not listed, not read, and records do not touch it", func(t *testing.T, s EpochStore) {
			e := epoch(store.EpochNew, 1)
			s.SwapEpoch(ctx, "", e)
			key := store.Key("epoch-route", "", "k-"+rand.Text())
			if _, err := s.Reserve(ctx, key, store.Reservation{Token: "t", Fingerprint: "f", Lease: longLease, TTL: longTTL}); err != nil {
				t.Fatal(err)
			}
			if l, ok := s.(store.Lister); ok {
				recs, next, err := l.List(ctx, store.ListQuery{Limit: 1000})
				for err == nil && next != "" {
					var more []store.Listed
					more, next, err = l.List(ctx, store.ListQuery{Limit: 1000, Cursor: next})
					recs = append(recs, more...)
				}
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				for _, r := range recs {
					if r.Key != key {
						t.Errorf("List shows %q (state %s), want only the record %q", r.Key, r.State, key)
					}
				}
			}
			if err := s.Release(ctx, key, "t"); err != nil {
				t.Fatal(err)
			}
			got, err := s.Epoch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantEpoch(t, "after a record's life", got, e)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newStore(t))
		})
	}
}

// wantEpoch fails t unless got is want (CreatedAt to the millisecond).
func wantEpoch(t *testing.T, what string, got *store.Epoch, want store.Epoch) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: no marker, want %+v", what, want)
	}
	g := *got
	if !g.CreatedAt.Equal(want.CreatedAt) {
		t.Errorf("%s: CreatedAt %v, want %v", what, g.CreatedAt, want.CreatedAt)
	}
	g.CreatedAt = want.CreatedAt
	if g != want {
		t.Errorf("%s: marker %+v, want %+v", what, g, want)
	}
}
