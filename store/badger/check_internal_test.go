package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// damagedLog is a store's Badger files as at open and its log as the store
// wrote it over several segments, with one byte flipped in a record in the
// middle of the second segment: a store Open refuses. It returns the
// Badger files' and the log's directories, and the damaged segment's
// number.
func damagedLog(t *testing.T) (badgerDir, logDir string, damaged uint64) {
	t.Helper()
	defer func(size int64) { walSegmentSize = size }(walSegmentSize)
	walSegmentSize = 16 << 10
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	badgerDir = filepath.Join(t.TempDir(), "badger")
	copyDir(t, dir, badgerDir)
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}
	for i := range 600 {
		k := fmt.Sprintf("pay/-/k%d", i)
		if _, err := s.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: []byte("answer"), BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	logDir = filepath.Join(t.TempDir(), "log")
	copyDir(t, filepath.Join(dir, walDirName), logDir)
	s.Close()
	nums, err := walSegments(logDir)
	if err != nil || len(nums) < 4 {
		t.Fatalf("segments %v, %v; want at least 4", nums, err)
	}
	damaged = nums[1]
	name := filepath.Join(logDir, segmentName(damaged))
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/3] ^= 0x04 // inside a record: the segment is full of them
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return badgerDir, logDir, damaged
}

// treeOf maps every regular file under dir (relative path) to its bytes.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[rel] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// keysBefore returns the keys set by the log's records before its first
// damage, as the scanner reads them.
func keysBefore(t *testing.T, logDir string) map[string]bool {
	t.Helper()
	nums, err := walSegments(logDir)
	if err != nil {
		t.Fatal(err)
	}
	files, closeAll, err := openSegments(logDir, nums)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	scan, err := scanLog(files, 0)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, sp := range scan.spans {
		data := make([]byte, sp.to-sp.from)
		if _, err := files[sp.seg].r.ReadAt(data, sp.from); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := scanSegment(data, sp.first, func(_ uint64, p []byte) error {
			return decodeRecord(p, func(e walEntry) error {
				if e.kind == walSet && !strings.HasPrefix(string(e.key), "\x00") {
					keys[string(e.key)] = true
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestCheckAndQuarantine: Check reports the damage (segment, offset,
// sequence) and changes nothing; Quarantine moves the damaged segment and
// every later one aside, byte for byte, leaves in the damaged one's place
// its records before the damage, and the store then opens with every key
// written before the damage and none after. Run again, it does nothing.
func TestCheckAndQuarantine(t *testing.T) {
	badgerDir, logDir, damaged := damagedLog(t)
	dir := crashCopy(t, badgerDir, logDir)
	logBefore := treeOf(t, filepath.Join(dir, walDirName))
	if _, err := openKeys(t, dir, nil); !errors.Is(err, errLogDamaged) {
		t.Fatalf("Open = %v, want ErrLogDamaged", err)
	}
	if !mapsEqual(logBefore, treeOf(t, filepath.Join(dir, walDirName))) {
		t.Error("the refused Open changed the log")
	}
	before := treeOf(t, dir)

	rep, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	damagedPath := filepath.Join(dir, walDirName, segmentName(damaged))
	if rep.OK() || len(rep.Damage) != 1 || rep.Damage[0].Segment != damagedPath || rep.Damage[0].Offset <= 0 || rep.Damage[0].Seq == 0 {
		t.Fatalf("Check = %+v, want one damage in %s", rep, damagedPath)
	}
	if rep.Records == 0 || rep.SetAside == 0 {
		t.Errorf("Check counts %d records before the damage and %d after; want both", rep.Records, rep.SetAside)
	}
	if after := treeOf(t, dir); !mapsEqual(before, after) {
		t.Error("Check changed the store's files")
	}

	now := time.Date(2026, 12, 3, 17, 4, 5, 0, time.UTC)
	q, err := Quarantine(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, quarantineDirName, "20261203T170405Z"); q.Dir != want {
		t.Errorf("quarantined into %s, want %s", q.Dir, want)
	}
	nums, _ := walSegments(logDir)
	var moved []string
	for _, n := range nums {
		if n >= damaged {
			moved = append(moved, filepath.Join(dir, walDirName, segmentName(n)))
		}
	}
	if !slices.Equal(q.Segments, moved) || q.Kept != rep.Records || q.SetAside != rep.SetAside || q.Resumed {
		t.Errorf("Quarantine = %+v, want segments %v, kept %d, set aside %d", q, moved, rep.Records, rep.SetAside)
	}
	for _, p := range moved {
		orig := before[filepath.Join(walDirName, filepath.Base(p))]
		got, err := os.ReadFile(filepath.Join(q.Dir, filepath.Base(p)))
		if err != nil || string(got) != orig {
			t.Errorf("%s in quarantine: %d bytes, %v; want the original's %d bytes", filepath.Base(p), len(got), err, len(orig))
		}
	}
	left, _ := walSegments(filepath.Join(dir, walDirName))
	if want := []uint64{nums[0], damaged}; !slices.Equal(left, want) {
		t.Errorf("segments left in the log %v, want %v", left, want)
	}
	kept, _ := os.ReadFile(damagedPath)
	if int64(len(kept)) != rep.Damage[0].Offset+walHeader || !bytes.Equal(kept[:rep.Damage[0].Offset], []byte(before[filepath.Join(walDirName, segmentName(damaged))])[:rep.Damage[0].Offset]) {
		t.Errorf("the damaged segment's place holds %d bytes, want its %d bytes before the damage and an end mark", len(kept), rep.Damage[0].Offset)
	}
	if rep, err := Check(dir); err != nil || !rep.OK() {
		t.Errorf("Check after the quarantine = %+v, %v; want no damage", rep, err)
	}

	// The store opens with every key written before the damage.
	want := keysBefore(t, logDir)
	all := keysOf(0, 0)[:0]
	for i := range 600 {
		all = append(all, fmt.Sprintf("pay/-/k%d", i))
	}
	present, err := openKeys(t, dir, all)
	if err != nil {
		t.Fatalf("Open after the quarantine: %v", err)
	}
	if len(present) != len(want) || len(want) == 0 || len(want) == len(all) {
		t.Errorf("%d keys after the quarantine, want the %d written before the damage (of %d)", len(present), len(want), len(all))
	}
	for _, k := range present {
		if !want[k] {
			t.Errorf("%s is there, written after the damage", k)
		}
	}
	if q, err := Quarantine(dir, now.Add(time.Minute)); err != nil || q.Dir != "" {
		t.Errorf("Quarantine again = %+v, %v; want nothing done", q, err)
	}
}

// TestCheckReportsEveryDamage: two damaged places, in two segments, are
// both reported, each with its segment, offset and sequence number, and
// the records before the first are counted.
func TestCheckReportsEveryDamage(t *testing.T) {
	t.Parallel()
	recs := syncedRun(1, 40, 0, 100)
	a, aoffs := segmentOf(1<<13, recs[:20]...)
	b, boffs := segmentOf(1<<13, recs[20:]...)
	a[aoffs[7]+walHeader+30] ^= 0x02  // sequence 8
	b[boffs[12]+walHeader+30] ^= 0x02 // sequence 33
	dir := t.TempDir()
	writeSegments(t, dir, a, b)
	rep, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	type place struct {
		seg string
		off int64
		seq uint64
	}
	want := []place{{segmentName(0), int64(aoffs[7]), 8}, {segmentName(1), int64(boffs[12]), 33}}
	var got []place
	for _, d := range rep.Damage {
		got = append(got, place{filepath.Base(d.Segment), d.Offset, d.Seq})
	}
	if !slices.Equal(got, want) || rep.Records != 7 || rep.Segments != 2 {
		t.Errorf("Check = %+v; want damage at %v, 7 records before it, 2 segments", rep, want)
	}
	if rep.SetAside != 31 { // 9..40 but the second damaged one
		t.Errorf("Check counts %d records after the damage, want 31", rep.SetAside)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestQuarantineRefusesOpenStore: while a process holds the store open
// (Badger's directory lock), Quarantine refuses and moves nothing.
func TestQuarantineRefusesOpenStore(t *testing.T) {
	badgerDir, logDir, _ := damagedLog(t)
	dir := crashCopy(t, badgerDir, logDir)
	before := treeOf(t, dir)
	db, err := bdg.Open(bdg.DefaultOptions(dir).WithLogger(nil).WithValueLogFileSize(valueLogFileSize))
	if err != nil {
		t.Fatal(err)
	}
	defer func(w time.Duration) { quarantineLockWait = w }(quarantineLockWait)
	quarantineLockWait = 200 * time.Millisecond
	_, err = Quarantine(dir, time.Now())
	if !errors.Is(err, errInUse) {
		t.Errorf("Quarantine of an open store = %v, want it refused", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	after := treeOf(t, dir)
	for name, b := range before {
		if strings.HasPrefix(name, walDirName) && after[name] != b {
			t.Errorf("%s changed by a refused quarantine", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, quarantineDirName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused quarantine made its directory (%v)", err)
	}
	if _, err := Quarantine(dir, time.Now()); err != nil {
		t.Errorf("Quarantine once the store is closed: %v", err)
	}
}

// TestQuarantineResumes: a quarantine interrupted after any of its steps
// (a crash) is finished by the next run, to the same files as one that ran
// through, and the store opens.
func TestQuarantineResumes(t *testing.T) {
	badgerDir, logDir, damaged := damagedLog(t)
	now := time.Date(2026, 12, 3, 17, 4, 5, 0, time.UTC)
	ref := crashCopy(t, badgerDir, logDir)
	if _, err := Quarantine(ref, now); err != nil {
		t.Fatal(err)
	}
	want := treeOf(t, ref)
	nums, _ := walSegments(logDir)
	var firstLater string
	for _, n := range nums {
		if n > damaged {
			firstLater = segmentName(n)
			break
		}
	}
	defer func() { quarantineStep = nil }()
	for _, stop := range []string{"planned", "moved " + firstLater, "moved", "kept"} {
		t.Run(stop, func(t *testing.T) {
			dir := crashCopy(t, badgerDir, logDir)
			crash := errors.New("crash")
			quarantineStep = func(s string) error {
				if s == stop {
					return crash
				}
				return nil
			}
			if _, err := Quarantine(dir, now); !errors.Is(err, crash) {
				t.Fatalf("Quarantine interrupted at %q = %v", stop, err)
			}
			quarantineStep = nil
			q, err := Quarantine(dir, now.Add(time.Hour))
			if err != nil || !q.Resumed {
				t.Fatalf("Quarantine after the interruption = %+v, %v; want it resumed", q, err)
			}
			got := treeOf(t, dir)
			plan := filepath.Join(quarantineDirName, "20261203T170405Z", quarantinePlanName)
			if _, ok := got[plan]; !ok {
				t.Errorf("no %s", plan)
			}
			got[plan] = want[plan] // names the run's own paths
			if !mapsEqual(got, want) {
				var diff []string
				for k := range want {
					if got[k] != want[k] {
						diff = append(diff, k)
					}
				}
				for k := range got {
					if _, ok := want[k]; !ok {
						diff = append(diff, k)
					}
				}
				t.Errorf("files after a resumed quarantine differ from one that ran through: %v", diff)
			}
			if _, err := openKeys(t, dir, nil); err != nil {
				t.Errorf("Open after a resumed quarantine: %v", err)
			}
		})
	}
}
