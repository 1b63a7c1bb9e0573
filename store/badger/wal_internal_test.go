package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// testRecord is the framed record of entries (a delete when val is nil).
func testRecord(seq uint64, entries ...walEntry) []byte {
	var r walRecorder
	r.reset()
	for _, e := range entries {
		if e.kind == walDelete {
			r.del(e.key)
		} else {
			r.set(e.key, e.val, e.meta, e.expiresAt)
		}
	}
	return append([]byte(nil), r.frame(seq, seq-1)...)
}

// testSegment is a zeroed segment of size bytes holding records with
// sequence numbers from first, one per key of keys, and the offsets where
// each record begins and the last ends.
func testSegment(size int, first uint64, keys ...string) (data []byte, offs []int) {
	data = make([]byte, size)
	off := 0
	for i, k := range keys {
		rec := testRecord(first+uint64(i),
			walEntry{kind: walSet, key: []byte(k), val: []byte("value of " + k), meta: metaCompleted, expiresAt: 1 << 40},
			walEntry{kind: walDelete, key: []byte("gone/" + k)})
		offs = append(offs, off)
		off += copy(data[off:], rec)
	}
	return data, append(offs, off)
}

// scanKeys returns the keys set by the records scanSegment reads.
func scanKeys(t *testing.T, data []byte, seq uint64) (keys []string, why walStop) {
	t.Helper()
	_, _, why, err := scanSegment(data, seq, func(_ uint64, payload []byte) error {
		return decodeRecord(payload, func(e walEntry) error {
			if e.kind == walSet {
				keys = append(keys, string(e.key))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("scanSegment: %v", err)
	}
	return keys, why
}

func TestWALRecordRoundTrip(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), 70000)
	want := []walEntry{
		{kind: walSet, key: []byte("pay/-/k1"), val: []byte("v1"), meta: metaCompleted, expiresAt: 1234567},
		{kind: walDelete, key: []byte("pay/-/k2")},
		{kind: walSet, key: []byte("\x00rc/idx"), val: nil, meta: metaIndex, expiresAt: 0},
		{kind: walSet, key: []byte("big"), val: big, meta: metaInFlight, expiresAt: 1 << 62},
	}
	rec := testRecord(42, want...)
	var got []walEntry
	next, end, why, err := scanSegment(append(rec, make([]byte, 64)...), 42, func(seq uint64, payload []byte) error {
		if seq != 42 {
			t.Errorf("record seq = %d, want 42", seq)
		}
		return decodeRecord(payload, func(e walEntry) error { got = append(got, e); return nil })
	})
	if err != nil || next != 43 || end != len(rec) || why != stopEnd {
		t.Fatalf("scanSegment = next %d, end %d, stop %v, %v; want 43, %d, stopEnd, nil", next, end, why, err, len(rec))
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.kind != w.kind || !bytes.Equal(g.key, w.key) || !bytes.Equal(g.val, w.val) || g.meta != w.meta || g.expiresAt != w.expiresAt {
			t.Errorf("entry %d = {%d %q %d bytes meta %d exp %d}, want {%d %q %d bytes meta %d exp %d}", i,
				g.kind, g.key, len(g.val), g.meta, g.expiresAt, w.kind, w.key, len(w.val), w.meta, w.expiresAt)
		}
	}
}

// TestWALTornTail: a segment cut, zeroed or damaged anywhere in its last
// record reads as the records before it, stopping there.
func TestWALTornTail(t *testing.T) {
	t.Parallel()
	keys := []string{"k0", "k1", "k2", "k3"}
	full, offs := testSegment(4096, 7, keys...)
	last, end := offs[len(keys)-1], offs[len(keys)]
	if got, why := scanKeys(t, full, 7); len(got) != len(keys) || why != stopEnd {
		t.Fatalf("whole segment: keys %v, stop %v; want %v, stopEnd", got, why, keys)
	}
	// Cut at every byte of the last record: what a crash leaves when the
	// file ends there (a segment made short by hand).
	for cut := last; cut < end; cut++ {
		got, _ := scanKeys(t, full[:cut], 7)
		if len(got) != len(keys)-1 {
			t.Errorf("cut at %d (last record %d..%d): read %v, want %v", cut, last, end, got, keys[:3])
		}
	}
	// Zeroed from every byte of the last record on: the blocks the crash
	// did not write.
	for from := last; from < end; from++ {
		data := bytes.Clone(full)
		clear(data[from:])
		got, _ := scanKeys(t, data, 7)
		if len(got) != len(keys)-1 {
			t.Errorf("zeroed from %d (last record %d..%d): read %v, want %v", from, last, end, got, keys[:3])
		}
	}
	// Every bit of the last record flipped, one at a time.
	for i := last; i < end; i++ {
		for bit := range 8 {
			data := bytes.Clone(full)
			data[i] ^= 1 << bit
			got, _ := scanKeys(t, data, 7)
			if len(got) != len(keys)-1 {
				t.Errorf("bit %d of byte %d flipped: read %v, want %v", bit, i, got, keys[:3])
			}
		}
	}
}

func TestWALScanStops(t *testing.T) {
	t.Parallel()
	full, offs := testSegment(4096, 1, "a", "b", "c")
	tests := []struct {
		name     string
		data     []byte
		seq      uint64
		wantKeys int
		wantWhy  walStop
	}{
		{"empty", nil, 1, 0, stopEnd},
		{"zeroed", make([]byte, 100), 1, 0, stopEnd},
		{"shorter than a frame", full[:walHeader-1], 1, 0, stopEnd},
		{"whole", full, 1, 3, stopEnd},
		{"exactly full", full[:offs[3]], 1, 3, stopEnd},
		{"a lower first sequence (a recycled segment's leftover)", full, 2, 0, stopEnd},
		{"a higher first sequence", full, 0, 0, stopTorn},
		{"length past the end", func() []byte {
			d := bytes.Clone(full)
			binary.LittleEndian.PutUint32(d[offs[1]:], 1<<30)
			return d
		}(), 1, 1, stopTorn},
		{"a record with the sequence of the one before (a leftover)", func() []byte {
			d := bytes.Clone(full)
			copy(d[offs[2]:], testRecord(2, walEntry{kind: walDelete, key: []byte("x")}))
			return d
		}(), 1, 2, stopEnd},
		{"a record with a sequence ahead", func() []byte {
			d := bytes.Clone(full)
			copy(d[offs[2]:], testRecord(9, walEntry{kind: walDelete, key: []byte("x")}))
			return d
		}(), 1, 2, stopTorn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := scanKeys(t, tt.data, tt.seq)
			if len(got) != tt.wantKeys || why != tt.wantWhy {
				t.Errorf("read %d records (%v), stop %v; want %d, stop %v", len(got), got, why, tt.wantKeys, tt.wantWhy)
			}
		})
	}
}

// writeSegments writes segs as the log of the store in dir.
func writeSegments(t *testing.T, dir string, segs ...[]byte) {
	t.Helper()
	wd := filepath.Join(dir, walDirName)
	if err := os.MkdirAll(wd, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, s := range segs {
		if err := os.WriteFile(filepath.Join(wd, segmentName(uint64(i))), s, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenReplaysLog: a log of segments, the last torn, is replayed into
// the store on open (a set, its later delete, an expired set), and is
// empty afterwards.
func TestOpenReplaysLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithCommittedKey(t, dir) // pay/-/k1, completed, in Badger
	future := uint64(time.Now().Add(time.Hour).Unix())
	rec := func(k string, st store.State) []byte {
		r := &record{State: st, Token: "tok", CreatedAt: time.Now().UnixMilli(), Lease: time.Now().Add(time.Minute).UnixMilli()}
		v, err := r.marshal()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	seg0 := make([]byte, 1<<16)
	off := copy(seg0, testRecord(5,
		walEntry{kind: walSet, key: []byte("pay/-/a"), val: rec("a", store.StateInFlight), meta: metaInFlight, expiresAt: future},
		walEntry{kind: walSet, key: []byte("pay/-/b"), val: rec("b", store.StateInFlight), meta: metaInFlight, expiresAt: future}))
	off += copy(seg0[off:], testRecord(6, walEntry{kind: walDelete, key: []byte("pay/-/k1")}))
	seg1 := make([]byte, 1<<16)
	off = copy(seg1, testRecord(7, walEntry{kind: walDelete, key: []byte("pay/-/b")},
		walEntry{kind: walSet, key: []byte("pay/-/old"), val: rec("old", store.StateCompleted), meta: metaCompleted, expiresAt: 1}))
	torn := testRecord(8, walEntry{kind: walSet, key: []byte("pay/-/torn"), val: rec("torn", store.StateInFlight), meta: metaInFlight, expiresAt: future})
	copy(seg1[off:], torn[:len(torn)-3])
	writeSegments(t, dir, seg0, seg1, make([]byte, 1<<16))

	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open with a log whose tail is torn: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	want := map[string]store.State{"pay/-/a": store.StateInDoubt, "pay/-/b": "", "pay/-/k1": "", "pay/-/old": "", "pay/-/torn": ""}
	for k, st := range want {
		got, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case st == "" && got != nil:
			t.Errorf("%s after replay = %v, want none", k, got.State)
		case st != "" && (got == nil || got.State != st):
			t.Errorf("%s after replay = %+v, want %v", k, got, st)
		}
	}
	nums, err := walSegments(filepath.Join(dir, walDirName))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nums {
		if n < 3 {
			t.Errorf("segment %d is still there after the replay", n)
		}
	}
}

// TestOpenRefusesDamagedLog: a segment that stops at a bad record while a
// later segment holds records lost synced writes: Open refuses, naming the
// segment, and leaves the log as it was.
func TestOpenRefusesDamagedLog(t *testing.T) {
	t.Parallel()
	seg0, offs := testSegment(4096, 1, "a", "b", "c")
	seg1, _ := testSegment(4096, 4, "d")
	gap, _ := testSegment(4096, 9, "z")
	flipped := bytes.Clone(seg0)
	flipped[offs[1]+walHeader+2] ^= 0x10
	tests := []struct {
		name     string
		segs     [][]byte
		wantErr  string
		wantFile string
	}{
		{"bit flip before a later segment", [][]byte{flipped, seg1}, "is damaged", segmentName(0)},
		{"bit flip before a torn-at-start and a later segment", [][]byte{flipped, make([]byte, 64), seg1}, "is damaged", segmentName(0)},
		{"sequence gap", [][]byte{seg0, gap}, "records are missing", segmentName(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSegments(t, dir, tt.segs...)
			s, err := Open(Options{Dir: dir, SyncWrites: true})
			if err == nil {
				s.Close()
				t.Fatal("Open with a damaged log succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.wantFile) {
				t.Errorf("Open error = %v, want one containing %q and %q", err, tt.wantErr, tt.wantFile)
			}
			for i, want := range tt.segs {
				got, err := os.ReadFile(filepath.Join(dir, walDirName, segmentName(uint64(i))))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("segment %d after the refused open: %d bytes, %v; want it unchanged", i, len(got), err)
				}
			}
		})
	}
	// A torn tail in the last segment holding records is a crash, not
	// damage: the store opens.
	t.Run("flip in the last segment", func(t *testing.T) {
		dir := t.TempDir()
		seg1Flipped := bytes.Clone(seg1)
		seg1Flipped[walHeader+3] ^= 0x01
		writeSegments(t, dir, seg0, seg1Flipped, make([]byte, 4096))
		s, err := Open(Options{Dir: dir, SyncWrites: true})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		s.Close()
	})
}

// copyFiles copies the regular files of src (not its subdirectories)
// into dst, replacing what dst holds.
func copyFiles(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	copyDir(t, src, dst)
}

// TestBadgerLostUnsyncedWrites: Badger runs unsynced behind the log, so
// after a power failure its files may be as they were at the last
// checkpoint while the log holds every write since. Opened so, the store
// is what it was: keys released since stay released (not resurrected from
// Badger's older files), reservations come back in doubt, commits and
// in-doubt marks are there.
func TestBadgerLostUnsyncedWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// No background checkpoints: the test decides what Badger has synced.
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	res := func(tok string) store.Reservation {
		return store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	resp := func(k string) store.Response {
		return store.Response{Status: 201, Body: []byte("answer of " + k), BodyStored: true}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	reserve := func(k string) {
		t.Helper()
		rec, err := s.Reserve(ctx, k, res("tok-"+k))
		if err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v; want a new reservation", k, rec, err)
		}
	}
	// Before the checkpoint: keys that later change.
	for _, k := range []string{"pay/-/old-released", "pay/-/old-committed", "pay/-/old-doubted", "pay/-/old-kept"} {
		reserve(k)
	}
	must(s.Commit(ctx, "pay/-/old-released", "tok-pay/-/old-released", resp("x"), time.Hour))
	must(s.Commit(ctx, "pay/-/old-kept", "tok-pay/-/old-kept", resp("pay/-/old-kept"), time.Hour))
	reserve("pay/-/sync") // a synced write after the commits: applied
	must(s.checkpoint())
	snapshot := filepath.Join(t.TempDir(), "badger-at-checkpoint")
	copyDir(t, dir, snapshot) // Badger's files, durable up to here

	// After the checkpoint: in Badger's memory and unsynced files, and in
	// the log.
	must(s.Release(ctx, "pay/-/old-released", "tok-pay/-/old-released")) // not the owner: it is completed
	must(s.Release(ctx, "pay/-/old-doubted", "tok-pay/-/old-doubted"))
	reserve("pay/-/old-doubted") // reserved again, left in flight
	must(s.Commit(ctx, "pay/-/old-committed", "tok-pay/-/old-committed", resp("pay/-/old-committed"), time.Hour))
	reserve("pay/-/new-inflight")
	// A checkpoint that cut the log but crashed before Badger was synced:
	// the replay runs across both segments.
	s.w.exclusive.Lock()
	_, err = s.w.wal.cut()
	s.w.exclusive.Unlock()
	must(err)
	reserve("pay/-/new-committed")
	must(s.Commit(ctx, "pay/-/new-committed", "tok-pay/-/new-committed", resp("pay/-/new-committed"), time.Hour))
	reserve("pay/-/new-released")
	must(s.Release(ctx, "pay/-/new-released", "tok-pay/-/new-released"))
	reserve("pay/-/new-doubted")
	must(s.MarkInDoubt(ctx, "pay/-/new-doubted", "tok-pay/-/new-doubted", time.Hour))
	must(s.ScheduleLookup(ctx, "pay/-/new-doubted", time.Minute))
	reserve("pay/-/last") // synced, after everything above
	keys := []string{"pay/-/old-released", "pay/-/old-committed", "pay/-/old-doubted", "pay/-/old-kept", "pay/-/sync",
		"pay/-/new-inflight", "pay/-/new-committed", "pay/-/new-released", "pay/-/new-doubted", "pay/-/last"}
	want := map[string]*store.Record{}
	for _, k := range keys {
		rec, err := s.Get(ctx, k)
		must(err)
		if rec != nil && rec.State == store.StateInFlight {
			rec.State, rec.LeaseExpiresAt = store.StateInDoubt, time.Time{} // a crash ends the process
		}
		want[k] = rec
	}
	// The crash: Badger's files as at the checkpoint, the log as it is.
	crashed := filepath.Join(t.TempDir(), "crashed")
	copyFiles(t, snapshot, crashed)
	copyDir(t, filepath.Join(dir, walDirName), filepath.Join(crashed, walDirName))

	r, err := Open(Options{Dir: crashed, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open after losing Badger's unsynced writes: %v", err)
	}
	defer r.Close()
	for _, k := range keys {
		got, err := r.Get(ctx, k)
		must(err)
		if desc(got) != desc(want[k]) {
			t.Errorf("%s after the crash = %s, want %s", k, desc(got), desc(want[k]))
		}
	}
	due, err := r.Unscheduled(ctx, "pay/", 100)
	must(err)
	for _, k := range due {
		if k == "pay/-/new-doubted" {
			t.Errorf("Unscheduled lists %s, whose lookup was scheduled before the crash", k)
		}
	}
}

// desc describes a record for comparison; "none" for nil.
func desc(r *store.Record) string {
	if r == nil {
		return "none"
	}
	body := ""
	if r.Response != nil {
		body = string(r.Response.Body)
	}
	return fmt.Sprintf("{%v token %s expires %d body %q}", r.State, r.Token, r.ExpiresAt.Unix(), body)
}

// TestWALFailureFailsBatchAndBreaksLog: a failed write to the log fails
// the batch (applied, maybe not durable: the caller gets an error, as for
// a failed sync), and every later write fails too, as the log's tail is
// unknown; reopened, the store serves again with what was written.
func TestWALFailureFailsBatchAndBreaksLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := store.Reservation{Token: "tok", Lease: time.Minute, TTL: time.Hour}
	if _, err := s.Reserve(ctx, "pay/-/before", res); err != nil {
		t.Fatal(err)
	}
	s.w.wal.active().f.Close() // the next write fails (EBADF), as on a failing disk
	if _, err := s.Reserve(ctx, "pay/-/failed", res); err == nil {
		t.Fatal("Reserve with a failing log succeeded, want an error")
	}
	if _, err := s.Reserve(ctx, "pay/-/later", res); err == nil || !strings.Contains(err.Error(), "reservation log") {
		t.Errorf("Reserve after the log failed = %v, want its error", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatalf("reopen after the log failed: %v", err)
	}
	defer s.Close()
	if rec, err := s.Get(ctx, "pay/-/before"); err != nil || rec == nil || rec.State != store.StateInDoubt {
		t.Errorf("Get(before) after the reopen = %+v, %v; want it in doubt", rec, err)
	}
	if rec, err := s.Reserve(ctx, "pay/-/after", res); err != nil || rec != nil {
		t.Errorf("Reserve after the reopen = %+v, %v; want a new reservation", rec, err)
	}
}

// TestCheckpointEmptiesLog: a checkpoint leaves only the active segment,
// and the store reopens with its keys whether or not the log was
// checkpointed.
func TestCheckpointEmptiesLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 50 {
		if _, err := s.Reserve(ctx, fmt.Sprintf("pay/-/k%d", i), store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	s.w.exclusive.Lock()
	segs, records := len(s.w.wal.segs), s.w.wal.records
	s.w.exclusive.Unlock()
	if segs != 1 || records {
		t.Errorf("after a checkpoint: %d segments, active one holds records %v; want 1, false", segs, records)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 50 {
		if rec, err := r.Get(ctx, fmt.Sprintf("pay/-/k%d", i)); err != nil || rec == nil {
			t.Fatalf("k%d after the reopen = %v, %v", i, rec, err)
		}
	}
}

// TestSegmentFillsAndRotates: a log that fills its segment goes on in a
// new one; the full one is checkpointed away, and every write is there
// after a reopen.
func TestSegmentFillsAndRotates(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := bytes.Repeat([]byte("b"), 60<<10)
	n := int(2 * walSegmentSize / int64(len(body)))
	for i := range n {
		k := fmt.Sprintf("pay/-/k%d", i)
		if _, err := s.Reserve(ctx, k, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, "t", store.Response{Status: 200, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Reserve(ctx, "pay/-/last", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range n {
		rec, err := r.Get(ctx, fmt.Sprintf("pay/-/k%d", i))
		if err != nil || rec == nil || rec.State != store.StateCompleted || len(rec.Response.Body) != len(body) {
			t.Fatalf("k%d after the reopen = %+v, %v; want it completed", i, rec, err)
		}
	}
}

// TestRecycledSegmentsReplay: segments are recycled (their older records
// left in place) many times over; a crash that leaves Badger as at a
// checkpoint and the log as it is still opens, across recycled segments
// whose leftovers follow the new records, with every key as it was.
func TestRecycledSegmentsReplay(t *testing.T) {
	defer func(size int64) { walSegmentSize = size }(walSegmentSize)
	walSegmentSize = 16 << 10 // a few dozen writes per segment
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			k := fmt.Sprintf("pay/-/k%d", i)
			if _, err := s.Reserve(ctx, k, res); err != nil {
				t.Fatal(err)
			}
			if i%3 == 0 {
				if err := s.Release(ctx, k, "t"); err != nil {
					t.Fatal(err)
				}
				continue
			}
			// Bodies of many sizes: the new records do not line up with
			// the leftovers of a recycled segment.
			body := bytes.Repeat([]byte("b"), i*7%97)
			if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := range 10 {
		write(round*100, round*100+100)
		if err := s.checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := filepath.Join(t.TempDir(), "badger")
	copyDir(t, dir, snapshot)
	// Segments cut part-full (checkpoints that crashed before Badger was
	// synced): the recycled one the log is in holds leftovers of its
	// earlier use past its new records.
	for from := 1000; from < 1300; from += 50 {
		write(from, from+50)
		s.w.exclusive.Lock()
		_, err := s.w.wal.cut()
		s.w.exclusive.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Reserve(ctx, "pay/-/last", res); err != nil {
		t.Fatal(err)
	}
	s.w.wal.mu.Lock()
	recycled := s.w.wal.recycled
	s.w.wal.mu.Unlock()
	if recycled == 0 {
		t.Fatal("no segment was recycled")
	}
	crashed := filepath.Join(t.TempDir(), "crashed")
	copyFiles(t, snapshot, crashed)
	copyDir(t, filepath.Join(dir, walDirName), filepath.Join(crashed, walDirName))
	r, err := Open(Options{Dir: crashed, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open over recycled segments: %v", err)
	}
	defer r.Close()
	for i := range 1300 {
		k := fmt.Sprintf("pay/-/k%d", i)
		got, err := r.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		want := "completed"
		if i%3 == 0 {
			want = "none"
		}
		if g := recState(got); g != want {
			t.Errorf("%s after the crash = %s, want %s", k, g, want)
		}
	}
}

func recState(r *store.Record) string {
	if r == nil {
		return "none"
	}
	return string(r.State)
}

var _ = errors.Is

// FuzzWALSegment: reading any bytes as a segment never panics nor reads
// past them; every record it accepts re-frames to the same bytes, and its
// payload either decodes into entries that re-encode to it or is refused.
// Seeds: testdata/fuzz/FuzzWALSegment.
func FuzzWALSegment(f *testing.F) {
	seg, offs := testSegment(512, 1, "a", "bb", "ccc")
	f.Add(seg[:offs[3]+8], uint64(1))
	f.Add(seg[:offs[2]+5], uint64(1))
	f.Add(seg, uint64(2))
	f.Fuzz(func(t *testing.T, data []byte, seq uint64) {
		next, end, _, err := scanSegment(data, seq, func(s uint64, payload []byte) error {
			var r walRecorder
			r.reset()
			derr := decodeRecord(payload, func(e walEntry) error {
				if e.kind == walDelete {
					r.del(e.key)
				} else {
					r.set(e.key, e.val, e.meta, e.expiresAt)
				}
				return nil
			})
			if derr != nil {
				if !errors.Is(derr, errBadPayload) {
					t.Fatalf("decodeRecord: %v, want errBadPayload", derr)
				}
				return nil
			}
			if got := r.buf[walHeader:]; !bytes.Equal(got, payload) {
				// Varints have more than one encoding: only a decoding
				// that re-encodes differently must still decode the same.
				again := 0
				if err := decodeRecord(got, func(walEntry) error { again++; return nil }); err != nil || again != r.entries {
					t.Fatalf("re-encoded payload does not decode the same: %v", err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("scanSegment: %v", err)
		}
		// The bytes as one record's payload, framed: decoding them must
		// refuse or accept without a panic.
		framed := frameRecord(append(make([]byte, walHeader), data...), seq)
		if len(data) > 0 {
			if n, _, _, _ := scanSegment(framed, seq, func(_ uint64, p []byte) error {
				if err := decodeRecord(p, func(walEntry) error { return nil }); err != nil && !errors.Is(err, errBadPayload) {
					t.Fatalf("decodeRecord: %v", err)
				}
				return nil
			}); n != seq+1 {
				t.Fatalf("a framed record of %d bytes was not read", len(data))
			}
		}
		if end < 0 || end > len(data) || next < seq {
			t.Fatalf("scanSegment = next %d end %d for %d bytes from seq %d", next, end, len(data), seq)
		}
		// The accepted prefix reads the same on its own.
		again, end2, _, _ := scanSegment(data[:end], seq, nil)
		if again != next || end2 != end {
			t.Fatalf("prefix [:%d] reads to seq %d end %d, want %d %d", end, again, end2, next, end)
		}
	})
}
