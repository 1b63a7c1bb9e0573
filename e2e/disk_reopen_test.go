//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOpenOnFullDiskLeaksNothing: a store that cannot open because the
// disk has no room for the files Badger allocates when it opens (above
// the free-space floor, below what a new memtable and value log take) is
// not opened again until space is freed. Badger leaks the key registry's
// file descriptor (and more) of every Open that fails; retried every
// second, a disk that stayed full for a day leaked 86,400 descriptors.
func TestOpenOnFullDiskLeaksNothing(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, 64<<20)
	up := startStub(t)
	cfg := writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: 1", chargesRoute)
	p := startProxy(t, cfg)
	if r := charge(p, "ORD-LEAK"); r.status != 201 {
		t.Fatalf("charge = %d %s, want 201", r.status, r.body)
	}
	p.signal(syscall.SIGTERM)
	p.wait()
	// Full, then 512 KiB freed: above the floor, too little to open.
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-512<<10); err != nil {
		t.Fatal(err)
	}
	p = startProxy(t, cfg)
	// Five of the Guard's retries (one a second), were it retrying.
	time.Sleep(5 * time.Second)
	if n := countFDs(t, p, "KEYREGISTRY"); n > 1 {
		t.Errorf("%d descriptors of the key registry open, want at most 1", n)
	}
	// Room again: the store opens and replays its charge.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready once space is back", func() bool {
		return do("GET", p.adminURL("/readyz"), "").status == 200
	})
	if r := charge(p, "ORD-LEAK"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay = %d replayed=%q %s, want 201 replayed", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
}

// countFDs counts p's open file descriptors whose target ends in name.
func countFDs(t *testing.T, p *proc, name string) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasSuffix(l, name) {
			n++
		}
	}
	return n
}

// TestNewStoreOnANearlyFullDisk: a new store on a disk with room for its
// first memtable but not for Badger's discard-stats file (1 MiB) waits for
// room like any other open that does not fit. Badger creates that file
// with y.Check: preallocated, its ENOSPC was a log.Fatalf, and the proxy
// exited at start (or at the reopen of a removed directory).
func TestNewStoreOnANearlyFullDisk(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, 64<<20)
	up := startStub(t)
	cfg := writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: 1", chargesRoute)
	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-(2<<20)-(512<<10)); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg)
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 503 {
		t.Errorf("/readyz without room to open = %d, want 503", r.status)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", tail(p.log.String(), 12))
		}
	})
	eventually(t, "ready once space is back", func() bool {
		return do("GET", p.adminURL("/readyz"), "").status == 200
	})
	if r := charge(p, "ORD-NEW"); r.status != 201 {
		t.Errorf("charge = %d %s, want 201", r.status, r.body)
	}
}
