package badger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Review of issue 26 (replay by applied sequence): the applied sequence
// number is read from whatever of Badger's files reached the disk, and the
// replay skips every record at or below it. That is right only when
// Badger's files on disk hold a prefix of its commits. Badger writes each
// commit into more than one unsynced mapping (the value log, then the
// memtable's log; each memtable its own log), and the kernel writes their
// pages back in any order, so after a power cut Badger can hold a later
// batch (its applied number) without an earlier one, which the log holds,
// synced. A replay that skipped every record up to Badger's applied number
// lost them; the replay decides key by key instead.

func globOne(t *testing.T, dir, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPowerCutValueLogBehindTreeKeepsSyncedAnswer: a commit whose
// answer is 192 bytes or more goes to Badger's value log, and only a
// pointer to it to the memtable's log. Its client gets the 201; a later
// reservation's fdatasync makes the commit durable in the reservation
// log. The power goes before the 30 s checkpoint: the memtable log's page
// (with the pointer and the applied number) was written back, the value
// log's page was not. The answer must come back from the log (a replay
// that skipped the commit, as Badger "held" it, lost it: 503 for its TTL).
func TestPowerCutValueLogBehindTreeKeepsSyncedAnswer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	res := func(tok string) store.Reservation {
		return store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	// Something in the value log, synced by a checkpoint.
	if _, err := s.Reserve(ctx, "pay/-/old", res("t0")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "pay/-/old", "t0", store.Response{Status: 201, Body: []byte(strings.Repeat("o", 1024)), BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	vlogs := globOne(t, dir, "*.vlog")
	if len(vlogs) == 0 {
		t.Fatal("no value-log file")
	}
	vsnap := t.TempDir()
	for _, v := range vlogs {
		copyFile(t, v, filepath.Join(vsnap, filepath.Base(v))) // as on disk after the checkpoint
	}

	const k = "pay/-/charge"
	body := []byte(`{"charge":"ch_1","pad":"` + strings.Repeat("x", 600) + `"}`)
	if _, err := s.Reserve(ctx, k, res("t")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The client has its 201. A later reservation is forwarded: its sync
	// covers the commit's record in the log.
	if _, err := s.Reserve(ctx, "pay/-/later", res("t2")); err != nil {
		t.Fatal(err)
	}

	// The power cut: the log as synced, the memtable's log written back,
	// the value log's new page not.
	crashed := crashCopy(t, dir, filepath.Join(dir, walDirName))
	for _, v := range globOne(t, vsnap, "*.vlog") {
		copyFile(t, v, filepath.Join(crashed, filepath.Base(v)))
	}

	r, err := Open(Options{Dir: crashed, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open after the power cut: %v", err)
	}
	defer r.Close()
	got, err := r.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%s) after the power cut: %v; want the 201 the client got (its commit was synced in the log before the cut)", k, err)
	}
	if want := "completed " + string(body); stateBody(got) != want {
		t.Errorf("Get(%s) after the power cut = %.40s…, want the completed answer", k, stateBody(got))
	}
}

// TestPowerCutOlderMemtableTailKeepsSyncedReservation: each
// memtable has its own log (NNNNN.mem). When one fills, the next takes the
// writes while the full one is flushed into a table; until that table is
// in the MANIFEST the full one's log is all Badger has of it, unsynced.
// The power goes in that window, the kernel having written back the new
// memtable log's pages (holding the newest applied number) and not the
// last pages of the full one. Badger opens with a hole; the reservations
// in it, synced and forwarded, must come back from the log (a replay that
// skipped every record up to the newest applied number lost them, and
// their retries were forwarded again: charged twice).
//
// The window is made wide here by a file in the way of the flush's table
// (Badger retries the flush every second); the full memtable's log as the
// disk has it is a copy taken before its last writes.
func TestPowerCutOlderMemtableTailKeepsSyncedReservation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(dir, "000001.sst")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.Remove(blocker)
		s.Close()
	}()
	ctx := context.Background()
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	pad := strings.Repeat("k", 8<<10) // long keys fill the 1 MiB memtable quickly
	key := func(phase string, i int) string { return fmt.Sprintf("pay/-/%s-%d-%s", phase, i, pad) }
	mems := globOne(t, dir, "*.mem")
	if len(mems) != 1 {
		t.Fatalf("memtable logs at start: %v", mems)
	}
	first := mems[0]
	for i := range 20 {
		if _, err := s.Reserve(ctx, key("a", i), res); err != nil {
			t.Fatal(err)
		}
	}
	early := filepath.Join(t.TempDir(), "early.mem")
	copyFile(t, first, early) // the full memtable's log as the disk will have it
	var hole []string
	for i := 0; len(globOne(t, dir, "*.mem")) < 2; i++ {
		if i > 1000 {
			t.Fatal("the memtable never filled")
		}
		k := key("b", i)
		if _, err := s.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		hole = append(hole, k)
	}
	for i := range 5 {
		if _, err := s.Reserve(ctx, key("c", i), res); err != nil {
			t.Fatal(err)
		}
	}

	crashed := crashCopy(t, dir, filepath.Join(dir, walDirName))
	os.Remove(filepath.Join(crashed, "000001.sst"))
	copyFile(t, early, filepath.Join(crashed, filepath.Base(first)))

	r, err := Open(Options{Dir: crashed, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open after the power cut: %v", err)
	}
	defer r.Close()
	lost := 0
	for _, k := range hole {
		got, err := r.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d reservations synced (and forwarded) before the power cut are gone after it: their retries would be forwarded again", lost, len(hole))
	}
}

// TestOpenOfStoreInUseRemovesNoFile: a second process opening a
// store directory another one holds (a replica being replaced on the same
// volume: its Guard tries every second) is refused by Badger's lock, but
// Open removed the empty memtable logs and value-log files before taking
// it. Badger creates those files and sizes them after: one the running
// store has just created is empty for that moment, and removed, its
// writes go to a file nobody will find (not synced by checkpoints, gone
// at the next open). Open must leave a directory in use alone.
func TestOpenOfStoreInUseRemovesNoFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Stands for the file the running store just created, not sized yet.
	fresh := filepath.Join(dir, "000042.vlog")
	if err := os.WriteFile(fresh, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(fresh)
	if other, err := Open(Options{Dir: dir, SyncWrites: true}); err == nil {
		other.Close()
		t.Fatal("a second Open of a directory in use succeeded")
	} else if !inUse(err) {
		t.Errorf("second Open: %v; want an error the Guard reads as in use (tried again every second)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("the refused Open changed the running store's directory: %v", err)
	}
}

// copyTree copies the regular files under src to dst, recursively.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		if !d.Type().IsRegular() || d.Name() == "LOCK" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUnfinishedQuarantineRefusesOpen: a quarantine interrupted
// after it moved the later segments (the CLI killed) leaves the damaged
// segment whose damage only a later segment proved: the degraded proxy
// sees the files change and opens the store (a torn tail now), and its new
// log's first segment takes the number after the damaged one, the name of
// a segment the quarantine moved. The proxy crashes; `store quarantine`
// is run again and resumes the old plan blindly: it moves the new log's
// segment into the quarantine (over the original it had set aside) and
// puts the old kept records back. The reservations synced since the
// reopen are gone (retries forwarded again), and the original segment,
// kept "byte for byte" for the operator, is overwritten.
func TestUnfinishedQuarantineRefusesOpen(t *testing.T) {
	defer func(size int64) { walSegmentSize = size }(walSegmentSize)
	walSegmentSize = 16 << 10
	ctx := context.Background()
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}

	src := t.TempDir()
	s, err := Open(Options{Dir: src, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	badgerAtOpen := filepath.Join(t.TempDir(), "badger")
	copyDir(t, src, badgerAtOpen)
	for i := range 1200 {
		if _, err := s.Reserve(ctx, fmt.Sprintf("pay/-/old%d", i), res); err != nil {
			t.Fatal(err)
		}
	}
	logDir := filepath.Join(t.TempDir(), "log")
	copyDir(t, filepath.Join(src, walDirName), logDir)
	s.Close()
	nums, err := walSegments(logDir)
	if err != nil || len(nums) < 3 {
		t.Fatalf("segments %v, %v; want at least 3", nums, err)
	}
	// Damage the last record of the second segment: only the third
	// segment's first record proves it was synced.
	name := filepath.Join(logDir, segmentName(nums[1]))
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	last, off := int64(-1), int64(0)
	for off+walHeader <= int64(len(data)) {
		n := int64(uint32(data[off]) | uint32(data[off+1])<<8 | uint32(data[off+2])<<16 | uint32(data[off+3])<<24)
		if n == 0 {
			break
		}
		last, off = off, off+walHeader+n
	}
	data[last+walHeader+2] ^= 0x10
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	originals := map[string]string{}
	for _, n := range nums[1:] {
		b, _ := os.ReadFile(filepath.Join(logDir, segmentName(n)))
		originals[segmentName(n)] = string(b)
	}

	dir := crashCopy(t, badgerAtOpen, logDir)
	if _, err := Open(Options{Dir: dir, SyncWrites: true}); !errors.Is(err, errLogDamaged) {
		t.Fatalf("Open = %v, want ErrLogDamaged", err)
	}
	quarantineStep = func(step string) error {
		if step == "moved" {
			return errors.New("killed")
		}
		return nil
	}
	_, err = Quarantine(dir, time.Now())
	quarantineStep = nil
	if err == nil {
		t.Fatal("the interrupted quarantine did not stop")
	}

	// The Guard's next try. Opened (the damage reads as a torn tail now),
	// the store serves, then crashes: Badger as at the reopen, the log as
	// synced. Refused, the operator finishes the quarantine first.
	target := dir
	var fresh []string
	if r, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1}); err == nil {
		badgerAtReopen := filepath.Join(t.TempDir(), "badger2")
		copyDir(t, dir, badgerAtReopen) // synced by the replay
		for i := range 5 {
			k := fmt.Sprintf("pay/-/new%d", i)
			if _, err := r.Reserve(ctx, k, res); err != nil {
				t.Fatal(err)
			}
			fresh = append(fresh, k) // forwarded
		}
		target = filepath.Join(t.TempDir(), "crashed")
		copyDir(t, badgerAtReopen, target)
		copyDir(t, filepath.Join(dir, walDirName), filepath.Join(target, walDirName))
		copyTree(t, filepath.Join(dir, quarantineDirName), filepath.Join(target, quarantineDirName))
		r.Close()
	} else if !strings.Contains(err.Error(), "quarantine") {
		t.Fatalf("Open after the interrupted quarantine: %v; want it opened, or refused until the quarantine is finished", err)
	}

	// The operator finishes the quarantine.
	q, err := Quarantine(target, time.Now())
	if err != nil {
		t.Fatalf("Quarantine (resumed): %v", err)
	}
	for base, want := range originals {
		got, err := os.ReadFile(filepath.Join(q.Dir, base))
		if err != nil || string(got) != want {
			t.Errorf("quarantined %s: %d bytes, %v; want the original segment byte for byte", base, len(got), err)
		}
	}
	o, err := Open(Options{Dir: target, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open after the resumed quarantine: %v", err)
	}
	defer o.Close()
	for _, k := range fresh {
		got, err := o.Get(ctx, k)
		if err != nil || got == nil {
			t.Errorf("%s, reserved (synced, forwarded) after the reopen: %+v, %v; want it kept (in doubt)", k, got, err)
		}
	}
}

// TestPowerCutFlushedTableAheadOfValueLog: the same loss as
// TestPowerCutValueLogBehindTreeKeepsSyncedAnswer, without any luck in
// what the kernel wrote back: Badger syncs each table it flushes a
// memtable into (msync, then the MANIFEST), and that table holds the
// applied number and pointers into the value log, which nothing syncs
// until the next checkpoint. A power cut before it, nothing unsynced
// surviving, leaves the flushed table: the answer the value log lost must
// come back from the log.
func TestPowerCutFlushedTableAheadOfValueLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1, noCompactions: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	res := func(tok string) store.Reservation {
		return store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	if _, err := s.Reserve(ctx, "pay/-/old", res("t0")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "pay/-/old", "t0", store.Response{Status: 201, Body: []byte(strings.Repeat("o", 1024)), BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	vsnap := t.TempDir()
	for _, v := range globOne(t, dir, "*.vlog") {
		copyFile(t, v, filepath.Join(vsnap, filepath.Base(v)))
	}
	const k = "pay/-/charge"
	body := []byte(`{"charge":"ch_1","pad":"` + strings.Repeat("x", 600) + `"}`)
	if _, err := s.Reserve(ctx, k, res("t")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, k, "t", store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	mems := globOne(t, dir, "*.mem")
	active := mems[len(mems)-1]
	// Later requests, forwarded (synced), until the memtable holding the
	// commit is flushed into a table and its log deleted.
	pad := strings.Repeat("k", 8<<10)
	for i := 0; ; i++ {
		if _, err := os.Stat(active); err != nil {
			break
		}
		if i > 2000 {
			t.Fatal("the memtable was never flushed")
		}
		if _, err := s.Reserve(ctx, fmt.Sprintf("pay/-/later-%d-%s", i, pad), res("t2")); err != nil {
			t.Fatal(err)
		}
		if i > 200 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if len(globOne(t, dir, "*.sst")) == 0 {
		t.Fatal("no table flushed")
	}
	// The power cut: what Badger synced (tables, MANIFEST), the log as
	// synced; the value log as at the checkpoint, no memtable log.
	crashed := crashCopy(t, dir, filepath.Join(dir, walDirName))
	for _, m := range globOne(t, crashed, "*.mem") {
		os.Remove(m)
	}
	for _, v := range globOne(t, crashed, "*.vlog") {
		os.Remove(v)
	}
	for _, v := range globOne(t, vsnap, "*.vlog") {
		copyFile(t, v, filepath.Join(crashed, filepath.Base(v)))
	}
	r, err := Open(Options{Dir: crashed, SyncWrites: true})
	if err != nil {
		t.Fatalf("Open after the power cut: %v", err)
	}
	defer r.Close()
	got, err := r.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%s) after the power cut: %v; want the 201 the client got (synced in the log before the cut)", k, err)
	}
	if want := "completed " + string(body); stateBody(got) != want {
		t.Errorf("Get(%s) after the power cut = %.40s…, want the completed answer", k, stateBody(got))
	}
}
