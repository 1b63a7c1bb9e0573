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

	"github.com/idemproxy/idemproxy/internal/powerloss"
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
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	fsys := powerloss.MountT(t, disk, powerloss.Options{Harsh: true})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reserveChildEnv+"="+filepath.Join(fsys.Mountpoint(), "db"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	said := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			said <- sc.Text()
		}
		close(said)
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	select {
	case l := <-said:
		if l != "reserved" {
			t.Fatalf("the child said %q, want reserved; stderr: %s", l, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the child did not reserve within a minute")
	}
	if err := fsys.PowerOff(); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	cmd.Process.Kill()
	<-exited

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
