//go:build linux && (amd64 || arm64)

package prealloc

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyOnWriteName: btrfs and ZFS, by their statfs magic, are the
// file systems whose overwrites preallocation cannot reserve; ext4, xfs
// and tmpfs are not.
func TestCopyOnWriteName(t *testing.T) {
	for _, tc := range []struct {
		magic int64
		want  string
	}{
		{unix.BTRFS_SUPER_MAGIC, "btrfs"},
		{0x2fc12fc1, "zfs"},
		{unix.EXT4_SUPER_MAGIC, ""},
		{unix.XFS_SUPER_MAGIC, ""},
		{unix.TMPFS_MAGIC, ""},
		// statfs's f_type is signed on some architectures: btrfs's
		// magic, sign-extended, is still btrfs.
		{-0x6edc97c2, "btrfs"},
	} {
		if got := copyOnWriteName(tc.magic); got != tc.want {
			t.Errorf("copyOnWriteName(%#x) = %q, want %q", tc.magic, got, tc.want)
		}
	}
}

// TestCopyOnWriteMissingDir: a data directory not created yet is judged
// by the nearest parent that exists (here a tmpfs: not copy-on-write).
func TestCopyOnWriteMissingDir(t *testing.T) {
	dir := mountTmpfs(t, 1<<20)
	if got := CopyOnWrite(filepath.Join(dir, "not", "yet")); got != "" {
		t.Errorf("CopyOnWrite(a missing directory on tmpfs) = %q, want \"\"", got)
	}
}
