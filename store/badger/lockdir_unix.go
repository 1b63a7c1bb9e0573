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
// process holds it (errInUse): the store is open. unlock releases it.
func lockStoreDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock the store's directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (a running idemproxy holds it: stop it first, or use its admin API)", errInUse)
		}
		return nil, fmt.Errorf("lock the store's directory: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
