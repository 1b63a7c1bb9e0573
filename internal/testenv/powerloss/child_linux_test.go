//go:build linux

package powerloss

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// The test binary doubles as the child process a power cut kills: with
// POWERLOSS_CHILD set, TestMain runs that child instead of the tests.
func TestMain(m *testing.M) {
	// Under testrun's supervisor, no mount outlives the tests, even when
	// the test binary is killed; the children inherit the run's marks and
	// pass through.
	testrun.Isolate()
	switch mode := os.Getenv("POWERLOSS_CHILD"); mode {
	case "":
	case "badger":
		os.Exit(runBadgerChild(os.Getenv("POWERLOSS_PATH")))
	case "badgercheck":
		os.Exit(runBadgerCheck(os.Getenv("POWERLOSS_PATH")))
	case "mmap":
		os.Exit(runMmapChild(os.Getenv("POWERLOSS_PATH")))
	default:
		os.Exit(runChild(mode, os.Getenv("POWERLOSS_PATH")))
	}
	os.Exit(m.Run())
}

const (
	block      = 4096
	syncEvery  = 8               // blocks (or pages) between two syncs
	childLimit = 2 * time.Minute // a child stops by itself after this
)

// pattern is the content of block i.
func pattern(i int) []byte { return bytes.Repeat([]byte{byte(i%251 + 1)}, block) }

// runChild writes blocks to path in a loop, syncing every syncEvery blocks
// and printing "synced N" once N blocks are durable. It exits 3 at the
// first error; a power cut may also kill it with SIGBUS.
func runChild(mode, path string) int {
	deadline := time.Now().Add(childLimit)
	fail := func(err error) int {
		fmt.Printf("error %v\n", err)
		return 3
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fail(err)
	}
	switch mode {
	case "writer":
		for i := 0; time.Now().Before(deadline); i++ {
			if _, err := f.WriteAt(pattern(i), int64(i)*block); err != nil {
				return fail(err)
			}
			if (i+1)%syncEvery == 0 {
				if err := f.Sync(); err != nil {
					return fail(err)
				}
				fmt.Printf("synced %d\n", i+1)
			}
		}
	case "mapper":
		fi, err := f.Stat()
		if err != nil {
			return fail(err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fail(err)
		}
		pages := len(m) / block
		for i := 0; i < pages && time.Now().Before(deadline); i++ {
			copy(m[i*block:], pattern(i))
			if (i+1)%syncEvery == 0 {
				if err := unix.Msync(m, unix.MS_SYNC); err != nil {
					return fail(err)
				}
				fmt.Printf("synced %d\n", i+1)
			}
		}
		return fail(errors.New("ran out of pages before the power cut"))
	default:
		return fail(fmt.Errorf("unknown child mode %q", mode))
	}
	return fail(errors.New("no power cut within the time limit"))
}

// child is a running child process and the highest count it said was
// synced.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	synced chan int
	steps  chan string  // lines "step NAME" it printed, without "step "
	out    bytes.Buffer // what it printed besides "synced N", and its stderr
	stderr bytes.Buffer
	done   chan struct{} // closed when it has exited
	err    error         // how it exited, once done is closed
}

func startChild(t *testing.T, mode, path string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "POWERLOSS_CHILD="+mode, "POWERLOSS_PATH="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	stdin, err := cmd.StdinPipe()
	must(t, err)
	c := &child{cmd: cmd, stdin: stdin, synced: make(chan int, 1<<16), steps: make(chan string, 16), done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	must(t, cmd.Start())
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if n, ok := strings.CutPrefix(s.Text(), "synced "); ok {
				v, _ := strconv.Atoi(n)
				c.synced <- v
				continue
			}
			if step, ok := strings.CutPrefix(s.Text(), "step "); ok {
				c.steps <- step
				continue
			}
			fmt.Fprintln(&c.out, s.Text())
		}
	}()
	go func() {
		<-scanned
		c.err = cmd.Wait()
		c.out.Write(c.stderr.Bytes())
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
	})
	return c
}

// waitSynced waits until the child said at least n units are synced, and
// returns the highest count it said so far.
func (c *child) waitSynced(t *testing.T, n int) int {
	t.Helper()
	timeout := time.After(time.Minute)
	last := 0
	for last < n {
		select {
		case v := <-c.synced:
			last = v
		case <-c.done:
			t.Fatalf("the child exited before syncing %d (last %d): %v; output: %s", n, last, c.err, c.out.String())
		case <-timeout:
			t.Fatalf("the child synced %d of %d within a minute", last, n)
		}
	}
	return last
}

// mounted reports whether mnt is a mount point of this process's namespace.
func mounted(t *testing.T, mnt string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == mnt {
			return true
		}
	}
	return false
}

// waitStep waits until the child printed "step NAME".
func (c *child) waitStep(t *testing.T, name string) {
	t.Helper()
	select {
	case got := <-c.steps:
		if got != name {
			t.Fatalf("the child reached step %q, want %q; output: %s", got, name, c.out.String())
		}
	case <-c.done:
		t.Fatalf("the child exited before step %q: %v; output: %s", name, c.err, c.out.String())
	case <-time.After(time.Minute):
		t.Fatalf("the child did not reach step %q within a minute", name)
	}
}

