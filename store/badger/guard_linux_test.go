//go:build linux

package badger_test

import (
	"bytes"
	"context"
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

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// The Guard's tests that need Linux: a tmpfs mounted for a full disk, and
// /proc/self/fd to count the descriptors open.

// TestGuardFullDisk fills a real, small file system (tmpfs) with Badger's
// own writes: the floor must stop new reservations before Badger writes
// into a full disk (a SIGBUS in its mmapped files, which kills the
// process), commits must still fit, and removing the file that took the
// space lets the store serve again. A restart on the full disk waits for
// space instead of failing.
func TestGuardFullDisk(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 40<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "data")
	s := openGuarded(t, dir, badger.GuardOptions{MinFreeBytes: 32 << 20})
	ctx := context.Background()
	body := make([]byte, 64<<10)
	var refused bool
	var reserved []string
	for i := 0; i < 5000 && !refused; i++ {
		k := fmt.Sprintf("k%d", i)
		_, err := s.Reserve(ctx, k, res)
		switch {
		case errors.Is(err, badger.ErrLowDisk):
			refused = true
		case err != nil:
			t.Fatalf("Reserve %d: %v", i, err)
		default:
			reserved = append(reserved, k)
		}
		// Commit every other one at once; the rest are "at the upstream".
		if err == nil && i%2 == 0 {
			if err := s.Commit(ctx, k, res.Token, store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
				t.Fatalf("Commit %d: %v", i, err)
			}
		}
		time.Sleep(time.Millisecond) // let statfs see the growth (checked once a second)
	}
	if !refused {
		t.Fatal("the floor never refused a reservation")
	}
	// The requests already forwarded settle.
	for i, k := range reserved {
		if i%2 == 1 {
			if err := s.Commit(ctx, k, res.Token, store.Response{Status: 201, Body: body[:1024], BodyStored: true}, time.Hour); err != nil {
				t.Errorf("Commit of forwarded %s below the floor: %v", k, err)
			}
		}
	}
	if err := s.Ping(ctx); !errors.Is(err, badger.ErrLowDisk) {
		t.Errorf("Ping below the floor = %v, want ErrLowDisk", err)
	}
	// A restart on the full disk waits instead of failing. (The floor
	// counts what was written since the last statfs pessimistically: take
	// what is really left above it.)
	s.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free > 16<<20 {
		if err := os.WriteFile(filler+"2", make([]byte, free-16<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s2, err := badger.OpenGuarded(badger.Options{Dir: dir, SyncWrites: true}, badger.GuardOptions{MinFreeBytes: 32 << 20})
	if err != nil {
		t.Fatalf("OpenGuarded on a full disk: %v, want a store that waits for space", err)
	}
	defer s2.Close()
	if _, err := s2.Reserve(ctx, "while-full", res); err == nil {
		t.Errorf("Reserve on the full disk after a restart succeeded")
	}
	os.Remove(filler)
	os.Remove(filler + "2")
	eventually(t, "the store serves once space is back", func() bool {
		_, err := s2.Reserve(ctx, "after", res)
		return err == nil
	})
	rec, err := s2.Get(ctx, reserved[0])
	if err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Errorf("a record committed before the disk filled: %+v, %v", rec, err)
	}
	if strings.Contains(fmt.Sprint(err), "panic") {
		t.Errorf("panic: %v", err)
	}
}

// TestGuardTooManyOpenFiles: with the process out of file descriptors
// Badger cannot open its next memtable or table file, and then panics in
// the next operation. The guarded store answers errors, and serves again
// once descriptors are available. (A CI run had it never serve again: a
// checkpoint's DB.Sync had panicked on the missing memtable with Badger's
// lock held, and the failed store's Close waited for ever; see
// TestCheckpointAfterAFailedRotation. On failure the test prints the
// store's log.)
func TestGuardTooManyOpenFiles(t *testing.T) {
	var logs lockedBuffer
	s, err := badger.OpenGuarded(badger.Options{Dir: t.TempDir(), SyncWrites: true, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, badger.GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the store's log:\n%s", logs.String())
		}
		s.Close()
	})
	ctx := context.Background()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(len(fds) + 4)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
			restored = true
		}
	}
	defer restore()
	failed := writeUntilFailing(ctx, s)
	restore()
	if failed == 0 {
		t.Fatal("Badger never failed out of file descriptors; the test proves nothing")
	}
	var last string
	eventually(t, "the store serves again", func() bool {
		_, err := s.Reserve(ctx, fmt.Sprintf("after-%d", time.Now().UnixNano()), res)
		if why := fmt.Sprintf("reserve: %v; open: %v", err, s.OpenFailed()); err != nil && why != last {
			t.Logf("%s %s", time.Now().Format("15:04:05.000"), why)
			last = why
		}
		return err == nil
	})
}

// lockedBuffer is a bytes.Buffer safe for the store's goroutines to log to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
