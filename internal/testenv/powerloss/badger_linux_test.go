//go:build linux

package powerloss

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// badgerOptions opens a small Badger with every write synced; values of a
// KiB go to the value log, so both its mapped files (memtable log and value
// log) are written.
func badgerOptions(dir string) badger.Options {
	return badger.DefaultOptions(dir).
		WithSyncWrites(true).
		WithLogger(nil).
		WithMemTableSize(4 << 20).
		WithValueLogFileSize(4 << 20).
		WithValueThreshold(256).
		WithNumCompactors(2)
}

func badgerKey(i int) []byte   { return fmt.Appendf(nil, "key%06d", i) }
func badgerValue(i int) []byte { return bytes.Repeat(fmt.Appendf(nil, "%06d", i), 1024/6) }

// runBadgerChild writes keys in order, one synced transaction each,
// printing "synced N" once key N-1 is committed.
func runBadgerChild(dir string) int {
	db, err := badger.Open(badgerOptions(dir))
	if err != nil {
		fmt.Printf("error %v\n", err)
		return 3
	}
	deadline := time.Now().Add(childLimit)
	for i := 0; time.Now().Before(deadline); i++ {
		if err := db.Update(func(txn *badger.Txn) error { return txn.Set(badgerKey(i), badgerValue(i)) }); err != nil {
			fmt.Printf("error %v\n", err)
			return 3
		}
		fmt.Printf("synced %d\n", i+1)
	}
	return 3
}

// TestBadgerSyncedWritesSurviveAPowerCut runs Badger (SyncWrites, shared
// writable mappings) in a child on the mount, cuts the power under it,
// and reopens the store: every write Badger acknowledged is there.
func TestBadgerSyncedWritesSurviveAPowerCut(t *testing.T) {
	dir := newDisk(t, map[string]string{"db/.keep": ""})
	fsys := MountT(t, dir, Options{})
	c := startChild(t, "badger", filepath.Join(fsys.Mountpoint(), "db"))
	acked := c.waitSynced(t, 200)
	powerOff(t, fsys)
	select {
	case <-c.done:
		t.Logf("the child stopped: %v; output: %s", c.err, bytes.TrimSpace(c.out.Bytes()))
	case <-time.After(time.Minute):
		t.Fatalf("Badger's child still runs a minute after the power cut")
	}
	for len(c.synced) > 0 {
		acked = max(acked, <-c.synced)
	}

	// Badger reads its mapped files back in a child too: see runMmapChild.
	fsys = MountT(t, dir, Options{})
	t.Setenv("POWERLOSS_KEYS", fmt.Sprint(acked))
	check := startChild(t, "badgercheck", filepath.Join(fsys.Mountpoint(), "db"))
	select {
	case <-check.done:
		if check.err != nil {
			t.Errorf("after the power cut, of %d acknowledged keys: %v; %s", acked, check.err, check.out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("reading Badger back took more than a minute")
	}
	t.Logf("Badger acknowledged %d synced writes before the cut; all read back after it", acked)
	must(t, fsys.Unmount())
}

// runBadgerCheck opens Badger and reads keys 0 to POWERLOSS_KEYS-1,
// printing each missing or wrong one; it exits 1 if any is.
func runBadgerCheck(dir string) int {
	n, _ := strconv.Atoi(os.Getenv("POWERLOSS_KEYS"))
	db, err := badger.Open(badgerOptions(dir))
	if err != nil {
		fmt.Printf("reopen Badger: %v\n", err)
		return 3
	}
	bad := 0
	err = db.View(func(txn *badger.Txn) error {
		for i := range n {
			item, err := txn.Get(badgerKey(i))
			var v []byte
			if err == nil {
				v, err = item.ValueCopy(nil)
			}
			if err != nil || !bytes.Equal(v, badgerValue(i)) {
				bad++
				if bad <= 5 {
					fmt.Printf("key %s: value %.20q, %v\n", badgerKey(i), v, err)
				}
			}
		}
		return nil
	})
	if err == nil {
		err = db.Close()
	}
	if err != nil || bad > 0 {
		fmt.Printf("%d keys lost or wrong; %v\n", bad, err)
		return 1
	}
	return 0
}
