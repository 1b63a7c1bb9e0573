//go:build linux

package powerloss

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const page = 4096

// runMmapChild stores through a shared writable mapping of path in two
// steps, printing "step NAME" after each and waiting for a line on stdin.
// The stores run in a child because a page fault on a mapping of a FUSE
// file waits for the FUSE server, and in the server's own process the Go
// runtime's stop-the-world would wait for the faulting thread: a deadlock.
func runMmapChild(path string) int {
	fail := func(err error) int {
		fmt.Printf("error %v\n", err)
		return 3
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fail(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, 16*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	in := bufio.NewReader(os.Stdin)
	copy(m[0*page:], "synced 0")
	copy(m[3*page:], "synced 3")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return fail(err)
	}
	fmt.Println("step msync")
	in.ReadString('\n')
	copy(m[5*page:], "no msync")
	copy(m[6*page:], "MS_ASYNC")
	if err := unix.Msync(m[6*page:7*page], unix.MS_ASYNC); err != nil {
		return fail(err)
	}
	copy(m[7*page:], "sync_file_range")
	if err := unix.SyncFileRange(int(f.Fd()), 7*page, page,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER); err != nil {
		return fail(err)
	}
	// The mapping and the file stay open until the power cut.
	fmt.Println("step unsynced")
	in.ReadString('\n')
	return 0
}

// TestSharedMappingSurvivesOnlyWithMsync stores through a shared writable
// mapping of a file on the mount (as Badger does) and checks which stores
// a power cut keeps, and what each call became on the FUSE side.
func TestSharedMappingSurvivesOnlyWithMsync(t *testing.T) {
	dir := newDisk(t, map[string]string{"m": string(make([]byte, 16*page))})
	fsys := MountT(t, dir, Options{})
	before := fsys.Stats()
	c := startChild(t, "mmap", filepath.Join(fsys.Mountpoint(), "m"))

	c.waitStep(t, "msync")
	afterMsync := fsys.Stats()
	t.Logf("msync(MS_SYNC) arrived as %d WRITE (%d bytes), %d FSYNC with datasync, %d FSYNC without",
		afterMsync.Writes-before.Writes, afterMsync.WriteBytes-before.WriteBytes,
		afterMsync.Fdatasyncs-before.Fdatasyncs, afterMsync.Fsyncs-before.Fsyncs)
	if afterMsync.Writes == before.Writes {
		t.Errorf("msync(MS_SYNC) wrote nothing back through FUSE: stats %+v", afterMsync)
	}
	if afterMsync.Fdatasyncs == before.Fdatasyncs {
		t.Errorf("msync(MS_SYNC) sent no FSYNC with the datasync flag: stats %+v", afterMsync)
	}

	fmt.Fprintln(c.stdin)
	c.waitStep(t, "unsynced")
	afterRange := fsys.Stats()
	t.Logf("MS_ASYNC and sync_file_range arrived as %d WRITE, %d FSYNC",
		afterRange.Writes-afterMsync.Writes, afterRange.Fdatasyncs+afterRange.Fsyncs-afterMsync.Fdatasyncs-afterMsync.Fsyncs)
	if afterRange.Writes == afterMsync.Writes {
		t.Errorf("sync_file_range wrote nothing back through FUSE: stats %+v", afterRange)
	}
	if afterRange.Fdatasyncs+afterRange.Fsyncs != afterMsync.Fdatasyncs+afterMsync.Fsyncs {
		t.Errorf("MS_ASYNC or sync_file_range sent an FSYNC: stats %+v", afterRange)
	}

	powerOff(t, fsys)
	got, err := os.ReadFile(filepath.Join(dir, "m"))
	must(t, err)
	if len(got) != 16*page {
		t.Fatalf("size after the power cut: got %d, want %d", len(got), 16*page)
	}
	for _, c := range []struct {
		page int
		want string
	}{
		{0, "synced 0"}, {3, "synced 3"},
		{5, ""}, {6, ""}, {7, ""}, // never synced: zeros
	} {
		want := make([]byte, page)
		copy(want, c.want)
		if p := got[c.page*page : (c.page+1)*page]; !bytes.Equal(p, want) {
			t.Errorf("page %d after the power cut: got %q..., want %q...", c.page, p[:16], want[:16])
		}
	}
}
