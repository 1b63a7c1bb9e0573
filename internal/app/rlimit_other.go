//go:build !unix

package app

import "log/slog"

// raiseOpenFiles does nothing where there is no RLIMIT_NOFILE; the limit
// is unknown.
func raiseOpenFiles(*slog.Logger) (uint64, bool) { return 0, false }
