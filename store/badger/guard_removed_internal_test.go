package badger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// copyDir copies the regular files of src into dst (beside what dst
// holds): what a crash would leave on disk (the writer synced, so the page
// cache is the disk).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	// Badger may compact while the files are copied (a new table, the
	// MANIFEST that names it, an old table removed): a copy taken across
	// such a change is no state the disk ever held. The files are copied
	// aside until src did not change meanwhile, as a crash would find it,
	// and that copy goes to dst.
	for range 50 {
		before := dirState(t, src)
		snap := t.TempDir()
		copyRegularFiles(t, src, snap)
		if dirState(t, src) == before {
			copyRegularFiles(t, snap, dst)
			return
		}
	}
	t.Fatalf("%s kept changing while it was copied", src)
}

// dirState names the regular files of dir with their sizes and times.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			if os.IsNotExist(err) {
				fmt.Fprintf(&b, "%s gone\n", e.Name())
				continue
			}
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return b.String()
}

// copyRegularFiles copies the regular files of src but LOCK into dst; a
// file removed between the listing and its copy is left out (dirState
// tells copyDir to copy again).
func copyRegularFiles(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReopenAfterDirectoryRemovedKeepsReservationsDurable: with its data
// directory removed, Badger cannot flush its memtable, so closing the
// failed store hangs and the guard reopens without it. The abandoned store
// must not finish its flush into the directory the reopened store
// created: it would delete that store's write-ahead log by name, and every
// reservation made since would be lost on the next crash (charged twice).
func TestReopenAfterDirectoryRemovedKeepsReservationsDurable(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	g, err := OpenGuarded(Options{Dir: dir, SyncWrites: true}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	old := g.cur.Store
	ctx := context.Background()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	body := make([]byte, 8<<10)
	failed := 0
	for i := 0; i < 20000 && failed < 20; i++ {
		k := fmt.Sprintf("k%d", i)
		_, err := g.Reserve(ctx, k, res)
		if err == nil {
			err = g.Commit(ctx, k, res.Token, store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour)
		}
		if err != nil {
			failed++
			g.Get(ctx, k)
			g.Release(ctx, k, res.Token)
		}
	}
	if failed == 0 {
		t.Fatal("Badger never failed with its directory removed; the test proves nothing")
	}
	waitReopen(t, g, 1)
	if rec, err := g.Reserve(ctx, "after", res); err != nil || rec != nil {
		t.Fatalf("Reserve after the reopen = %+v, %v", rec, err)
	}
	// Wait for the abandoned store's Close to end (Close again waits for
	// the first one).
	closed := make(chan struct{})
	go func() { old.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(60 * time.Second):
		t.Fatal("the failed store's Close never ended")
	}
	if rec, err := g.Reserve(ctx, "later", res); err != nil || rec != nil {
		t.Fatalf("Reserve after the failed store closed = %+v, %v", rec, err)
	}
	snap := filepath.Join(t.TempDir(), "snap")
	copyDir(t, dir, snap)
	s, err := Open(Options{Dir: snap})
	if err != nil {
		t.Fatalf("opening what a crash would leave: %v", err)
	}
	defer s.Close()
	for _, k := range []string{"after", "later"} {
		if rec, err := s.Get(ctx, k); err != nil || rec == nil {
			t.Errorf("reservation %q after a crash = %+v, %v; want it on disk (it was synced before its request was forwarded)", k, rec, err)
		}
	}
}
