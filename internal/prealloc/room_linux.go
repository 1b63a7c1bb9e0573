//go:build linux

package prealloc

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// KeepRoom allocates blocks past the end of the file at path, without
// changing its size, when fewer than room/2 bytes are allocated there:
// up to room bytes can then be appended without allocating, so that an
// append on a full disk neither fails halfway (a torn record) nor at all.
// A file system without fallocate is left as it is (nil); a full disk is
// ENOSPC.
func KeepRoom(path string, room int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Blocks*512 >= st.Size+room/2 {
		return nil
	}
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, st.Size+room)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	return err
}
