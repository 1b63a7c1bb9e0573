//go:build !unix

package badger

import (
	"errors"
	"runtime"
)

// errUnsupportedPlatform is returned by Open, OpenGuarded, CheckFiles
// and LockDir off Unix (Windows): the store's durability (the reservation
// log's syncs, the free-space floor, the directory's lock, the checks of
// its files) is written for Unix and tested on Linux only, and a store
// that opened without it could lose a reservation and so charge twice.
var errUnsupportedPlatform = errors.New("badger: the embedded store is not supported on " +
	runtime.GOOS + ": run idemproxy on Linux or macOS, or use the Redis or PostgreSQL store")

// supported refuses: see errUnsupportedPlatform.
func supported() error { return errUnsupportedPlatform }

// statfsFree is not measured here: the store never opens (supported).
func statfsFree(string) (uint64, error) { return 0, errUnsupportedPlatform }

// accessible is not checked here: the store never opens (supported).
func accessible(string, bool) error { return errUnsupportedPlatform }

// lockStoreDir is not taken here: the store never opens (supported).
func lockStoreDir(string) (func(), error) { return nil, errUnsupportedPlatform }
