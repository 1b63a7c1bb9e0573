//go:build !unix

package badger

import "errors"

// lockStoreDir is not implemented off Unix: the store is never checked
// there as not open, so quarantine refuses.
func lockStoreDir(dir string) (unlock func(), err error) {
	return nil, errors.New("badger: locking a store directory is not supported on this system")
}
