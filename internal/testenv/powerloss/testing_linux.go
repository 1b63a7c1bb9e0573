//go:build linux

package powerloss

import (
	"path/filepath"
	"testing"
)

// MountT mounts a power-loss file system on a new directory of the test's
// showing dir (see Mount), and fails the test if it cannot. At cleanup it
// cuts the power if the test has not (a forced abort and detach, so no
// mount outlives the test, even a failed one); dir then holds the durable
// state.
func MountT(tb testing.TB, dir string, opts Options) *FS {
	tb.Helper()
	f, err := Mount(dir, filepath.Join(tb.TempDir(), "mnt"), opts)
	if err != nil {
		tb.Fatalf("powerloss: %v", err)
	}
	tb.Cleanup(func() {
		if err := f.PowerOff(); err != nil {
			tb.Errorf("powerloss cleanup: %v", err)
		}
	})
	return f
}
