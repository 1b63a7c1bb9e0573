//go:build linux

package powerloss

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSharedMappingSurvivesOnlyWithMsync stores through a shared writable
// mapping of a file on the mount (as Badger does) and checks which stores
// a power cut keeps, and what each call became on the FUSE side.
func TestSharedMappingSurvivesOnlyWithMsync(t *testing.T) {
	const page = 4096
	dir := newDisk(t, map[string]string{"m": string(make([]byte, 16*page))})
	fsys := MountT(t, dir, Options{})
	f, err := os.OpenFile(filepath.Join(fsys.Mountpoint(), "m"), os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, 16*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	defer unix.Munmap(m)

	before := fsys.Stats()
	copy(m[0*page:], "synced 0")
	copy(m[3*page:], "synced 3")
	must(t, unix.Msync(m, unix.MS_SYNC))
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

	copy(m[5*page:], "no msync")
	copy(m[6*page:], "MS_ASYNC")
	must(t, unix.Msync(m[6*page:7*page], unix.MS_ASYNC))
	copy(m[7*page:], "sync_file_range")
	beforeRange := fsys.Stats()
	must(t, unix.SyncFileRange(int(f.Fd()), 7*page, page,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER))
	afterRange := fsys.Stats()
	t.Logf("sync_file_range arrived as %d WRITE, %d FSYNC",
		afterRange.Writes-beforeRange.Writes, afterRange.Fdatasyncs+afterRange.Fsyncs-beforeRange.Fdatasyncs-beforeRange.Fsyncs)
	if afterRange.Writes == beforeRange.Writes {
		t.Errorf("sync_file_range wrote nothing back through FUSE: stats %+v", afterRange)
	}
	if afterRange.Fdatasyncs+afterRange.Fsyncs != beforeRange.Fdatasyncs+beforeRange.Fsyncs {
		t.Errorf("sync_file_range sent an FSYNC: stats %+v", afterRange)
	}

	// The mapping stays open: closing the file would write its pages back.
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
