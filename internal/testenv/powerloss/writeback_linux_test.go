//go:build linux

package powerloss

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestWritebackKeepsAShareOfTheUnsyncedPages writes 64 pages over a synced
// file without syncing them, cuts the power, and counts the pages that
// survived: none by default, all with Writeback 1, some (in no order) with
// 0.5; pages past the durable size never.
func TestWritebackKeepsAShareOfTheUnsyncedPages(t *testing.T) {
	const pages = 64
	tests := []struct {
		writeback float64
		min, max  int // surviving unsynced pages
	}{
		{0, 0, 0},
		{1, pages, pages},
		{0.5, 1, pages - 1}, // 0 or 64 of 64 at even odds: 2 in 2^64
	}
	for _, tt := range tests {
		dir := newDisk(t, map[string]string{"f": ""})
		fsys := MountT(t, dir, Options{Writeback: tt.writeback, Seed: 7})
		f, err := os.OpenFile(filepath.Join(fsys.Mountpoint(), "f"), os.O_RDWR, 0)
		must(t, err)
		for i := range pages {
			_, err := f.WriteAt(pattern(0), int64(i)*block)
			must(t, err)
		}
		must(t, f.Sync())
		for i := range pages + 4 { // 4 pages past the synced size
			_, err := f.WriteAt(pattern(i+1), int64(i)*block)
			must(t, err)
		}
		must(t, f.Close())
		powerOff(t, fsys)
		got := []byte(content(t, filepath.Join(dir, "f")))
		if len(got) != pages*block {
			t.Fatalf("writeback %v: %d bytes after the cut, want the synced %d", tt.writeback, len(got), pages*block)
		}
		kept := 0
		for i := range pages {
			switch page := got[i*block : (i+1)*block]; {
			case bytes.Equal(page, pattern(i+1)):
				kept++
			case !bytes.Equal(page, pattern(0)):
				t.Fatalf("writeback %v: page %d is neither the synced nor the unsynced content", tt.writeback, i)
			}
		}
		if kept < tt.min || kept > tt.max {
			t.Errorf("writeback %v: %d of %d unsynced pages survived, want %d to %d", tt.writeback, kept, pages, tt.min, tt.max)
		}
		t.Logf("writeback %v: %d of %d unsynced pages survived", tt.writeback, kept, pages)
	}
}
