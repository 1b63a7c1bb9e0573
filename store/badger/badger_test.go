package badger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func open(t testing.TB, dir string) *badger.Store {
	t.Helper()
	s, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the store conformance suite, shared with Redis.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) })
}

func TestListConformance(t *testing.T) {
	t.Parallel()
	storetest.RunList(t, func(t *testing.T) storetest.ListStore { return open(t, t.TempDir()) })
}

func TestReconcileConformance(t *testing.T) {
	t.Parallel()
	storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore { return open(t, t.TempDir()) })
}

// TestReopenTurnsInFlightInDoubt: a reservation left in flight by a
// process that stopped is in doubt when the store is opened again, at
// once, whatever its lease said, keeping its origin; completed records
// survive.
func TestReopenTurnsInFlightInDoubt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	s, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	const origin = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	res := store.Reservation{Token: "t1", Fingerprint: "fp", Lease: time.Hour, TTL: 2 * time.Hour, Origin: origin}
	for _, k := range []string{"in-flight", "done"} {
		if rec, err := s.Reserve(ctx, k, res); err != nil || rec != nil {
			t.Fatalf("reserve %s: %v %v", k, rec, err)
		}
	}
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	if err := s.Commit(ctx, "done", "t1", resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2 := open(t, dir)
	tests := []struct {
		key  string
		want store.State
	}{
		{"in-flight", store.StateInDoubt},
		{"done", store.StateCompleted},
	}
	for _, tt := range tests {
		rec, err := s2.Get(ctx, tt.key)
		if err != nil || rec == nil {
			t.Fatalf("get %s: %v %v", tt.key, rec, err)
		}
		if rec.State != tt.want || rec.Origin != origin {
			t.Errorf("%s: state %s, origin %q; want %s, %q", tt.key, rec.State, rec.Origin, tt.want, origin)
		}
		if rec.ExpiresAt.IsZero() || rec.ExpiresAt.Before(time.Now().Add(30*time.Minute)) {
			t.Errorf("%s: expires at %v, want its TTL kept", tt.key, rec.ExpiresAt)
		}
	}
	if err := s2.Commit(ctx, "in-flight", "t1", resp, time.Hour); err != nil {
		t.Errorf("the old owner can still commit its now-known answer: %v", err)
	}
}

// TestValueLogGC: garbage collection runs on a store whose large values
// were overwritten and expired, and the store stays usable.
func TestValueLogGC(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	ctx := context.Background()
	body := make([]byte, 64<<10) // above the value threshold: lives in the value log
	for i := range 400 {
		k := fmt.Sprintf("k%d", i%20)
		tok := fmt.Sprintf("t%d", i)
		if i >= 20 {
			if err := s.Release(ctx, k, fmt.Sprintf("t%d", i-20)); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
		if rec, err := s.Reserve(ctx, k, store.Reservation{Token: tok, Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
			t.Fatalf("reserve: %v %v", rec, err)
		}
		if err := s.Commit(ctx, k, tok, store.Response{Status: 200, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	s.RunGC() // must not fail or block; how much it reclaims is Badger's business
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k0")
	if err != nil || rec == nil || len(rec.Response.Body) != len(body) {
		t.Fatalf("after GC: %v %v", rec, err)
	}
}

func BenchmarkReserveCommit(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			s, err := badger.Open(badger.Options{Dir: b.TempDir(), SyncWrites: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			resp := store.Response{Status: 201, Body: []byte(`{"chargeId":"ch_1","orderId":"ORD-1","amount":10}`), BodyStored: true}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					k := fmt.Sprintf("bench/%p/%d", pb, i)
					if _, err := s.Reserve(ctx, k, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
						b.Fatal(err)
					}
					if err := s.Commit(ctx, k, "t", resp, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
