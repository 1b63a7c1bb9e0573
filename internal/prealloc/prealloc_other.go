//go:build !linux || !(amd64 || arm64)

package prealloc

import (
	"errors"
	"log/slog"
)

var errUnsupported = errors.New("prealloc: seccomp user notification is only used on linux/amd64 and linux/arm64")

// Start reports that preallocation is not available on this platform; the
// process runs protected by the store's free-space floor alone. It logs
// nothing: the caller says what the error means.
func Start(log *slog.Logger, waitForSpace func(path string) bool) error {
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
