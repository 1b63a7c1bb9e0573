//go:build linux && (amd64 || arm64)

package prealloc

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// BenchmarkFilter measures what the filter costs the system calls it lets
// through (every one but ftruncate), before and after Start in the same
// process: "unfiltered" must run first, as Start cannot be undone. Run it
// alone: go test -run '^$' -bench Filter ./internal/prealloc.
func BenchmarkFilter(b *testing.B) {
	dir := b.TempDir()
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	calls := func(b *testing.B) {
		b.Run("getppid", func(b *testing.B) {
			for b.Loop() {
				syscall.Getppid()
			}
		})
		b.Run("pwrite4k", func(b *testing.B) {
			for b.Loop() {
				if _, err := f.WriteAt(buf, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("ftruncate", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if err := f.Truncate(int64(4096 * (i%2 + 1))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("unfiltered", func(b *testing.B) {
		if Active() {
			b.Fatal("the filter is already installed: run this benchmark alone")
		}
		calls(b)
	})
	b.Run("filtered", func(b *testing.B) {
		if err := Start(nil, nil); err != nil {
			b.Fatal(err)
		}
		calls(b)
	})
}
