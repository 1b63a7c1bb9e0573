//go:build linux

package badger

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/powerloss"
	"github.com/idemproxy/idemproxy/store"
)

// reserveChildEnv, when set, makes the test binary run reserveChild on that
// directory instead of the tests (a process that maps files of a FUSE
// mount must not be the one serving it).
const reserveChildEnv = "IDEMPROXY_BADGER_RESERVE_CHILD"

// cutReservations is how many reservations reserveChild makes.
const cutReservations = 100

func init() {
	if dir := os.Getenv(reserveChildEnv); dir != "" {
		os.Exit(reserveChild(dir))
	}
}

// reserveChild opens a new store in dir with SyncWrites (no checkpoint:
// Badger's own files are never synced), reserves cutReservations keys
// (each acknowledged, so synced to the log), says "reserved", and waits
// to be killed.
func reserveChild(dir string) int {
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1, GCInterval: 0})
	if err != nil {
		fmt.Println("error", err)
		return 3
	}
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for i := range cutReservations {
		if _, err := s.Reserve(context.Background(), fmt.Sprintf("pay/-/k%d", i), res); err != nil {
			fmt.Println("error", err)
			return 3
		}
	}
	fmt.Println("reserved")
	time.Sleep(2 * time.Minute) // killed after the power cut
	return 3
}

// TestAcknowledgedReservationsSurviveAPowerCut: a store created on a disk
// where a name is durable only once its own directory is fsynced (the
// power-loss file system's Harsh mode: POSIX, not ext4's journal) is cut
// off before its first checkpoint. Every reservation it acknowledged is
// there after the cut (in doubt), and the store opens at the first try.
// Before, the store's and the log's directories were never fsynced into
// their parents, so the cut took the whole log: the store came back empty
// and every retry was forwarded again; and a value-log file left at length
// zero made the first open fail.
func TestAcknowledgedReservationsSurviveAPowerCut(t *testing.T) {
	t.Parallel()
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	fsys := powerloss.MountT(t, disk, powerloss.Options{Harsh: true})
	child := startMountChild(t, reserveChildEnv, filepath.Join(fsys.Mountpoint(), "db"))
	child.expect(t, "reserved")
	if err := fsys.PowerOff(); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	child.kill()

	s, err := Open(Options{Dir: filepath.Join(disk, "db"), SyncWrites: true})
	if err != nil {
		t.Fatalf("the first open after the cut: %v", err)
	}
	defer s.Close()
	missing := 0
	for i := range cutReservations {
		rec, err := s.Get(context.Background(), fmt.Sprintf("pay/-/k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if rec == nil {
			missing++
		} else if rec.State != store.StateInDoubt {
			t.Errorf("pay/-/k%d after the cut: %s; want in doubt (its request may have been forwarded)", i, rec.State)
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged reservations are gone after the power cut: their retries would be forwarded again", missing, cutReservations)
	}
}

// mountChild is this test binary run as a child on a power-loss mount: a
// process that maps files of a FUSE mount must not be the one serving it.
type mountChild struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan struct{}
	stderr bytes.Buffer
}

// startMountChild starts the test binary with env set to dir (its init
// runs the child's part and exits), killed when the test ends.
func startMountChild(t *testing.T, env, dir string) *mountChild {
	t.Helper()
	c := &mountChild{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), env+"="+dir)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	return c
}

// expect waits up to a minute for the child to say want, its next line.
func (c *mountChild) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok || l != want {
			t.Fatalf("the child said %q (%v), want %q; stderr: %s", l, ok, want, c.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the child did not say %q within a minute", want)
	}
}

// kill kills the child and waits for it to end.
func (c *mountChild) kill() {
	c.cmd.Process.Kill()
	<-c.exited
}
