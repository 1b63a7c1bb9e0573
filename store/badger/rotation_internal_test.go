package badger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestCheckpointAfterAFailedRotation: when Badger cannot create its next
// memtable's file (out of file descriptors, or of disk), it is left
// without a memtable, and DB.Sync, which takes Badger's lock and then
// reads that memtable, panics with the lock held. A checkpoint that synced
// through DB.Sync left the lock taken: the store's Close then waited on it
// for ever, and a Guard, which reopens a failed store only once its Close
// has ended (its files are not shared), never served again without a
// restart (a CI run of TestGuardTooManyOpenFiles met it). The checkpoint
// must fail, and Close end, and the store open again once the file can be
// created, with what was committed before.
func TestCheckpointAfterAFailedRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := Options{Dir: dir, SyncWrites: true, checkpointEvery: -1}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: a Close that hangs (the bug) must not hang the test too.
	defer func() { closeWithin(&guarded{Store: s}, 5*time.Second) }()
	put1 := func(i int) error {
		return s.update(func(txn *wtxn) error {
			rec := &record{State: store.StateCompleted, Token: "tok", Fingerprint: "fp",
				Response: &store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}}
			return put(txn, []byte(fmt.Sprintf("pay/-/k%05d", i)), rec, time.Now(), time.Hour)
		})
	}
	const before = 10
	for i := range before {
		if err := put1(i); err != nil {
			t.Fatalf("write %d before the memtable fills: %v", i, err)
		}
	}
	unblock := loseMemtableTo(t, s, dir)
	// The checkpoint may succeed (what Badger committed is in its files)
	// or fail; what matters is that it leaves the store closable.
	s.checkpoint()
	endsWithinAMinute(t, "Close after a checkpoint on a store whose memtable rotation failed", s.Close)
	unblock()
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("open once the memtable's file can be created: %v", err)
	}
	for i := range before {
		rec, err := s.Get(t.Context(), fmt.Sprintf("pay/-/k%05d", i))
		if err != nil || rec == nil || rec.State != store.StateCompleted {
			t.Errorf("k%05d committed before the failure: %+v, %v", i, rec, err)
		}
	}
}

// TestValueLogGCAfterAFailedRotation: value-log garbage collection on a
// Badger left without a memtable (see TestCheckpointAfterAFailedRotation)
// reads the missing memtable under Badger's lock (DB.MaxVersion, as a
// rewrite begins) and panics there, leaving that lock taken, and it ran
// under the writer's lock, which the recovered panic left taken too: every
// later write, and Close, waited for ever. Without the reservation log
// (sync_writes: false) nothing read the memtable first. The collection must
// fail (TestGCAfterFailedRotation: without ending the process), and Close
// end.
func TestValueLogGCAfterAFailedRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := Options{Dir: dir, SyncWrites: false, checkpointEvery: -1}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: a Close that hangs (the bug) must not hang the test too.
	defer func() { closeWithin(&guarded{Store: s}, 5*time.Second) }()
	// A value-log file that is mostly garbage: a rewrite is due.
	s = garbageLog(t, s, opts)
	unblock := loseMemtableTo(t, s, dir)
	endsWithinAMinute(t, "value-log GC and Close on a store whose memtable rotation failed", func() error {
		s.RunGC() // fails: nothing to assert but what follows
		return s.Close()
	})
	unblock()
	if s, err = Open(opts); err != nil {
		t.Fatalf("open once the memtable's file can be created: %v", err)
	}
	for i := range gcLive {
		rec, err := s.Get(t.Context(), string(gcKey(i)))
		if err != nil || rec == nil || rec.State != store.StateCompleted || !bytes.Equal(rec.Response.Body, gcBody(i)) {
			t.Errorf("%s committed before the failure: %v, %v", gcKey(i), rec != nil, err)
		}
	}
}

// loseMemtableTo leaves s, open in dir, without a memtable, as running out
// of file descriptors or of disk does: a directory takes the place of each
// of the next memtables' files, and s is written to until Badger fails to
// create one. unblock removes the directories.
func loseMemtableTo(t *testing.T, s *Store, dir string) (unblock func()) {
	t.Helper()
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	next := 0
	for _, m := range mems {
		var fid int
		if _, err := fmt.Sscanf(filepath.Base(m), "%05d.mem", &fid); err == nil {
			next = max(next, fid+1)
		}
	}
	var blocked []string
	unblock = func() {
		for _, p := range blocked {
			os.Remove(p)
		}
	}
	for fid := next; fid < next+8; fid++ {
		p := filepath.Join(dir, fmt.Sprintf("%05d.mem", fid))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		blocked = append(blocked, p)
	}
	// Records small enough to stay in the memtable (1 MiB).
	for i := range 100000 {
		err := recovered(func() error {
			return s.update(func(txn *wtxn) error { return txn.Set(fmt.Appendf(nil, "filler-%06d", i), make([]byte, 64)) })
		})
		if err != nil {
			return unblock
		}
	}
	t.Fatal("Badger never failed to create its next memtable; the test proves nothing")
	return nil
}

// endsWithinAMinute runs fn, failing the test when it has not returned
// within a minute: a lock left taken, which it would wait on for ever.
func endsWithinAMinute(t *testing.T, what string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute (a lock left taken)", what)
	}
}
