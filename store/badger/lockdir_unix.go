//go:build unix

package badger

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockStoreDir takes the lock Badger takes on an open store's directory
// (flock, exclusive, on the directory itself), failing at once when a
// process holds it: the store is open. unlock releases it.
func lockStoreDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", errStoreOpen, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
