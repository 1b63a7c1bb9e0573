//go:build linux

package badger

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"

	"golang.org/x/sys/unix"
)

// fill writes n completed records of about bodySize bytes each under
// prefix, from 8 goroutines (so that the writer batches them).
func fill(t *testing.T, s *Store, prefix string, n, bodySize int, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	body := bytes.Repeat([]byte("x"), bodySize)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				k := fmt.Sprintf("%s-%08d", prefix, i)
				res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: ttl / 2, TTL: ttl}
				if _, err := s.Reserve(ctx, k, res); err != nil {
					errs <- err
					return
				}
				resp := store.Response{Status: 201, Body: body, BodyStored: true}
				if err := s.Commit(ctx, k, "t", resp, ttl); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// residentTables sums the resident bytes (Rss) of this process's mappings
// of the .sst files in dir, from /proc/self/smaps.
func residentTables(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sum int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && !strings.HasSuffix(f[0], ":") {
			// A mapping's header line, as in /proc/self/maps.
			_, _, path, ok := parseMapsLine(line)
			in = ok && filepath.Dir(path) == dir && strings.HasSuffix(path, ".sst")
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestTrimKeepsOnlyIndexesResident: after every block of every table has
// been read, trimming leaves at most the tables' indexes (and the page
// each one starts in) resident, whether the kernel takes every range in
// one process_madvise or each in a madvise of its own.
func TestTrimKeepsOnlyIndexesResident(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) { testTrimKeepsOnlyIndexesResident(t, batched) })
	}
}

func testTrimKeepsOnlyIndexesResident(t *testing.T, batched bool) {
	dir, err := filepath.Abs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Dir: dir, trimEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, "k", 20000, 1000, time.Hour)
	s.Close() // flushes the memtables into tables
	// No compaction may read or write tables while their pages are counted.
	s, err = Open(Options{Dir: dir, trimEvery: -1, noCompactions: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !batched {
		s.trim.mu.Lock()
		unix.Close(s.trim.pidfd)
		s.trim.pidfd = -1
		s.trim.mu.Unlock()
	} else if s.trim.pidfd < 0 {
		t.Log("this kernel refuses process_madvise: both runs advise range by range")
	}

	// Read every block of every table, as a compaction does.
	n := 0
	err = s.db.View(func(txn *bdg.Txn) error {
		it := txn.NewIterator(bdg.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := it.Item().Value(func([]byte) error { return nil }); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil || n != 20000 {
		t.Fatalf("read %d records, err %v; want 20000", n, err)
	}

	// What may stay resident: each table's index, in whole pages, and the
	// large folio of the page cache that straddles the index's start,
	// when the kernel cannot split it (the advice then skips it): allowed
	// up to straddle per table, as readahead builds them here.
	const straddle = 128 << 10
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(ssts) == 0 {
		t.Fatalf("tables: %v %v", ssts, err)
	}
	page := int64(os.Getpagesize())
	var bound, total int64
	for _, p := range ssts {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		off, err := indexOffset(p)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
		index := (fi.Size()+page-1)/page*page - off/page*page
		bound += index + min(straddle, fi.Size()-index)
	}
	before := residentTables(t, dir)
	if before <= bound {
		t.Fatalf("before trimming, %d bytes of %d tables (%d bytes) resident; want more than the indexes' %d (and straddling folios)", before, len(ssts), total, bound)
	}
	if _, err := s.trim.trim(); err != nil {
		t.Fatal(err)
	}
	if got := residentTables(t, dir); got > bound {
		t.Errorf("after trimming, %d bytes of %d tables (%d bytes) resident; want at most the indexes' %d (and straddling folios; before: %d)", got, len(ssts), total, bound, before)
	}
}

// A table Badger has created at its full size but not filled yet reads
// as zeros: its index offset is an error (not cached), not the end of the
// file, which would page out the index and bloom filter on every trim.
func TestIndexOffsetOfUnwrittenTable(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "000001.sst")
	if err := os.WriteFile(p, make([]byte, 512<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if off, err := indexOffset(p); err == nil {
		t.Errorf("indexOffset of an all-zero table = %d, nil; want an error", off)
	}
}

// TestTrimSkipsUnmappedRanges: a table unmapped between the reading of the
// maps and the advice (a compaction deleted it) fails its range only; the
// ranges after it are still paged out, in one process_madvise or one by
// one.
func TestTrimSkipsUnmappedRanges(t *testing.T) {
	t.Parallel()
	page := os.Getpagesize()
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "table"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const size = 64 << 10
			if err := f.Truncate(3 * size); err != nil {
				t.Fatal(err)
			}
			var maps [3][]byte
			for i := range maps {
				m, err := unix.Mmap(int(f.Fd()), int64(i*size), size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				if err != nil {
					t.Fatal(err)
				}
				for j := 0; j < size; j += page {
					m[j] = 1
				}
				if err := unix.Msync(m, unix.MS_SYNC); err != nil { // clean pages: PAGEOUT drops them
					t.Fatal(err)
				}
				maps[i] = m
			}
			defer unix.Munmap(maps[0])
			defer unix.Munmap(maps[2])
			ranges := make([]iovec, len(maps))
			for i, m := range maps {
				ranges[i] = iovec{base: uintptr(unsafe.Pointer(&m[0])), len: size}
			}
			if err := unix.Munmap(maps[1]); err != nil {
				t.Fatal(err)
			}

			tr := newTrimmer(t.TempDir())
			defer tr.close()
			if !batched && tr.pidfd >= 0 {
				unix.Close(tr.pidfd)
				tr.pidfd = -1
			}
			tr.mu.Lock()
			advised, err := tr.advise(ranges)
			tr.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			if advised != 2*size {
				t.Errorf("advised %d bytes, want %d (the two mapped ranges)", advised, 2*size)
			}
			for _, i := range []int{0, 2} {
				if n := residentPages(t, maps[i]); n > 0 {
					t.Errorf("range %d: %d of %d pages still resident", i, n, size/page)
				}
			}
		})
	}
}

// residentPages counts the pages of m that are in memory (mincore).
func residentPages(t *testing.T, m []byte) int {
	t.Helper()
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
