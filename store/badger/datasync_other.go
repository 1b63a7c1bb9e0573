//go:build !linux

package badger

import "os"

// fdatasync makes f durable where fdatasync(2) is missing: File.Sync,
// which on macOS asks the drive itself to flush (F_FULLFSYNC).
func fdatasync(f *os.File) error { return f.Sync() }
