package badger

import (
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
