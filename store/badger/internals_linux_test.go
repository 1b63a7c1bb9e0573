//go:build linux

package badger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/internal/testenv/powerloss"
)

// Entries 4 and 11 of internals_test.go's list, on Linux (preallocation
// and the power-loss file system are Linux's).

// syncChildEnv, when set, makes the test binary run syncChild on that
// directory instead of the tests: Badger maps its files, and a process
// that maps files of a FUSE mount must not be the one serving it.
const syncChildEnv = "IDEMPROXY_BADGER_SYNC_CHILD"

// syncedKeys and unsyncedKeys are what syncChild writes before and after
// its syncBadger.
const syncedKeys, unsyncedKeys = 200, 200

func init() {
	if dir := os.Getenv(syncChildEnv); dir != "" {
		os.Exit(syncChild(dir))
	}
}

func syncKey(i int) []byte { return fmt.Appendf(nil, "key%04d", i) }

// syncValue is key i's value: every other one large (the value log).
func syncValue(i int) []byte {
	if i%2 == 0 {
		return bytes.Repeat(fmt.Appendf(nil, "%04d", i), valueThreshold)
	}
	return fmt.Appendf(nil, "%04d", i)
}

// syncChild opens the store in dir without the reservation log, commits
// syncedKeys keys through Badger, runs syncBadger, says "synced", commits
// unsyncedKeys more, says "written", and waits to be killed.
func syncChild(dir string) int {
	s, err := Open(Options{Dir: dir, checkpointEvery: -1, GCInterval: 0})
	if err != nil {
		fmt.Println("error", err)
		return 3
	}
	write := func(from, to int) error {
		for i := from; i < to; i++ {
			if err := s.db.Update(func(txn *bdg.Txn) error { return txn.Set(syncKey(i), syncValue(i)) }); err != nil {
				return err
			}
		}
		return nil
	}
	if err := write(0, syncedKeys); err != nil {
		fmt.Println("error", err)
		return 3
	}
	if err := syncBadger(dir); err != nil {
		fmt.Println("error", err)
		return 3
	}
	fmt.Println("synced")
	if err := write(syncedKeys, syncedKeys+unsyncedKeys); err != nil {
		fmt.Println("error", err)
		return 3
	}
	fmt.Println("written")
	time.Sleep(2 * time.Minute) // killed after the power cut
	return 3
}

// 11.
func TestBadgerSyncCoversEveryCommit(t *testing.T) {
	t.Parallel()
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(filepath.Join(disk, "db"), 0o700); err != nil {
		t.Fatal(err)
	}
	fsys := powerloss.MountT(t, disk, powerloss.Options{})
	child := startMountChild(t, syncChildEnv, filepath.Join(fsys.Mountpoint(), "db"))
	child.expect(t, "synced")
	child.expect(t, "written")
	if err := fsys.PowerOff(); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	child.kill() // waiting, it may not have touched the mount since
	// disk holds what was synced; Badger reads it here, off the mount.
	db := openRaw(t, storeOptions(t, filepath.Join(disk, "db")))
	var lost []string
	unsynced := 0
	for i := range syncedKeys + unsyncedKeys {
		v := value(t, db, syncKey(i))
		switch {
		case i < syncedKeys && !bytes.Equal(v, syncValue(i)):
			lost = append(lost, string(syncKey(i)))
		case i >= syncedKeys && v == nil:
			unsynced++
		}
	}
	if len(lost) > 0 {
		t.Errorf("after an fsync of every *.mem and *.vlog (syncBadger), a power cut lost %d keys (%s): another file holds them",
			len(lost), strings.Join(lost[:min(5, len(lost))], ", "))
	}
	if unsynced == 0 {
		t.Errorf("the %d keys committed after the sync all survived the power cut: the test cannot tell a sync from none (or Badger syncs itself now)", unsyncedKeys)
	}
	t.Logf("%d keys committed and synced, all kept; %d of %d committed after the sync lost", syncedKeys, unsynced, unsyncedKeys)
}

// allocated returns the bytes of path's blocks.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * 512
}

// 4.
func TestBadgerSizesItsMappedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := storeOptions(t, dir)
	if err := createDiscardStats(dir); err != nil {
		t.Fatal(err)
	}
	db := openRaw(t, opts)
	mems, vlogs := glob(t, dir, "*.mem"), glob(t, dir, "*.vlog")
	if len(mems) != 1 || len(vlogs) != 1 {
		t.Fatalf("a new Badger: memtable logs %v, value-log files %v; want one of each", mems, vlogs)
	}
	if got, want := size(t, mems[0]), 2*opts.MemTableSize; got != want {
		t.Errorf("memtable log: %d bytes, want 2 x MemTableSize = %d", got, want)
	}
	if got, want := size(t, vlogs[0]), 2*opts.ValueLogFileSize; got != want {
		t.Errorf("value-log file: %d bytes, want 2 x ValueLogFileSize = %d", got, want)
	}
	if got := size(t, filepath.Join(dir, "DISCARD")); got != discardStatsSize {
		t.Errorf("DISCARD: %d bytes, want the zeroed %d that createDiscardStats made", got, discardStatsSize)
	}
	set(t, db, []byte("big"), big)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if got := size(t, vlogs[0]); got <= 0 || got >= opts.ValueLogFileSize {
		t.Errorf("value-log file after Close: %d bytes, want it cut to what it holds", got)
	}

	// Sized by ftruncate, the one call internal/prealloc backs: under it,
	// every mapped file Badger makes has its blocks when it is made.
	if err := Preallocate(nil); err != nil {
		t.Fatalf("Preallocate: %v (this kernel has seccomp user notification)", err)
	}
	dir2 := t.TempDir()
	openRaw(t, storeOptions(t, dir2))
	for _, f := range append(glob(t, dir2, "*.mem"), glob(t, dir2, "*.vlog")...) {
		if a, sz := allocated(t, f), size(t, f); a < sz {
			t.Errorf("%s under internal/prealloc: %d of %d bytes allocated; want all (Badger sizes it by ftruncate)", filepath.Base(f), a, sz)
		}
	}
}
