package badger

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestOpenRefusesTablesWithoutManifest: a data directory whose MANIFEST is
// missing (a partial restore or copy) still holds its tables, but Badger
// would open it as a new store and delete them: every key forgotten, and
// every retry charged again. Open must refuse, saying why.
func TestOpenRefusesTablesWithoutManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithCommittedKey(t, dir) // Close flushes the memtable into a table
	ctx := context.Background()
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("no table after Close; the test proves nothing")
	}
	if err := os.Remove(filepath.Join(dir, "MANIFEST")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir})
	if err == nil {
		rec, gerr := s.Get(ctx, "pay/-/k1")
		s.Close()
		t.Fatalf("Open without a MANIFEST succeeded (Get = %+v, %v); want it refused", rec, gerr)
	}
	if !strings.Contains(err.Error(), "MANIFEST") {
		t.Errorf("Open error = %v; want it to name the missing MANIFEST", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.sst")); len(left) != len(tables) {
		t.Errorf("tables after the refused Open: %d, want %d (kept)", len(left), len(tables))
	}
}

// closedWithCommittedKey opens a store in dir, commits key pay/-/k1 with
// a 201 and closes the store again.
func closedWithCommittedKey(t *testing.T, dir string) {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if _, err := s.Reserve(ctx, "pay/-/k1", res); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "pay/-/k1", "tok", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
