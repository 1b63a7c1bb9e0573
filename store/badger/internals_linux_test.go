//go:build linux

package badger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/internal/powerloss"
)

// Entry 11 of internals_test.go's list, on Linux (the power-loss file
// system is Linux's).

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
	if err := syncBadger(s.db, dir); err != nil {
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
		t.Errorf("after DB.Sync and an fsync of every *.mem and *.vlog (syncBadger), a power cut lost %d keys (%s): another file holds them",
			len(lost), strings.Join(lost[:min(5, len(lost))], ", "))
	}
	if unsynced == 0 {
		t.Errorf("the %d keys committed after the sync all survived the power cut: the test cannot tell a sync from none (or Badger syncs itself now)", unsyncedKeys)
	}
	t.Logf("%d keys committed and synced, all kept; %d of %d committed after the sync lost", syncedKeys, unsynced, unsyncedKeys)
}
