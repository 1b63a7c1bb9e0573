package badger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestWALNoSegmentAppliesNothing: when the reservation log needs a new
// segment and cannot make one (a full disk; here its name is taken), the
// batch fails, and must then have written nothing. Applied to Badger but
// answered as failed, a reservation would hold its key in flight and then
// in doubt for its whole TTL, though its request was never forwarded:
// every retry answered 409 instead of being served.
func TestWALNoSegmentAppliesNothing(t *testing.T) {
	defer func(size int64) { walSegmentSize = size }(walSegmentSize)
	walSegmentSize = 8 << 10
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := s.w.wal
	l.mu.Lock()
	blocker := filepath.Join(l.dir, segmentName(l.nextNum))
	l.mu.Unlock()
	if err := os.Mkdir(blocker, 0o700); err != nil { // the next segment cannot be created
		t.Fatal(err)
	}
	ctx := context.Background()
	res := func(tok string) store.Reservation {
		return store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	failed := ""
	for i := range 10000 {
		k := fmt.Sprintf("pay/-/k%d", i)
		if _, err := s.Reserve(ctx, k, res("tok")); err != nil {
			failed = k
			break
		}
	}
	if failed == "" {
		t.Fatal("no reservation failed though the log's segment filled; the test proves nothing")
	}
	if rec, err := s.Get(ctx, failed); err != nil || rec != nil {
		t.Errorf("Get(%s) after its reservation failed = %+v, %v; want no record", failed, rec, err)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Reserve(ctx, failed, res("retry")); err != nil || rec != nil {
		t.Errorf("Reserve(%s) retried once a segment can be made = %+v, %v; want a new reservation", failed, rec, err)
	}
}
