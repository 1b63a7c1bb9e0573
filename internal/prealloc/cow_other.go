//go:build !linux

package prealloc

// CopyOnWrite returns "": the file system is not told here (preallocation
// is Linux's).
func CopyOnWrite(path string) string { return "" }
