package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// madvPageout is Linux's MADV_PAGEOUT (since 5.4): reclaim the pages of
// the range now. For a file mapping, a clean page leaves memory (its data
// is the file's), a dirty one stays until written back; for anonymous
// memory the pages go to swap, or stay where there is none. Either way the
// contents are unchanged, so the advice is safe on any range, even one
// that Badger unmapped and something else mapped after the maps were read.
// (MADV_DONTNEED would zero anonymous memory: never used here.)
const madvPageout = 21

// trimmer returns to the kernel the resident pages of Badger's mapped
// files that the store no longer needs in memory: the data blocks of the
// tables (the .sst files) and the value logs. Badger maps every table
// whole, and writes a new table through its mapping, so without it every
// table built or compacted stays in the resident set (RssFile) until the
// kernel runs short of memory: the resident set grows with the keys stored.
// A table's index and bloom filter, at its end, are left alone: every
// lookup reads them. A data block read later is read again from the page
// cache or the disk.
type trimmer struct {
	dir string // Badger's directory, cleaned

	mu    sync.Mutex
	index map[string]int64 // .sst path: offset of its index (tables never change)
	off   bool             // the kernel has no MADV_PAGEOUT

	// poll's state: the resident file pages after the last trim, and when.
	lastFile int64
	lastAt   time.Time
}

// trimGrowth, trimMinAge and trimMaxAge say when poll trims: once the
// process's resident file pages grew by trimGrowth since the last trim (a
// compaction reads and writes tables at a hundred MB per second or more)
// but not within trimMinAge of it, and at least every trimMaxAge.
const (
	trimGrowth = 4 << 20
	trimMinAge = 50 * time.Millisecond
	trimMaxAge = time.Second
)

// poll trims when trimGrowth, trimMinAge or trimMaxAge says so; it is
// called from one goroutine. Reading the resident file pages
// (/proc/self/statm) costs microseconds; a trim costs a system call per
// table (about 3 ms with 800 tables).
func (t *trimmer) poll(now time.Time) error {
	age := now.Sub(t.lastAt)
	if age < trimMinAge || age < trimMaxAge && residentFile()-t.lastFile < trimGrowth {
		return nil
	}
	_, err := t.trim()
	t.lastFile, t.lastAt = residentFile(), now
	return err
}

// residentFile is the process's resident file-backed (and shared) memory,
// in bytes, from /proc/self/statm; 0 when it cannot be read.
func residentFile() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0
	}
	n, _ := strconv.ParseInt(f[2], 10, 64)
	return n * int64(os.Getpagesize())
}

func newTrimmer(dir string) *trimmer {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return &trimmer{dir: filepath.Clean(dir), index: map[string]int64{}}
}

// trim advises the kernel to reclaim the pages of the mapped tables' data
// blocks and of the mapped value logs, and returns the number of bytes
// advised (mapped, not necessarily resident). After its first error it
// does nothing: the error says why.
func (t *trimmer) trim() (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off {
		return 0, nil
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.off = true // no /proc: it will not come back
		return 0, err
	}
	page := uint64(os.Getpagesize())
	seen := map[string]bool{}
	var advised int64
	for line := range bytes.Lines(maps) {
		start, end, path, ok := parseMapsLine(string(bytes.TrimSuffix(line, []byte("\n"))))
		if !ok || filepath.Dir(path) != t.dir {
			continue
		}
		n := end - start
		switch {
		case strings.HasSuffix(path, ".sst"):
			seen[path] = true
			off, ok := t.index[path]
			if !ok {
				off, err = indexOffset(path)
				if err != nil {
					continue // a table being deleted, or not Badger's: leave it
				}
				t.index[path] = off
			}
			n = min(n, uint64(off)/page*page)
		case strings.HasSuffix(path, ".vlog"):
		default:
			continue // memtable logs, the discard stats: small, always in use
		}
		if n == 0 {
			continue
		}
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(n), madvPageout)
		switch errno {
		case 0:
			advised += int64(n)
		case syscall.EINVAL:
			t.off = true // a kernel before 5.4
			return advised, errors.New("madvise(MADV_PAGEOUT) is not supported")
		default:
			// ENOMEM: unmapped since the maps were read; EAGAIN: try later.
		}
	}
	for p := range t.index {
		if !seen[p] {
			delete(t.index, p)
		}
	}
	return advised, nil
}

// parseMapsLine reads the address range and path of one line of
// /proc/self/maps ("start-end perms offset dev inode path"); ok is false
// for a mapping of no file, of a deleted file, or not from the file's start.
func parseMapsLine(line string) (start, end uint64, path string, ok bool) {
	i := strings.IndexByte(line, '/')
	if i < 0 || strings.HasSuffix(line, " (deleted)") {
		return 0, 0, "", false
	}
	f := strings.Fields(line[:i])
	if len(f) != 5 || strings.Trim(f[2], "0") != "" {
		return 0, 0, "", false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, "", false
	}
	start, err1 := strconv.ParseUint(a, 16, 64)
	end, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || end <= start {
		return 0, 0, "", false
	}
	return start, end, line[i:], true
}

// indexOffset returns where a Badger table's index starts in its file.
// A table ends with its index, the index's length (4 bytes), the index's
// checksum and the checksum's length (4 bytes), big-endian (Badger v4's
// table.OpenTable reads them the same way).
func indexOffset(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	var b [4]byte
	pos := fi.Size() - 4
	if pos < 0 {
		return 0, errors.New("table too short")
	}
	if _, err := f.ReadAt(b[:], pos); err != nil {
		return 0, err
	}
	// Badger creates a table at its full size and fills it through its
	// mapping, footer last: until then the footer reads as zeros, which
	// must not be taken (and cached) for an empty index at the end.
	cl := int64(binary.BigEndian.Uint32(b[:]))
	pos -= cl + 4
	if cl == 0 || pos < 0 {
		return 0, errors.New("bad checksum length (a table not written yet?)")
	}
	if _, err := f.ReadAt(b[:], pos); err != nil {
		return 0, err
	}
	il := int64(binary.BigEndian.Uint32(b[:]))
	pos -= il
	if il == 0 || pos <= 0 {
		return 0, errors.New("bad index length (a table not written yet?)")
	}
	return pos, nil
}
