package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// markedRecord is the record of seq setting key, with durable mark synced.
func markedRecord(seq, synced uint64, key string, valSize int) []byte {
	var r walRecorder
	r.reset()
	r.set([]byte(key), bytes.Repeat([]byte("v"), valSize), metaCompleted, 1<<40)
	return append([]byte(nil), r.frame(seq, synced)...)
}

// prevFormatRecord is the record of seq setting key in the previous format:
// no durable mark.
func prevFormatRecord(seq uint64, key string) []byte {
	var r walRecorder
	r.reset()
	r.set([]byte(key), []byte("value of "+key), metaCompleted, 1<<40)
	rec := append(r.buf[:walHeader:walHeader], r.buf[walHeader+walMarkSize:]...)
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(rec)-walHeader))
	binary.LittleEndian.PutUint64(rec[8:16], seq)
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[8:], castagnoli))
	return append([]byte(nil), rec...)
}

// segmentOf is a zeroed segment of size bytes holding recs in order, and
// the offset of each and of the end.
func segmentOf(size int, recs ...[]byte) (data []byte, offs []int) {
	data = make([]byte, size)
	off := 0
	for _, r := range recs {
		offs = append(offs, off)
		off += copy(data[off:], r)
	}
	return data, append(offs, off)
}

// keysOf names the records from first to last: k<seq>.
func keysOf(first, last uint64) []string {
	var ks []string
	for i := first; i <= last; i++ {
		ks = append(ks, fmt.Sprintf("pay/-/k%d", i))
	}
	return ks
}

// syncedRun is the records first..last, each synced before the next was
// written (a reservation each), or all written after synced was the last
// one synced (unsynced: commits), when synced is not 0.
func syncedRun(first, last, synced uint64, valSize int) [][]byte {
	var recs [][]byte
	for i := first; i <= last; i++ {
		mark := i - 1
		if synced != 0 {
			mark = synced
		}
		recs = append(recs, markedRecord(i, mark, fmt.Sprintf("pay/-/k%d", i), valSize))
	}
	return recs
}

