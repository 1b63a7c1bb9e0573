package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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
	off   bool             // the kernel has no MADV_PAGEOUT, or the trimmer is closed
	// pidfd refers to this process, for process_madvise, which advises
	// every range of a trim in one system call; -1 where the kernel
	// refuses it (it once required CAP_SYS_NICE even of a process advising
	// itself), and then each range takes a madvise of its own. Under load
	// the number of system calls is what makes a trim slow: each one that
	// blocks long enough gives up the goroutine's P, and getting one back
	// on a busy machine takes milliseconds, so a trim of 800 tables one
	// by one took 200 ms while compactions made 50 MiB resident.
	pidfd int
	statm *os.File // /proc/self/statm, kept open; nil when it cannot be
	// Buffers reused by every trim.
	maps   []byte
	ranges []iovec

	// poll's state: the resident file pages after the last trim, and when.
	lastFile int64
	lastAt   time.Time
}

// iovec is the kernel's struct iovec: a range of this process's memory.
type iovec struct{ base, len uintptr }

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
// (/proc/self/statm) costs microseconds; a trim reads /proc/self/maps and
// advises every table (about 3 ms of CPU with 800 tables, most of it in
// the kernel).
func (t *trimmer) poll(now time.Time) error {
	age := now.Sub(t.lastAt)
	if age < trimMinAge || age < trimMaxAge && t.residentFile()-t.lastFile < trimGrowth {
		return nil
	}
	_, err := t.trim()
	t.lastFile, t.lastAt = t.residentFile(), now
	return err
}

// residentFile is the process's resident file-backed (and shared) memory,
// in bytes, from /proc/self/statm; 0 when it cannot be read.
func (t *trimmer) residentFile() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.statm == nil {
		return 0
	}
	var b [128]byte
	n, err := t.statm.ReadAt(b[:], 0)
	if n == 0 && err != nil {
		return 0
	}
	f := strings.Fields(string(b[:n]))
	if len(f) < 3 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[2], 10, 64)
	return pages * int64(os.Getpagesize())
}

func newTrimmer(dir string) *trimmer {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	t := &trimmer{dir: filepath.Clean(dir), index: map[string]int64{}, pidfd: -1}
	if fd, err := unix.PidfdOpen(os.Getpid(), 0); err == nil {
		t.pidfd = fd
	}
	if f, err := os.Open("/proc/self/statm"); err == nil {
		t.statm = f
	}
	return t
}

// close releases the trimmer's file descriptors; it trims no more.
func (t *trimmer) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.off = true
	if t.pidfd >= 0 {
		unix.Close(t.pidfd)
		t.pidfd = -1
	}
	if t.statm != nil {
		t.statm.Close()
		t.statm = nil
	}
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
	maps, err := readAll("/proc/self/maps", t.maps[:0])
	t.maps = maps
	if err != nil {
		t.off = true // no /proc: it will not come back
		return 0, err
	}
	page := uint64(os.Getpagesize())
	seen := map[string]bool{}
	ranges := t.ranges[:0]
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
		if n > 0 {
			ranges = append(ranges, iovec{base: uintptr(start), len: uintptr(n)})
		}
	}
	t.ranges = ranges
	for p := range t.index {
		if !seen[p] {
			delete(t.index, p)
		}
	}
	return t.advise(ranges)
}

// maxIovecs is the kernel's UIO_MAXIOV: the most ranges one
// process_madvise takes.
const maxIovecs = 1024

// advise advises MADV_PAGEOUT on every range and returns the bytes
// advised. A range unmapped since the maps were read is skipped (ENOMEM),
// as is one the kernel cannot advise just now (EAGAIN).
func (t *trimmer) advise(ranges []iovec) (int64, error) {
	var advised int64
	for len(ranges) > 0 && t.pidfd >= 0 {
		batch := ranges[:min(len(ranges), maxIovecs)]
		r, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(t.pidfd),
			uintptr(unsafe.Pointer(&batch[0])), uintptr(len(batch)), madvPageout, 0, 0)
		switch errno {
		case 0:
		case unix.EPERM, unix.ENOSYS, unix.EINVAL, unix.EBADF, unix.ESRCH:
			// Not for this process, or not on this kernel: one by one.
			unix.Close(t.pidfd)
			t.pidfd = -1
			continue
		default:
			r = 0 // the first range failed
		}
		// The kernel advises the ranges in order and stops at the first
		// it cannot advise: skip the ranges it did, and the one it
		// stopped at.
		advised += int64(r)
		done := 0
		for left := r; done < len(batch) && batch[done].len <= left; done++ {
			left -= batch[done].len
		}
		if errno == 0 && done == len(batch) {
			ranges = ranges[done:]
			continue
		}
		ranges = ranges[done+1:]
	}
	for _, rg := range ranges {
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, rg.base, rg.len, madvPageout)
		switch errno {
		case 0:
			advised += int64(rg.len)
		case syscall.EINVAL:
			t.off = true // a kernel before 5.4
			return advised, errors.New("madvise(MADV_PAGEOUT) is not supported")
		default:
			// ENOMEM: unmapped since the maps were read; EAGAIN: try later.
		}
	}
	return advised, nil
}

// readAll reads the whole file at path into buf (grown as needed), in as
// few reads as its size allows: /proc files fill what each read asks for.
func readAll(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, max(64<<10, cap(buf)))...)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
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
