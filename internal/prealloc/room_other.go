//go:build !linux

package prealloc

// KeepRoom does nothing here: fallocate is Linux's.
func KeepRoom(path string, room int64) error { return nil }
