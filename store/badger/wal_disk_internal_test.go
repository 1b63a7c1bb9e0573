//go:build linux

package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// fillDisk writes a file in dir until its file system is full, and
// returns the file's name.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	small := make([]byte, 512)
	for {
		if _, err := f.Write(small); err != nil {
			return name
		}
	}
}

// TestWALFullDisk: with the disk full, the reservation log cannot get a
// new segment (nor Badger a new file): writes fail with errors, the store
// is marked broken and answers errors (503 in the proxy), and nothing
// crashes; once space is back, the Guard reopens it (replaying the log) and
// it serves again, with the keys written before.
func TestWALFullDisk(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test mounts a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	if err := Preallocate(nil); err != nil {
		t.Fatalf("Preallocate: %v (this kernel has seccomp user notification)", err)
	}
	defer func(size int64) { walSegmentSize = size }(walSegmentSize)
	walSegmentSize = 256 << 10 // fills before Badger's first memtable

	// No free-space floor: the log's own behaviour on a full disk is under
	// test, not the Guard's floor, whose statfs may or may not have run
	// since the disk filled.
	g, err := OpenGuarded(Options{Dir: filepath.Join(mnt, "data"), SyncWrites: true, checkpointEvery: -1}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	res := store.Reservation{Token: "tok", Lease: time.Minute, TTL: time.Hour}
	body := bytes.Repeat([]byte("a"), 2<<10)
	for i := range 20 {
		k := fmt.Sprintf("pay/-/before%d", i)
		if _, err := g.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		if err := g.Commit(ctx, k, "tok", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Reserve(ctx, "pay/-/sync", res); err != nil { // after the commits: they are applied
		t.Fatal(err)
	}
	// No checkpointer: no spare segment is made ahead, so the next one
	// must be made on the full disk.
	g.mu.RLock()
	s := g.cur.Store
	g.mu.RUnlock()
	filler := fillDisk(t, mnt)
	if _, err := g.Reserve(ctx, "pay/-/first-on-full", res); err != nil {
		t.Fatalf("Reserve on a full disk, with room in the log's segment: %v", err)
	}
	err = s.checkpoint()
	if !isNoRoom(err) {
		t.Fatalf("checkpoint without room for a new segment = %v, want ENOSPC", err)
	}
	if _, err := g.Reserve(ctx, "pay/-/second-on-full", res); err != nil {
		t.Fatalf("Reserve after a checkpoint failed for want of room: %v; the log must go on in its segment", err)
	}

	var failed error
	for i := 0; i < 5000 && failed == nil; i++ {
		k := fmt.Sprintf("pay/-/full%d", i)
		if _, err := g.Reserve(ctx, k, res); err != nil {
			failed = err
			break
		}
		g.Commit(ctx, k, "tok", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour)
	}
	if failed == nil {
		t.Fatal("5000 reservations on a full disk succeeded, want an error once the log needs a segment")
	}
	t.Logf("on the full disk: %v", failed)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for g.Ping(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not serving 30 s after space came back: %v", g.Ping(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rec, err := g.Reserve(ctx, "pay/-/after", res); err != nil || rec != nil {
		t.Errorf("Reserve after space came back = %+v, %v; want a new reservation", rec, err)
	}
	for i := range 20 {
		k := fmt.Sprintf("pay/-/before%d", i)
		if rec, err := g.Get(ctx, k); err != nil || rec == nil || rec.State != store.StateCompleted {
			t.Errorf("Get(%s) after space came back = %+v, %v; want it completed", k, rec, err)
		}
	}
}
