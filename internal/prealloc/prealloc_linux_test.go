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

	"golang.org/x/sys/unix"
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
	if err := Start(slog.New(slog.DiscardHandler), testWaitFor); err != nil {
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

// slowGate, when set, holds the test callback of files named *.slow
// until it is closed; slowEntered is told each time one is held.
var (
	slowMu      sync.Mutex
	slowGate    chan struct{}
	slowEntered = make(chan string, 16)
)

// testWaitFor is the callback every test of this process starts with
// (Start keeps the first): files named *.wait wait for space, and a file
// named *.slow blocks the callback itself until slowGate is closed.
func testWaitFor(path string) bool {
	if strings.HasSuffix(path, ".slow") {
		slowMu.Lock()
		gate := slowGate
		slowMu.Unlock()
		if gate != nil {
			slowEntered <- path
			<-gate
		}
		return false
	}
	return strings.HasSuffix(path, ".wait")
}

// setHook installs a test hook for the duration of the test.
func setHook(t *testing.T, h func(stage string)) {
	t.Helper()
	testHook.Store(&h)
	t.Cleanup(func() { testHook.Store(nil) })
}

// TestTruncateNumberReused: another thread closes the descriptor an
// ftruncate names, and a file opened meanwhile takes its number, while the
// supervisor handles the call. Whichever file the call ends up growing, it
// is grown with its blocks, and no other file gets blocks it was not grown
// to: the call acts, once, on the file the number held at one instant
// inside the call. (Before, the supervisor allocated the file it found at
// the number, and the kernel then looked the number up again: blocks went
// to the closed file and the reopened one was grown sparse.)
func TestTruncateNumberReused(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 64<<20)
	const size = 8 << 20
	for _, tc := range []struct {
		name    string
		stage   string // when the number is reused
		reopen  bool   // another file takes the number (else it stays closed)
		wantErr error
		grown   string // the file grown: "a", "b" or "" for none
	}{
		{"reused before the supervisor looks", "received", true, nil, "b"},
		{"reused after the supervisor looked", "resolved", true, nil, "a"},
		{"closed before the supervisor looks", "received", false, syscall.EBADF, ""},
		{"closed after the supervisor looked", "resolved", false, nil, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]*os.File{}
			for _, n := range []string{"a", "b"} {
				f, err := os.Create(filepath.Join(dir, tc.stage+fmt.Sprint(tc.reopen)+n))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				files[n] = f
			}
			// The number the call names: a descriptor of a of our own,
			// so that closing it leaves the test's *os.File alone.
			num, err := syscall.Dup(int(files["a"].Fd()))
			if err != nil {
				t.Fatal(err)
			}
			closed := false // by the hook: the number may be another's since
			defer func() {
				if !closed {
					syscall.Close(num)
				}
			}()
			other := int(files["b"].Fd())
			var once sync.Once
			fired := make(chan struct{})
			setHook(t, func(stage string) {
				if stage != tc.stage {
					return
				}
				once.Do(func() {
					defer close(fired)
					if tc.reopen {
						// closed and reopened at the same number, at once
						if err := syscall.Dup3(other, num, syscall.O_CLOEXEC); err != nil {
							t.Errorf("dup3: %v", err)
						}
					} else {
						syscall.Close(num)
						closed = true
					}
				})
			})
			err = syscall.Ftruncate(num, size)
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatalf("the supervisor never reached stage %q", tc.stage)
			}
			if !errors.Is(err, tc.wantErr) && (err != nil || tc.wantErr != nil) {
				t.Errorf("ftruncate = %v, want %v", err, tc.wantErr)
			}
			for n, f := range files {
				gotSize, blocks := allocated(t, f.Name())
				wantSize := int64(0)
				if n == tc.grown {
					wantSize = size
				}
				switch {
				case blocks > gotSize:
					t.Errorf("%s: %d bytes allocated past its size %d: blocks went to a file the call did not grow", n, blocks, gotSize)
				case blocks < gotSize:
					t.Errorf("%s: grown to %d with %d bytes allocated: its pages are not backed (SIGBUS on a full disk)", n, gotSize, blocks)
				case gotSize != wantSize:
					t.Errorf("%s: size %d, want %d", n, gotSize, wantSize)
				}
			}
		})
	}
}

