//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestStopOnFullDisk: a proxy told to stop while its disk is full exits.
// Badger flushes its memtable to a new table when it closes, and a table
// that does not fit waits for space (prealloc's waitForSpace, for
// compactions that would drop the error): on a disk that stays full the
// proxy used to hang in Close until it was killed.
func TestStopOnFullDisk(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, 64<<20)
	up := startStub(t)
	cfg := writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: 1", chargesRoute)
	p := startProxy(t, cfg)
	for i := range 5 {
		if r := charge(p, fmt.Sprintf("ORD-STOP-%d", i)); r.status != 201 {
			t.Fatalf("charge with room on disk = %d %s, want 201", r.status, r.body)
		}
	}
	fill(t, filepath.Join(mnt, "filler"))
	p.signal(syscall.SIGTERM)
	p.wait()
	if !strings.Contains(p.log.String(), "close abandoned") {
		t.Errorf("the log does not say the close was abandoned:\n%s", p.log)
	}

	// What the memtable held is in its log: every charge is replayed once
	// there is room again, none charged twice.
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	p = startProxy(t, cfg)
	for i := range 5 {
		o := fmt.Sprintf("ORD-STOP-%d", i)
		if r := replay(p, o); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("after the restart, %s = %d replayed=%q %s, want 201 replayed", o, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
		if n := chargeCount(t, up.URL, o); n != 1 {
			t.Errorf("%s charged %d times, want 1", o, n)
		}
	}
}
