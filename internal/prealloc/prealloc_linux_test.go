//go:build linux && (amd64 || arm64)

package prealloc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes for the test (tests run as root).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("this test mounts a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

func mustStart(t *testing.T) {
	t.Helper()
	if err := Start(slog.New(slog.DiscardHandler), func(path string) bool { return strings.HasSuffix(path, ".wait") }); err != nil {
		t.Fatalf("Start: %v (this kernel supports seccomp user notification)", err)
	}
	if !Active() {
		t.Fatal("Active() = false after Start succeeded")
	}
}

func allocated(t *testing.T, path string) (size, blocks int64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Size, st.Blocks * 512
}

// TestTruncatePreallocates: a file grown with ftruncate has its blocks,
// whether it grows from empty or from a size; shrinking works as before.
func TestTruncatePreallocates(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 64<<20)
	for _, tc := range []struct {
		name       string
		sizes      []int64
		wantBlocks int64
	}{
		{"new file", []int64{8 << 20}, 8 << 20},
		{"grown", []int64{1 << 20, 4 << 20}, 4 << 20},
		{"shrunk", []int64{4 << 20, 1 << 20}, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, s := range tc.sizes {
				if err := f.Truncate(s); err != nil {
					t.Fatalf("Truncate(%d): %v", s, err)
				}
			}
			size, blocks := allocated(t, path)
			if want := tc.sizes[len(tc.sizes)-1]; size != want || blocks != tc.wantBlocks {
				t.Errorf("size, allocated = %d, %d; want %d, %d", size, blocks, want, tc.wantBlocks)
			}
		})
	}
}

// TestTruncateFullDisk: growing a file past the free space fails with
// ENOSPC and leaves the file as it was, instead of a sparse file whose
// mapped pages cannot be written (SIGBUS).
func TestTruncateFullDisk(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 4<<20)
	path := filepath.Join(dir, "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 20); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Truncate past the free space = %v, want ENOSPC", err)
	}
	if size, _ := allocated(t, path); size != 1<<20 {
		t.Errorf("size after the failed Truncate = %d, want %d", size, 1<<20)
	}
	// Space back: the same call works.
	if err := f.Truncate(2 << 20); err != nil {
		t.Errorf("Truncate within the free space = %v", err)
	}
}

// TestTruncateConcurrent: many goroutines growing files at once (threads
// created after Start included) are all preallocated.
func TestTruncateConcurrent(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 128<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(dir, fmt.Sprint(i))
			f, err := os.Create(path)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			if err := f.Truncate(1 << 20); err != nil {
				errs <- err
				return
			}
			var st syscall.Stat_t
			if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Blocks*512 != 1<<20 {
				errs <- fmt.Errorf("%s: %d bytes allocated, err %v; want %d", path, st.Blocks*512, err, 1<<20)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestChildLetThrough: a child process inherits the filter; its ftruncate
// (on its own file descriptor, whose number means nothing here) is let
// through as it is, neither preallocated on one of ours nor refused.
func TestChildLetThrough(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 4<<20)
	// Ours: a file at a low descriptor number, as the child's will be.
	mine, err := os.Create(filepath.Join(dir, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	path := filepath.Join(dir, "child")
	// Larger than the disk: sparse in the child, as without the filter.
	if out, err := exec.Command("truncate", "-s", "64M", path).CombinedOutput(); err != nil {
		t.Fatalf("truncate in a child: %v: %s", err, out)
	}
	if size, blocks := allocated(t, path); size != 64<<20 || blocks != 0 {
		t.Errorf("the child's file: size, allocated = %d, %d; want %d, 0", size, blocks, 64<<20)
	}
	if _, blocks := allocated(t, mine.Name()); blocks != 0 {
		t.Errorf("one of our files was allocated %d bytes by a child's ftruncate", blocks)
	}
}

// TestTruncateWaitsForSpace: an ftruncate of a file that waitForSpace
// names waits, while the disk is full, instead of failing; once there is
// room it completes with the file allocated. Others meanwhile are
// answered (ENOSPC) without waiting behind it.
func TestTruncateWaitsForSpace(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 4<<20)
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "t.wait")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() { done <- f.Truncate(2 << 20) }()
	for deadline := time.Now().Add(10 * time.Second); Waiting() != 1; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("Truncate on a full disk returned %v, want it to wait", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("Waiting() = %d, want 1", Waiting())
		}
	}
	// Another file meanwhile: answered at once.
	g, err := os.Create(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Truncate(2 << 20); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Truncate of another file while one waits = %v, want ENOSPC", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Truncate once there is room = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Truncate still waits 10 s after the space came back")
	}
	if size, blocks := allocated(t, path); size != 2<<20 || blocks != 2<<20 {
		t.Errorf("size, allocated = %d, %d; want %d, %d", size, blocks, 2<<20, 2<<20)
	}
	if n := Waiting(); n != 0 {
		t.Errorf("Waiting() = %d after the call completed, want 0", n)
	}
}