// TestPowerCutStopsAChildAndKeepsWhatItSynced cuts the power under a child
// process writing (or storing to a shared mapping) in a loop: the child
// must fail or die, nothing hangs, and the remounted file holds exactly a
// synced prefix, at least as long as the child was told is durable.
func TestPowerCutStopsAChildAndKeepsWhatItSynced(t *testing.T) {
	const pages = 4096 // the mapper's file: 16 MiB, far more than it can fill before the cut
	tests := []struct {
		mode string
		size int // the file's size before the child starts
	}{
		{"writer", 0},
		{"mapper", pages * block},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			dir := newDisk(t, map[string]string{"f": ""})
			must(t, os.Truncate(filepath.Join(dir, "f"), int64(tt.size)))
			fsys := MountT(t, dir, Options{})
			c := startChild(t, tt.mode, filepath.Join(fsys.Mountpoint(), "f"))
			acked := c.waitSynced(t, 64)

			if !mounted(t, fsys.Mountpoint()) {
				t.Fatalf("%s is not in /proc/self/mountinfo while mounted", fsys.Mountpoint())
			}
			cut := time.Now()
			powerOff(t, fsys)
			if mounted(t, fsys.Mountpoint()) {
				t.Errorf("%s is still mounted after PowerOff", fsys.Mountpoint())
			}
			select {
			case <-c.done:
				var exit *exec.ExitError
				if !errors.As(c.err, &exit) {
					t.Fatalf("the child survived the power cut: exit %v; output: %s", c.err, c.out.String())
				}
				t.Logf("the child stopped %v after the cut: %v; output: %s", time.Since(cut).Round(time.Millisecond), c.err, strings.TrimSpace(c.out.String()))
			case <-time.After(time.Minute):
				t.Fatalf("the child still runs a minute after the power cut; output: %s", c.out.String())
			}
			for len(c.synced) > 0 {
				acked = max(acked, <-c.synced)
			}

			fsys = MountT(t, dir, Options{})
			got, err := os.ReadFile(filepath.Join(fsys.Mountpoint(), "f"))
			must(t, err)
			n := 0 // blocks holding their pattern
			for n*block < len(got) && bytes.Equal(got[n*block:(n+1)*block], pattern(n)) {
				n++
			}
			if n < acked {
				t.Errorf("the remounted file holds %d blocks, the child was told %d were synced", n, acked)
			}
			if n%syncEvery != 0 {
				t.Errorf("the remounted file holds %d blocks, not a multiple of %d: unsynced blocks survived", n, syncEvery)
			}
			rest := got[n*block:]
			if tt.mode == "writer" && len(rest) != 0 {
				t.Errorf("%d bytes past the synced blocks survived", len(rest))
			}
			if tt.mode == "mapper" && (len(got) != tt.size || bytes.ContainsFunc(rest, func(r rune) bool { return r != 0 })) {
				t.Errorf("past the %d synced pages: size %d (want %d), or unsynced stores survived", n, len(got), tt.size)
			}
			t.Logf("the child was told %d blocks were synced; %d survived", acked, n)
		})
	}
}

// TestConcurrentWritersKeepTheirOwnSyncedData runs goroutines writing and
// syncing their own files at once; each file keeps exactly its synced
// rounds.
func TestConcurrentWritersKeepTheirOwnSyncedData(t *testing.T) {
	const writers, rounds = 8, 40
	for _, harsh := range []bool{false, true} {
		t.Run(fmt.Sprintf("harsh=%v", harsh), func(t *testing.T) {
			dir := newDisk(t, nil)
			fsys := MountT(t, dir, Options{Harsh: harsh})
			mnt := fsys.Mountpoint()
			errs := make(chan error, writers)
			for w := range writers {
				go func() {
					errs <- func() error {
						f, err := os.OpenFile(filepath.Join(mnt, fmt.Sprintf("w%d", w)), os.O_RDWR|os.O_CREATE, 0o644)
						if err != nil {
							return err
						}
						defer f.Close()
						d, err := os.Open(mnt)
						if err != nil {
							return err
						}
						defer d.Close()
						for i := range rounds {
							if _, err := f.WriteAt(pattern(w*rounds+i), int64(i)*block); err != nil {
								return err
							}
							if i%2 == 1 { // every second round is synced
								if err := f.Sync(); err != nil {
									return err
								}
								if err := d.Sync(); err != nil {
									return err
								}
							}
						}
						_, err = f.WriteAt(pattern(0), rounds*block) // never synced
						return err
					}()
				}()
			}
			for range writers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			powerOff(t, fsys)
			for w := range writers {
				got := content(t, filepath.Join(dir, fmt.Sprintf("w%d", w)))
				var want bytes.Buffer
				for i := range rounds {
					want.Write(pattern(w*rounds + i))
				}
				if got != want.String() {
					t.Errorf("w%d after the power cut: %d bytes, want the %d synced rounds (%d bytes)", w, len(got), rounds, want.Len())
				}
			}
		})
	}
}
