//go:build linux

package badger

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestOpenWithEmptyMemtableLog: a memtable log that could not be sized
// on a full disk is left empty. The store opens on the first try (Badger
// alone fails once, "Create a new file", and leaks that attempt), and its
// keys are there.
func TestOpenWithEmptyMemtableLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithCommittedKey(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "00099.mem"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open with an empty memtable log: %v", err)
	}
	defer s.Close()
	rec, err := s.Get(context.Background(), "pay/-/k1")
	if err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Errorf("Get after the reopen = %+v, %v; want the completed record", rec, err)
	}
}

// TestOpenWithEmptyValueLog: a value-log file whose size a power cut took
// (created, never synced) is left empty. The store opens on the first try
// (Badger alone fails once, "Create a new file"), and its keys are there.
func TestOpenWithEmptyValueLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithCommittedKey(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "000099.vlog"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open with an empty value-log file: %v", err)
	}
	defer s.Close()
	rec, err := s.Get(context.Background(), "pay/-/k1")
	if err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Errorf("Get after the reopen = %+v, %v; want the completed record", rec, err)
	}
}

// TestManifestRoom: the MANIFEST has room allocated past its end once the
// store is open, so that Badger's appends to it take no new blocks and
// cannot be torn by a full disk.
func TestManifestRoom(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "MANIFEST"), &st); err != nil {
		t.Fatal(err)
	}
	if got, want := st.Blocks*512-st.Size, int64(manifestRoom/2); got < want {
		t.Errorf("MANIFEST: %d bytes allocated past its end (size %d), want at least %d", got, st.Size, want)
	}
}

// TestOpenGuardedWithoutRoom: a disk above the floor but without room for
// the files the store allocates when it opens (a memtable log, a value-log
// file) is like a disk below it: OpenGuarded returns a store that is not
// ready, instead of an error that would end the process at start, and
// the store opens once there is room.
func TestOpenGuardedWithoutRoom(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test mounts a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	if err := Preallocate(nil); err != nil {
		t.Fatalf("Preallocate: %v (this kernel has seccomp user notification)", err)
	}
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 56<<20), 0o600); err != nil { // the store needs ~35 MiB
		t.Fatal(err)
	}
	g, err := OpenGuarded(Options{Dir: filepath.Join(mnt, "data")}, GuardOptions{MinFreeBytes: 1})
	if err != nil {
		t.Fatalf("OpenGuarded without room for the store's files: %v; want a store that opens later", err)
	}
	defer g.Close()
	ctx := context.Background()
	if err := g.Ping(ctx); err == nil {
		t.Fatal("Ping without room = nil, want an error (not ready)")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); g.Ping(ctx) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not open 10 s after space came back: %v", g.Ping(ctx))
		}
	}
}
