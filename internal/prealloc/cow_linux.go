//go:build linux

package prealloc

import (
	"errors"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// zfsSuperMagic is ZFS's f_type in statfs(2) (OpenZFS's ZFS_SUPER_MAGIC;
// not in the kernel's headers, ZFS being out of tree).
const zfsSuperMagic = 0x2fc12fc1

// CopyOnWrite names the copy-on-write file system that holds path, or the
// nearest of its parents that exists ("btrfs", "zfs"), or returns "" for
// any other file system, or when none can be found. On those, fallocate
// does not reserve the space of later overwrites (a write goes to new
// blocks), so preallocation does not keep a full disk from failing a
// write through a mapping (SIGBUS).
func CopyOnWrite(path string) string {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(path, &st)
		if err == nil {
			return copyOnWriteName(int64(st.Type))
		}
		parent := filepath.Dir(path)
		if !errors.Is(err, fs.ErrNotExist) || parent == path {
			return ""
		}
		path = parent
	}
}

// copyOnWriteName names the copy-on-write file system of statfs f_type t,
// or returns "".
func copyOnWriteName(t int64) string {
	switch uint32(t) {
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case zfsSuperMagic:
		return "zfs"
	}
	return ""
}
