//go:build unix

package app

import (
	"log/slog"
	"syscall"
)

// raiseOpenFiles raises the soft limit of open files to the hard limit:
// Badger keeps its tables and logs open, and each client and upstream
// connection is a descriptor, so a low soft limit turns load into "too
// many open files" inside Badger. (Go 1.19 and later do this at start too;
// this makes it explicit and logs the limit the process runs with.) It
// returns the limit the process runs with; ok is false when it is unknown.
func raiseOpenFiles(log *slog.Logger) (limit uint64, ok bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open files limit", "err", err)
		return 0, false
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("cannot raise the open files limit", "err", err)
		}
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	if lim.Cur < 4096 {
		log.Warn("the open files limit is low for a proxy with an embedded store", "limit", lim.Cur)
	}
	return uint64(lim.Cur), true
}
