//go:build unix

package badger

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
)

// supported reports nil: the store runs on Unix systems (built and
// tested on Linux; macOS syncs with F_FULLFSYNC, datasync_other.go).
func supported() error { return nil }

// statfsFree is the space available to unprivileged users on dir's file
// system; a directory not created yet (or removed) is measured on its
// nearest existing parent, where it will be created.
func statfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	for {
		err := syscall.Statfs(dir, &st)
		if err == nil {
			return st.Bavail * uint64(st.Bsize), nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, syscall.ENOENT) || parent == dir {
			return 0, err
		}
		dir = parent
	}
}

// accessible reports whether this process may read and write path (and
// search it, for a directory): access(2), which also answers for root.
func accessible(path string, dir bool) error {
	mode := uint32(0x4 | 0x2) // R_OK | W_OK
	if dir {
		mode |= 0x1 // X_OK
	}
	if err := syscall.Access(path, mode); err != nil {
		return fmt.Errorf("not accessible: %w", err)
	}
	return nil
}
