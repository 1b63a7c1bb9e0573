//go:build !linux || !(amd64 || arm64)

package prealloc

import (
	"errors"
	"log/slog"
	"sync"
)

var errUnsupported = errors.New("prealloc: seccomp user notification is only used on linux/amd64 and linux/arm64")

var warnOnce sync.Once

// Start reports that preallocation is not available on this platform; the
// process runs protected by the store's free-space floor alone. The first
// call logs a warning to log (nil: none).
func Start(log *slog.Logger, waitForSpace func(path string) bool) error {
	warnOnce.Do(func() {
		if log != nil {
			log.Warn("files are not preallocated: a disk that fills between two free-space checks can crash the store", "err", errUnsupported)
		}
	})
	return errUnsupported
}

// Active reports whether ftruncate calls are preallocated: never here.
func Active() bool { return false }

// Unprotected counts ftruncate calls let through without preallocation:
// none here.
func Unprotected() uint64 { return 0 }

// Waiting is the number of ftruncate calls waiting for disk space: none
// here.
func Waiting() int64 { return 0 }
