package badger

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestValueLogGCCrashKeepsAnswers: value-log garbage collection moves the
// live answers out of a value-log file and deletes that file. Badger runs
// unsynced under the reservation log, and those moves are Badger's own
// writes, in no segment of it: a power loss after the file's deletion
// reached the disk but before the moved answers did would leave the tree
// pointing into a file that is gone, every such key failing (503) for its
// whole TTL, its answer lost. The file must outlive the sync of the moves.
func TestValueLogGCCrashKeepsAnswers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := Options{Dir: dir, SyncWrites: true, checkpointEvery: -1}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	s = garbageLog(t, s, opts)
	if err := syncBadger(dir); err != nil {
		t.Fatal(err)
	}
	durable := filepath.Join(t.TempDir(), "durable")
	copyDir(t, dir, durable) // Badger's files as on disk before the GC

	// The power fails right after a rewrite returns: Badger's unsynced
	// writes (the moved answers) are lost, the files deleted stay deleted.
	var gone []string
	s.afterRewrite = func() {
		if gone != nil {
			return
		}
		gone = []string{}
		vlogs, _ := filepath.Glob(filepath.Join(durable, "*.vlog"))
		for _, v := range vlogs {
			if _, err := os.Stat(filepath.Join(dir, filepath.Base(v))); os.IsNotExist(err) {
				gone = append(gone, v)
			}
		}
	}
	if got := s.RunGC(); got == 0 {
		t.Fatal("RunGC rewrote nothing; the test proves nothing")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range gone {
		if err := os.Remove(v); err != nil {
			t.Fatal(err)
		}
	}
	crashed, err := Open(Options{Dir: durable, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatalf("open after the crash: %v", err)
	}
	defer crashed.Close()
	for i := range gcLive {
		rec, err := crashed.Get(context.Background(), string(gcKey(i)))
		if err != nil || rec == nil || rec.State != store.StateCompleted || !bytes.Equal(rec.Response.Body, gcBody(i)) {
			t.Errorf("Get(%s) after a crash during value-log GC = %v, %v; want its completed answer (value-log files deleted before the moves were synced: %v)",
				gcKey(i), rec != nil, err, gone)
		}
	}
}

// gcAnswers answers of 256 KiB are stored by garbageLog (gcKey(i),
// gcBody(i)), and the first gcLive of them kept.
const gcAnswers, gcLive = 70, 5

func gcKey(i int) []byte  { return fmt.Appendf(nil, "pay/-/k%02d", i) }
func gcBody(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 256<<10) }

// garbageLog makes the first value-log file of s, opened with opts, due
// for a rewrite, and returns the store reopened (s is closed). It stores
// gcAnswers answers (the first 16 MiB file fills) and deletes all but the
// first gcLive; each reopen flushes the memtable into a level-0 table (the
// answers, then their deletion, then enough tables that level 0 is
// compacted, which counts that garbage).
func garbageLog(t *testing.T, s *Store, opts Options) *Store {
	t.Helper()
	reopen := func() {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		var err error
		if s, err = Open(opts); err != nil {
			t.Fatal(err)
		}
	}
	for i := range gcAnswers {
		err := s.update(func(txn *wtxn) error {
			rec := &record{State: store.StateCompleted, Token: "tok", Fingerprint: "fp",
				Response: &store.Response{Status: 201, Body: gcBody(i), BodyStored: true}}
			return put(txn, gcKey(i), rec, time.Now(), time.Hour)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	reopen()
	for i := gcLive; i < gcAnswers; i++ {
		if err := s.update(func(txn *wtxn) error { return txn.Delete(gcKey(i)) }); err != nil {
			t.Fatal(err)
		}
	}
	reopen()
	for i := range 3 {
		if err := s.update(func(txn *wtxn) error { return txn.Set(fmt.Appendf(nil, "filler%d", i), []byte("x")) }); err != nil {
			t.Fatal(err)
		}
		reopen()
	}
	if err := s.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	return s
}
