package badger_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// filesSize sums the sizes of the files in dir whose names end in suffix.
func filesSize(t *testing.T, dir, suffix string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), suffix) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += info.Size()
	}
	return n
}

// TestSizesMeasureTheDataDirectory: the size gauges' figures are the
// .sst and .vlog files in the data directory, not Badger's metrics (off,
// so they read 0).
func TestSizesMeasureTheDataDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	s, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	// Answers above the value threshold (16 KiB) go to the value log.
	body := bytes.Repeat([]byte("x"), 20<<10)
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for i := range 200 {
		k := fmt.Sprintf("k%d", i)
		if _, err := s.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	s.Close() // flushes the memtable into an .sst file

	s = open(t, dir)
	lsm, vlog := s.Sizes()
	wantLSM, wantVlog := filesSize(t, dir, ".sst"), filesSize(t, dir, ".vlog")
	if wantLSM == 0 || wantVlog < int64(200*len(body)) {
		t.Fatalf("the directory holds %d bytes of .sst and %d of .vlog: the test wrote too little", wantLSM, wantVlog)
	}
	if lsm != wantLSM || vlog != wantVlog {
		t.Errorf("Sizes() = %d, %d; want %d, %d (the files in %s)", lsm, vlog, wantLSM, wantVlog, filepath.Base(dir))
	}
}
