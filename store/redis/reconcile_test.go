package redis

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// TestUnscheduledRepairsALostScheduleEntry: a record scheduled for a lookup
// whose entry in the sorted set was lost (a crash between the script and
// the set update) is put back by the discovery scan, and comes due.
func TestUnscheduledRepairsALostScheduleEntry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	key := "charges/-/LOST-1"
	if rec, err := s.Reserve(ctx, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v", rec, err)
	}
	if err := s.MarkInDoubt(ctx, key, "t", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.ScheduleLookup(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.client.ZRem(ctx, s.scheduleKey(), key).Err(); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueLookups(ctx, 10); len(due) != 0 {
		t.Fatalf("DueLookups = %q with the entry removed, want none", due)
	}
	if keys, err := s.Unscheduled(ctx, "charges/", 10); err != nil || len(keys) != 0 {
		t.Fatalf("Unscheduled = %q, %v; want none (the record is scheduled)", keys, err)
	}
	due, err := s.DueLookups(ctx, 10)
	if err != nil || len(due) != 1 || due[0] != key {
		t.Errorf("DueLookups after the discovery = %q, %v; want [%s]", due, err, key)
	}
}
