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
	dir := t.TempDir()
	opts := Options{Dir: dir, SyncWrites: true, checkpointEvery: -1}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	// The next memtables' files cannot be created: a directory is in
	// each one's place.
	var blocked []string
	for fid := 2; fid < 10; fid++ {
		p := filepath.Join(dir, fmt.Sprintf("%05d.mem", fid))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		blocked = append(blocked, p)
	}
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
	// Fill the memtable (1 MiB) until Badger fails to rotate it.
	var failed error
	for i := before; i < 100000 && failed == nil; i++ {
		failed = recovered(func() error { return put1(i) })
	}
	if failed == nil {
		t.Fatal("Badger never failed to create its next memtable; the test proves nothing")
	}
	// The checkpoint may succeed (what Badger committed is in its files)
	// or fail; what matters is that it leaves the store closable.
	s.checkpoint()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		closed = true // the Close under way would never return either
		t.Fatal("Close after a checkpoint on a store whose memtable rotation failed: not within a minute (Badger's lock left taken)")
	}
	closed = true
	for _, p := range blocked {
		os.Remove(p)
	}
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("open once the memtable's file can be created: %v", err)
	}
	closed = false
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
	dir := t.TempDir()
	opts := Options{Dir: dir, SyncWrites: false, checkpointEvery: -1}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 256<<10) }
	key := func(i int) []byte { return fmt.Appendf(nil, "pay/-/k%02d", i) }
	write := func(k, v []byte) error {
		return s.update(func(txn *wtxn) error {
			rec := &record{State: store.StateCompleted, Token: "tok", Fingerprint: "fp",
				Response: &store.Response{Status: 201, Body: v, BodyStored: true}}
			return put(txn, k, rec, time.Now(), time.Hour)
		})
	}
	reopen := func() {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = Open(opts); err != nil {
			t.Fatal(err)
		}
	}
	// A value-log file that is mostly garbage, as in
	// TestValueLogGCCrashKeepsAnswers: a rewrite is due.
	const n, live = 70, 5
	for i := range n {
		if err := write(key(i), body(i)); err != nil {
			t.Fatal(err)
		}
	}
	reopen()
	for i := live; i < n; i++ {
		if err := s.update(func(txn *wtxn) error { return txn.Delete(key(i)) }); err != nil {
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
	// The next memtables' files cannot be created.
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	next := 0
	for _, m := range mems {
		var fid int
		if _, err := fmt.Sscanf(filepath.Base(m), "%05d.mem", &fid); err == nil {
			next = max(next, fid+1)
		}
	}
	var blocked []string
	for fid := next; fid < next+8; fid++ {
		p := filepath.Join(dir, fmt.Sprintf("%05d.mem", fid))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		blocked = append(blocked, p)
	}
	var failed error
	for i := 0; i < 100000 && failed == nil; i++ {
		failed = recovered(func() error { return write(fmt.Appendf(nil, "pay/-/f%06d", i), []byte("ok")) })
	}
	if failed == nil {
		t.Fatal("Badger never failed to create its next memtable; the test proves nothing")
	}
	done := make(chan error, 1)
	go func() {
		s.RunGC() // fails: nothing to assert but what follows
		done <- s.Close()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		closed = true // the Close under way would never return either
		t.Fatal("value-log GC and Close on a store whose memtable rotation failed: not within a minute (a lock left taken)")
	}
	closed = true
	for _, p := range blocked {
		os.Remove(p)
	}
	if s, err = Open(opts); err != nil {
		t.Fatalf("open once the memtable's file can be created: %v", err)
	}
	closed = false
	for i := range live {
		rec, err := s.Get(t.Context(), string(key(i)))
		if err != nil || rec == nil || rec.State != store.StateCompleted || !bytes.Equal(rec.Response.Body, body(i)) {
			t.Errorf("%s committed before the failure: %v, %v", key(i), rec != nil, err)
		}
	}
}
