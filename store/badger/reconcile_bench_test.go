package badger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// BenchmarkReconcileScan measures a reconciler pass (DueLookups, the
// index) and a discovery (Unscheduled, a scan skipping completed records by
// their UserMeta) over a store of completed records and a few in-doubt ones.
func BenchmarkReconcileScan(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			s, err := badger.Open(badger.Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			resp := store.Response{Status: 201, Body: []byte(`{"chargeId":"ch_x"}`), BodyStored: true}
			for i := range n {
				k := fmt.Sprintf("charges/-/ORD-%d", i)
				res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
				if _, err := s.Reserve(ctx, k, res); err != nil {
					b.Fatal(err)
				}
				if i%10_000 == 0 {
					s.MarkInDoubt(ctx, k, "t", time.Hour)
					s.ScheduleLookup(ctx, k, 0)
					continue
				}
				if err := s.Commit(ctx, k, "t", resp, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("DueLookups", func(b *testing.B) {
				for b.Loop() {
					keys, err := s.DueLookups(ctx, 100)
					if err != nil || len(keys) != n/10_000 {
						b.Fatalf("DueLookups = %d keys, %v; want %d", len(keys), err, n/10_000)
					}
				}
			})
			b.Run("Unscheduled", func(b *testing.B) {
				for b.Loop() {
					if keys, err := s.Unscheduled(ctx, "charges/", 100); err != nil || len(keys) != 0 {
						b.Fatalf("Unscheduled = %d keys, %v; want none", len(keys), err)
					}
				}
			})
		})
	}
}
