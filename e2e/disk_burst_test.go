//go:build linux

package e2e

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var diskRepeats = flag.Int("disk.repeats", defaultDiskRepeats(),
	"times TestDiskFillsInOneBurst fills and frees the disk, per file system (4, or 20 with -tags long)")

// defaultDiskRepeats is 4 rounds on each file system in a plain go test,
// 20 in the long run (-tags long).
func defaultDiskRepeats() int {
	if long {
		return 20
	}
	return 4
}

// TestDiskFillsInOneBurst: the data directory's file system fills in one
// burst while charges are served, again and again, on a tmpfs and on ext4
// (a loop device). Every time: the process stays up (Badger writes through
// mmapped files, and before preallocation (internal/prealloc) the first
// write to a page the full disk could not back was a SIGBUS that killed
// it), the store answers 503 store-unavailable and /readyz 503, and once
// the space is freed it serves again without a restart: every charge
// answered 201 is replayed with its body (checked every round for the
// charges made with room on disk, and at the end for all), every charge
// answered 503 is charged once when retried. The replays also caught
// Badger forgetting keys: a compaction that could not create a table on
// the full disk committed without it (see waitForSpace in store/badger).
//
// The bursts are many and fast on purpose: some fill the disk while a
// memtable page is being written (the SIGBUS), others while a memtable
// log, a table or a compaction is being created. The long run (-tags
// long) fills each file system 20 times, about a minute and a half; a
// plain go test 4 times, in a fifth of that; -disk.repeats changes the
// count.
//
// min_free_bytes is 1 byte: the floor is checked at most once a second,
// and the default floor (64 MiB, more than these file systems have free
// once Badger's files are there) would keep the store refusing from the
// start. With a floor of one byte the burst meets Badger itself: the
// charges sent right after the disk filled are written to the store
// until the next statfs sees the disk full.
//
// The two file systems are filled at the same time, each in its own
// subtest started from its own goroutine rather than with t.Parallel: a
// parallel subtest of a parallel test waits for a free slot again, behind
// every other parallel test of the package, and this minute-long test
// then ran last, alone.
func TestDiskFillsInOneBurst(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for _, fs := range []struct {
		name  string
		mount func(t *testing.T) string
	}{
		{"tmpfs", func(t *testing.T) string { return mountTmpfs(t, 96<<20) }},
		{"ext4", func(t *testing.T) string { return mountExt4(t, 96<<20) }},
	} {
		wg.Go(func() {
			t.Run(fs.name, func(t *testing.T) {
				fillAndFree(t, fs.mount(t), *diskRepeats)
			})
		})
	}
	wg.Wait()
}

// mountTmpfs mounts a tmpfs of size bytes (tests run as root).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// mountExt4 makes an ext4 file system of size bytes in an image file and
// mounts it on a loop device (tests run as root, with loop devices: CI and
// the development containers have them). No blocks are reserved for root,
// so that the disk is full for the proxy (root) when statfs says so.
func mountExt4(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "ext4.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount an ext4 image on a loop device (root, /dev/loop*): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-d", mnt).Run() })
	return mnt
}

// fill writes path until the file system is full, in one burst. It
// appends: called again, it takes what was freed since (ext4 gives back
// blocks it had reserved for delayed allocation once they are written
// back, and Badger removes files), so that the disk is full again.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = 0xa5
	}
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	for chunk := 64 << 10; chunk >= 512 && errors.Is(err, syscall.ENOSPC); chunk /= 2 {
		for err == nil || errors.Is(err, syscall.ENOSPC) {
			if _, err = f.Write(buf[:chunk]); err != nil {
				break
			}
		}
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the disk: %v, want ENOSPC", err)
	}
	// ext4 finds out at writeback that a delayed allocation does not
	// fit: sync, so that the disk is full now.
	f.Sync()
}