// openKeys opens the store in dir and returns which of keys it holds.
func openKeys(t *testing.T, dir string, keys []string) (present []string, err error) {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	err = s.db.View(func(txn *bdg.Txn) error {
		for _, k := range keys {
			_, err := txn.Get([]byte(k))
			if errors.Is(err, bdg.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			present = append(present, k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return present, nil
}

// TestDamageToldFromTornTail: a record that fails its checksum followed by
// a record written after it was synced is damage: Open refuses with
// errLogDamaged naming the segment, offset and sequence, and changes
// nothing. A record lost after the last sync, even with later unsynced
// records surviving (the kernel writes pages back in any order), is a
// torn tail: the store opens with the records before it.
func TestDamageToldFromTornTail(t *testing.T) {
	t.Parallel()
	const page = 4096
	synced := syncedRun(1, 40, 0, 300)     // each synced before the next
	unsynced := syncedRun(41, 60, 40, 300) // after the last sync
	all := append(append([][]byte(nil), synced...), unsynced...)
	seg, offs := segmentOf(1<<16, all...)
	pageOf := func(off int) (int, int) { return off / page * page, off/page*page + page }
	// lose reverts the page holding off to what it held at the last
	// sync: the bytes after the synced records zero.
	lose := func(d []byte, off int) {
		from, to := pageOf(off)
		clear(d[max(from, offs[40]):to])
	}

	type tc struct {
		name     string
		segs     func() [][]byte
		damaged  bool
		wantSeg  int
		wantOff  int
		wantSeq  uint64
		wantKeys int // keys k1.. present after an open
	}
	tests := []tc{
		{name: "one byte flipped mid-segment", damaged: true, wantSeg: 0, wantOff: offs[19], wantSeq: 20,
			segs: func() [][]byte { d := bytes.Clone(seg); d[offs[19]+walHeader+40] ^= 0x20; return [][]byte{d} }},
		{name: "a length flipped mid-segment", damaged: true, wantSeg: 0, wantOff: offs[19], wantSeq: 20,
			segs: func() [][]byte { d := bytes.Clone(seg); d[offs[19]+1] ^= 0x7f; return [][]byte{d} }},
		{name: "a synced page zeroed", damaged: true, wantSeg: 0, wantSeq: 0, // where the page begins
			segs: func() [][]byte {
				d := bytes.Clone(seg)
				from, to := pageOf(offs[20])
				clear(d[from:to])
				return [][]byte{d}
			}},
		{name: "the first page zeroed", damaged: true, wantSeg: 0, wantSeq: 0,
			segs: func() [][]byte { d := bytes.Clone(seg); clear(d[:page]); return [][]byte{d} }},
		{name: "an unsynced page lost, a later one kept", wantKeys: 40,
			segs: func() [][]byte {
				d := bytes.Clone(seg)
				if offs[48]/page == offs[40]/page {
					panic("the records are too small for the test")
				}
				lose(d, offs[42])
				return [][]byte{d}
			}},
		{name: "an unsynced page lost mid-run, later ones kept", wantKeys: -1,
			segs: func() [][]byte {
				d := bytes.Clone(seg)
				from, to := pageOf(offs[50])
				clear(d[max(from, offs[45]):to]) // 41..44 reached the disk, the page after them did not
				return [][]byte{d}
			}},
		{name: "an unsynced record half written, later ones kept", wantKeys: 45,
			segs: func() [][]byte {
				d := bytes.Clone(seg)
				copy(d[offs[45]+walHeader+100:offs[46]], bytes.Repeat([]byte{0xa5}, offs[46]-offs[45]-walHeader-100))
				return [][]byte{d}
			}},
		{name: "the last synced record's page kept, the next unsynced one torn", wantKeys: 40,
			segs: func() [][]byte { d := bytes.Clone(seg); d[offs[40]+walHeader+5] ^= 1; return [][]byte{d} }},
		{name: "damage in an older segment", damaged: true, wantSeg: 0, wantOff: offs[5], wantSeq: 6,
			segs: func() [][]byte {
				a, o := segmentOf(1<<14, synced[:20]...)
				a[o[5]+walHeader+3] ^= 0x01
				b, _ := segmentOf(1<<14, synced[20:]...)
				return [][]byte{a, b}
			}},
		{name: "a torn end of an older segment", damaged: true, wantSeg: 0, wantOff: offs[19], wantSeq: 20,
			segs: func() [][]byte {
				a, o := segmentOf(1<<14, synced[:20]...)
				a[o[19]+walHeader+3] ^= 0x01 // synced whole before the next segment was written
				b, _ := segmentOf(1<<14, synced[20:]...)
				return [][]byte{a, b}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			segs := tt.segs()
			writeSegments(t, dir, segs...)
			present, err := openKeys(t, dir, keysOf(1, 60))
			if !tt.damaged {
				if err != nil {
					t.Fatalf("Open with a torn tail: %v", err)
				}
				var want []string
				if tt.wantKeys >= 0 {
					want = keysOf(1, uint64(tt.wantKeys))
				} else { // up to the lost page
					want = keysOf(1, uint64(len(present)))
					if len(present) < 44 || len(present) > 50 {
						t.Errorf("%d keys after the open, want the 40 synced and those before the lost page", len(present))
					}
				}
				if strings.Join(present, " ") != strings.Join(want, " ") {
					t.Errorf("keys after the open = %v, want %v", present, want)
				}
				return
			}
			if !errors.Is(err, errLogDamaged) {
				t.Fatalf("Open = %v, want ErrLogDamaged", err)
			}
			name := segmentName(uint64(tt.wantSeg))
			if !strings.Contains(err.Error(), name) {
				t.Errorf("Open error %q does not name segment %s", err, name)
			}
			if tt.wantSeq != 0 && !strings.Contains(err.Error(), fmt.Sprintf("offset %d, sequence %d", tt.wantOff, tt.wantSeq)) {
				t.Errorf("Open error %q does not name offset %d and sequence %d", err, tt.wantOff, tt.wantSeq)
			}
			for i, want := range segs {
				got, err := os.ReadFile(filepath.Join(dir, walDirName, segmentName(uint64(i))))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("segment %d after the refused open changed (%v)", i, err)
				}
			}
			rep, err := Check(dir)
			if err != nil || rep.OK() || rep.Damage[0].Segment != filepath.Join(dir, walDirName, name) {
				t.Errorf("Check = %+v, %v; want the damage in %s", rep, err, name)
			}
		})
	}
}

// TestRecycledLeftoversAreNoDamage: a recycled segment holds records of its
// earlier use (lower sequence numbers) after its new ones, with the new
// records' tail torn over them or not: no damage, the new records replay.
// A spare recycled segment after the log holds only leftovers.
func TestRecycledLeftoversAreNoDamage(t *testing.T) {
	t.Parallel()
	old, oldOffs := segmentOf(1<<14, syncedRun(1, 30, 0, 200)...)
	newRecs := syncedRun(100, 104, 0, 150)
	tests := []struct {
		name string
		seg  func() []byte
		want int // new records replayed
	}{
		{"new records then leftovers", func() []byte {
			d := bytes.Clone(old)
			off := 0
			for _, r := range newRecs {
				off += copy(d[off:], r)
			}
			return d
		}, 5},
		{"the last new record torn over leftovers", func() []byte {
			d := bytes.Clone(old)
			off := 0
			for _, r := range newRecs[:4] {
				off += copy(d[off:], r)
			}
			copy(d[off:], newRecs[4][:40]) // its first bytes only
			return d
		}, 4},
		{"an unsynced new record lost, a later one kept", func() []byte {
			d := bytes.Clone(old)
			recs := append(syncedRun(100, 102, 0, 150), syncedRun(103, 106, 102, 150)...)
			off := 0
			for i, r := range recs {
				if i != 3 { // 103 lost: the old bytes are there
					copy(d[off:], r)
				}
				off += len(r)
			}
			return d
		}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			spare := bytes.Clone(old)
			clear(spare[:walHeader]) // recycled: its first record zeroed
			writeSegments(t, dir, tt.seg(), spare)
			present, err := openKeys(t, dir, append(keysOf(1, 30), keysOf(100, 106)...))
			if err != nil {
				t.Fatalf("Open over a recycled segment: %v", err)
			}
			if want := keysOf(100, 99+uint64(tt.want)); strings.Join(present, " ") != strings.Join(want, " ") {
				t.Errorf("keys after the open = %v, want %v", present, want)
			}
		})
	}
	_ = oldOffs
}

// TestPreviousFormatLogReplays: a log written by the previous format (no
// durable mark) still replays, torn tail and all, and damage before a
// later segment is still refused.
func TestPreviousFormatLogReplays(t *testing.T) {
	t.Parallel()
	var recs [][]byte
	for i := uint64(1); i <= 10; i++ {
		recs = append(recs, prevFormatRecord(i, fmt.Sprintf("pay/-/k%d", i)))
	}
	seg, offs := segmentOf(4096, recs...)
	torn := bytes.Clone(seg)
	torn[offs[7]+walHeader+2] ^= 0x40 // in the last segment: torn
	dir := t.TempDir()
	writeSegments(t, dir, torn)
	present, err := openKeys(t, dir, keysOf(1, 10))
	if err != nil {
		t.Fatalf("Open with a log of the previous format: %v", err)
	}
	if want := keysOf(1, 7); strings.Join(present, " ") != strings.Join(want, " ") {
		t.Errorf("keys = %v, want %v", present, want)
	}
	// A recycled spare after it: leftovers of the previous format past
	// its zeroed first record are not records of the log.
	dir = t.TempDir()
	spare := bytes.Clone(seg)
	clear(spare[:walHeader])
	writeSegments(t, dir, torn, spare)
	if present, err := openKeys(t, dir, keysOf(1, 10)); err != nil || len(present) != 7 {
		t.Errorf("Open with a spare of the previous format = %v, %v; want keys k1..k7", present, err)
	}
	dir = t.TempDir()
	next, _ := segmentOf(4096, prevFormatRecord(11, "pay/-/k11"))
	writeSegments(t, dir, torn, next)
	if _, err := openKeys(t, dir, nil); !errors.Is(err, errLogDamaged) {
		t.Errorf("Open with a damaged older segment of the previous format = %v, want ErrLogDamaged", err)
	}
}

// TestForgedFrameInsideAnswerIsNoProof: a stored answer may hold bytes
// that frame as a record (an upstream echoing its request): found by the
// byte-by-byte search after a torn record, such a frame proves nothing
// unless its sequence number could be there.
func TestForgedFrameInsideAnswerIsNoProof(t *testing.T) {
	t.Parallel()
	forged := markedRecord(1<<40, 1<<40-1, "pay/-/forged", 10)
	var r walRecorder
	r.reset()
	r.set([]byte("pay/-/k3"), append(bytes.Repeat([]byte("x"), 50), forged...), metaCompleted, 1<<40)
	third := append([]byte(nil), r.frame(3, 2)...)
	seg, offs := segmentOf(4096, markedRecord(1, 0, "pay/-/k1", 10), markedRecord(2, 1, "pay/-/k2", 10), third)
	seg[offs[2]+1] ^= 0x7f // its length torn: the search goes byte by byte, through the answer
	dir := t.TempDir()
	writeSegments(t, dir, seg)
	present, err := openKeys(t, dir, keysOf(1, 3))
	if err != nil {
		t.Fatalf("Open: %v (a forged frame in an answer taken as proof of damage)", err)
	}
	if want := keysOf(1, 2); strings.Join(present, " ") != strings.Join(want, " ") {
		t.Errorf("keys = %v, want %v", present, want)
	}
}

// TestLogMarksWhatWasSynced: the store's own records carry the durable
// mark: a reservation's record is synced before the next batch is
// written, so a byte flipped in it, in a log the store wrote, is damage;
// a commit's record after the last reservation is not, and flipped it is
// a torn tail.
func TestLogMarksWhatWasSynced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	snapshot := filepath.Join(t.TempDir(), "badger")
	copyDir(t, dir, snapshot) // Badger as opened: nothing since synced
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	for i := range 20 {
		k := fmt.Sprintf("pay/-/k%d", i)
		if _, err := s.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: []byte("answer"), BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	logDir := filepath.Join(t.TempDir(), "log")
	copyDir(t, filepath.Join(dir, walDirName), logDir)
	s.Close()
	nums, err := walSegments(logDir)
	if err != nil || len(nums) != 1 {
		t.Fatalf("segments %v, %v; want one", nums, err)
	}
	segPath := filepath.Join(logDir, segmentName(nums[0]))
	data, err := os.ReadFile(segPath)
	if err != nil {
		t.Fatal(err)
	}
	// The records' offsets, from the chain.
	var offs []int
	off := 0
	for {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		if n == 0 {
			break
		}
		offs = append(offs, off)
		off += walHeader + n
	}
	if len(offs) < 20 {
		t.Fatalf("%d records in the log, want at least 20", len(offs))
	}
	for _, tt := range []struct {
		name    string
		rec     int
		damaged bool
	}{
		{"a reservation mid-log", len(offs) / 2, true},
		{"the last commit", len(offs) - 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := bytes.Clone(data)
			d[offs[tt.rec]+walHeader+walMarkSize+3] ^= 0x08
			crashLog := filepath.Join(t.TempDir(), "log")
			copyDir(t, logDir, crashLog)
			if err := os.WriteFile(filepath.Join(crashLog, segmentName(nums[0])), d, 0o600); err != nil {
				t.Fatal(err)
			}
			crashed := crashCopy(t, snapshot, crashLog)
			r, err := Open(Options{Dir: crashed, SyncWrites: true})
			if err == nil {
				r.Close()
			}
			if got := errors.Is(err, errLogDamaged); got != tt.damaged {
				t.Errorf("Open = %v; damaged %v, want %v", err, got, tt.damaged)
			}
		})
	}
}

// FuzzWALLog: reading any bytes as a log of two segments, with any applied
// sequence number, never panics nor fails; the records it would replay
// chain (each span reads on its own to its end, the sequence numbers
// following on across spans), and every damage it reports lies inside its
// segment. Seeds: testdata/fuzz/FuzzWALLog.
func FuzzWALLog(f *testing.F) {
	seg, offs := segmentOf(2048, syncedRun(1, 6, 0, 100)...)
	flipped := bytes.Clone(seg)
	flipped[offs[2]+walHeader+20] ^= 1
	f.Add(seg, uint16(1024), uint64(0))
	f.Add(flipped, uint16(2048), uint64(0))
	f.Add(flipped, uint16(offs[4]), uint64(3))
	f.Fuzz(func(t *testing.T, data []byte, split uint16, applied uint64) {
		cut := int(split) % (len(data) + 1)
		parts := [][]byte{data[:cut], data[cut:]}
		files := make([]segmentFile, len(parts))
		for i, p := range parts {
			files[i] = segmentFile{name: segmentName(uint64(i)), r: bytes.NewReader(p), size: int64(len(p))}
		}
		scan, err := scanLog(files, applied)
		if err != nil {
			t.Fatalf("scanLog: %v", err)
		}
		records, next := 0, uint64(0)
		for i, sp := range scan.spans {
			if sp.from < 0 || sp.to > files[sp.seg].size || sp.from >= sp.to {
				t.Fatalf("span %+v outside its segment of %d bytes", sp, files[sp.seg].size)
			}
			if i > 0 && sp.first != next {
				t.Fatalf("span %d begins at sequence %d, want %d", i, sp.first, next)
			}
			n, end, _, err := scanSegment(parts[sp.seg][sp.from:sp.to], sp.first, nil)
			if err != nil || int64(end) != sp.to-sp.from {
				t.Fatalf("span %+v reads to %d (%v), want its end", sp, end, err)
			}
			records += int(n - sp.first)
			next = n
		}
		if records != scan.records {
			t.Fatalf("spans hold %d records, the scan counted %d", records, scan.records)
		}
		for _, d := range scan.damage {
			if d.Offset < 0 || d.Offset > int64(len(data)) {
				t.Fatalf("damage %+v outside the log", d)
			}
		}
		if len(scan.damage) == 0 && scan.after != 0 {
			t.Fatalf("%d records set aside without damage", scan.after)
		}
	})
}
