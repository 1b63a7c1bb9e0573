//go:build !unix

package main

import "log/slog"

// raiseOpenFiles does nothing where there is no RLIMIT_NOFILE.
func raiseOpenFiles(*slog.Logger) {}
