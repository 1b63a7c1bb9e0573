package badger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// BenchmarkSyncedReserve measures one reservation at a time with
// SyncWrites (each on disk before Reserve returns), then its commit, and
// reports the reservations' latency percentiles: the synced path's cost at
// light load.
func BenchmarkSyncedReserve(b *testing.B) {
	s, err := badger.Open(badger.Options{Dir: b.TempDir(), SyncWrites: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	resp := store.Response{Status: 201, Body: []byte(`{"chargeId":"ch_1","orderId":"ORD-1","amount":10}`), BodyStored: true}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := fmt.Sprintf("bench/-/%d", i)
		start := time.Now()
		if _, err := s.Reserve(ctx, k, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		if err := s.Commit(ctx, k, "t", resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