// TestTruncateNumberReusedRace races the reuse of a descriptor's number
// (another thread swapping two files at it) against ftruncate calls that
// grow it, without a hook: after every call, each file is either as it
// was or grown with all its blocks.
func TestTruncateNumberReusedRace(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 256<<20)
	a, err := os.Create(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Create(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	num, err := syscall.Dup(int(a.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(num)
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			src := a
			if i%2 == 1 {
				src = b
			}
			syscall.Dup3(int(src.Fd()), num, syscall.O_CLOEXEC)
		}
	}()
	defer func() { close(stop); <-swapped }()
	for i := range 300 {
		size := int64(i+1) * 64 << 10
		if err := syscall.Ftruncate(num, size); err != nil {
			t.Fatalf("ftruncate #%d: %v", i, err)
		}
		for _, f := range []*os.File{a, b} {
			if got, blocks := allocated(t, f.Name()); blocks < got {
				t.Fatalf("after call #%d, %s is %d bytes with %d allocated: grown without its blocks", i, f.Name(), got, blocks)
			} else if blocks > got {
				t.Fatalf("after call #%d, %s has %d bytes allocated past its size %d: blocks of a call that grew another file", i, f.Name(), blocks-got, got)
			}
		}
	}
}

// TestSlowCallbackDoesNotStall: while the waitForSpace callback of one
// call is slow (here: it blocks), other threads' ftruncate calls are
// answered: the callback does not run on the supervisor's thread.
func TestSlowCallbackDoesNotStall(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 4<<20)
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	slowMu.Lock()
	slowGate = gate
	slowMu.Unlock()
	release := sync.OnceFunc(func() {
		close(gate)
		slowMu.Lock()
		slowGate = nil
		slowMu.Unlock()
	})
	t.Cleanup(release)
	slow, err := os.Create(filepath.Join(dir, "t.slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slowDone := make(chan error, 1)
	go func() { slowDone <- slow.Truncate(2 << 20) }()
	select {
	case <-slowEntered:
	case err := <-slowDone:
		t.Fatalf("the slow file's Truncate returned %v before its callback ran", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the callback was not called within 30 s")
	}
	other, err := os.Create(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tc := range []struct {
		size    int64
		wantErr error
	}{{2 << 20, syscall.ENOSPC}, {256 << 10, nil}} {
		done := make(chan error, 1)
		go func() { done <- other.Truncate(tc.size) }()
		select {
		case err := <-done:
			if !errors.Is(err, tc.wantErr) && (err != nil || tc.wantErr != nil) {
				t.Errorf("Truncate(%d) of another file while a callback is slow = %v, want %v", tc.size, err, tc.wantErr)
			}
		case <-time.After(30 * time.Second):
			release()
			t.Fatalf("Truncate(%d) of another file stalled 30 s behind a slow callback", tc.size)
		}
	}
	release()
	select {
	case err := <-slowDone:
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("the slow file's Truncate = %v, want ENOSPC (its callback said not to wait)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the slow file's Truncate did not return 30 s after its callback did")
	}
}

// TestTruncateSemantics: the supervisor makes each call itself, on the
// file the descriptor held; what the caller gets is what ftruncate(2)
// gives without the filter, for descriptors and lengths it refuses too.
func TestTruncateSemantics(t *testing.T) {
	mustStart(t)
	dir := mountTmpfs(t, 16<<20)
	open := func(t *testing.T, flag int) int {
		t.Helper()
		path := filepath.Join(dir, fmt.Sprint(time.Now().UnixNano()))
		if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Open(path, flag|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
		return fd
	}
	for _, tc := range []struct {
		name     string
		fd       func(t *testing.T) int
		length   int64
		wantErr  error
		wantSize int64 // of a regular file, when the call succeeds
	}{
		{"grow", func(t *testing.T) int { return open(t, syscall.O_RDWR) }, 1 << 20, nil, 1 << 20},
		{"grow, opened write-only with O_APPEND", func(t *testing.T) int { return open(t, syscall.O_WRONLY|syscall.O_APPEND) }, 1 << 20, nil, 1 << 20},
		{"shrink", func(t *testing.T) int { return open(t, syscall.O_RDWR) }, 100, nil, 100},
		{"to zero", func(t *testing.T) int { return open(t, syscall.O_RDWR) }, 0, nil, 0},
		{"same size", func(t *testing.T) int { return open(t, syscall.O_RDWR) }, 4096, nil, 4096},
		{"negative length", func(t *testing.T) int { return open(t, syscall.O_RDWR) }, -1, syscall.EINVAL, 0},
		{"read-only descriptor", func(t *testing.T) int { return open(t, syscall.O_RDONLY) }, 1 << 20, syscall.EINVAL, 0},
		{"O_PATH descriptor", func(t *testing.T) int { return open(t, unix.O_PATH) }, 1 << 20, syscall.EBADF, 0},
		{"directory", func(t *testing.T) int {
			fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fd) })
			return fd
		}, 1 << 20, syscall.EINVAL, 0},
		{"pipe", func(t *testing.T) int {
			var p [2]int
			if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(p[0]); syscall.Close(p[1]) })
			return p[1]
		}, 1 << 20, syscall.EINVAL, 0},
		{"closed number", func(t *testing.T) int {
			fd := open(t, syscall.O_RDWR)
			n, err := syscall.Dup(fd)
			if err != nil {
				t.Fatal(err)
			}
			syscall.Close(n)
			return n
		}, 1 << 20, syscall.EBADF, 0},
		{"number past any table", func(t *testing.T) int { return 1<<31 - 1 }, 1 << 20, syscall.EBADF, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := tc.fd(t)
			err := syscall.Ftruncate(fd, tc.length)
			if !errors.Is(err, tc.wantErr) && (err != nil || tc.wantErr != nil) {
				t.Fatalf("ftruncate = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var st syscall.Stat_t
			if err := syscall.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != tc.wantSize || st.Blocks*512 < st.Size {
				t.Errorf("size, allocated = %d, %d; want %d, all of it", st.Size, st.Blocks*512, tc.wantSize)
			}
		})
	}
}