func fillAndFree(t *testing.T, mnt string, repeats int) {
	up := startStub(t)
	cfg := writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: 1", chargesRoute)
	p := startProxy(t, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the proxy's log, but for the access log:\n%s", tail(withoutAccessLog(p.log.String()), 60))
		}
	})
	alive := func(when string) {
		t.Helper()
		select {
		case <-p.exited:
			t.Fatalf("%s: idemproxy exited: %v\n%s", when, p.exitErr, crash(p.log.String()))
		default:
		}
	}
	filler := filepath.Join(mnt, "filler")
	committed := map[string]string{} // order: the body answered 201
	var refused []string             // orders answered 503
	var steady []string              // orders charged with room on disk, replayed every round
	seq := 0
	newOrder := func() string { seq++; return fmt.Sprintf("ORD-%d", seq) }

	for round := range repeats {
		// A few charges on a disk with room.
		for range 3 {
			o := newOrder()
			r := charge(p, o)
			if r.status != 201 {
				t.Fatalf("round %d: charge %s with room on disk = %d %s, want 201", round, o, r.status, r.body)
			}
			committed[o] = r.body
			steady = append(steady, o)
		}

		// The burst: the disk fills while charges keep coming, until the
		// store refuses them.
		var mu sync.Mutex
		var unexpected []string
		send := func() result {
			mu.Lock()
			o := newOrder()
			mu.Unlock()
			r := charge(p, o)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.status == 201:
				committed[o] = r.body
			case r.status == 503 && problemType(r) == "store-unavailable":
				refused = append(refused, o)
			default:
				unexpected = append(unexpected, fmt.Sprintf("%s: %d %v %s", o, r.status, r.err, r.body))
			}
			return r
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						send()
					}
				}
			}()
		}
		fill(t, filler)
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if send().status == 503 && do("GET", p.adminURL("/readyz"), "").status == 503 {
				break
			}
			fill(t, filler)
		}
		close(stop)
		wg.Wait()
		alive(fmt.Sprintf("round %d, disk full", round))
		// The disk stays full: /readyz and a charge say so. What was
		// freed since the burst is taken again first: with a floor of
		// one byte, a block given back is room, and the store rightly
		// serves while it lasts (a CI run met /readyz 200 here).
		var readyz, charged result
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			fill(t, filler)
			readyz = do("GET", p.adminURL("/readyz"), "")
			charged = send()
			if readyz.status == 503 && charged.status == 503 && problemType(charged) == "store-unavailable" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: on a full disk /readyz = %d %s and a charge = %d %s, want 503 and 503 store-unavailable",
					round, readyz.status, readyz.body, charged.status, charged.body)
			}
		}
		for _, u := range unexpected {
			t.Errorf("round %d: charge during the burst: %s, want 201 or 503 store-unavailable", round, u)
		}

		// Space back: served again, without a restart.
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("round %d: ready once space is back", round), func() bool {
			return do("GET", p.adminURL("/readyz"), "").status == 200
		})
		alive(fmt.Sprintf("round %d, space back", round))
		for _, o := range steady {
			if r := replay(p, o); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.body != committed[o] {
				ls, _ := exec.Command("ls", "-la", filepath.Join(mnt, "data")).CombinedOutput()
				t.Fatalf("round %d: replay of %s = %d replayed=%q %s, want 201 replayed %s\n%s", round, o, r.status, r.header.Get("Idempotent-Replayed"), r.body, committed[o], ls)
			}
		}
	}

	// Every charge answered 201 is replayed, every charge refused is
	// served when retried, and none was charged twice.
	var wg sync.WaitGroup
	var mu sync.Mutex
	work := make(chan string)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				want, ok := committed[o]
				r := replay(p, o)
				var msg string
				switch {
				case ok && (r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.body != want):
					msg = fmt.Sprintf("replay of %s = %d replayed=%q %s, want 201 replayed %s", o, r.status, r.header.Get("Idempotent-Replayed"), r.body, want)
				case !ok && r.status != 201:
					msg = fmt.Sprintf("retry of %s, refused on the full disk, = %d %s, want 201", o, r.status, r.body)
				default:
					if n := chargeCount(t, up.URL, o); n != 1 {
						msg = fmt.Sprintf("%s charged %d times, want 1", o, n)
					}
				}
				if msg != "" {
					mu.Lock()
					t.Error(msg)
					mu.Unlock()
				}
			}
		}()
	}
	for o := range committed {
		work <- o
	}
	for _, o := range refused {
		work <- o
	}
	close(work)
	wg.Wait()
	alive("after the replays")
	t.Logf("%d rounds: %d charges answered 201, %d refused with 503", repeats, len(committed), len(refused))
}

// replay charges order again. A commit that failed on the full disk is
// written again once the store is back: until then the key is in flight
// (409), so a 409 is retried for a while.
func replay(p *proc, order string) result {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := charge(p, order)
		if r.status != 409 || time.Now().After(deadline) {
			return r
		}
	}
}

// crash returns the lines of a Go crash report that say what happened
// (the signal, the fault and the failing goroutine), or the log's end.
func crash(log string) string {
	i := strings.Index(log, "\nunexpected fault address")
	if i < 0 {
		i = strings.Index(log, "\nfatal error:")
	}
	if i < 0 {
		i = strings.Index(log, "\npanic:")
	}
	if i < 0 {
		i = max(0, len(log)-4000)
	}
	lines := strings.SplitN(log[i:], "\n", 40)
	return strings.Join(lines[:min(len(lines), 39)], "\n")
}

// withoutAccessLog returns log without its access-log lines.
func withoutAccessLog(log string) string {
	var b strings.Builder
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `"msg":"request"`) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
