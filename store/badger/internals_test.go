package badger

// What this package relies on of Badger's internals (v4.9.6), in one
// place. Badger documents none of it; an upgrade may change any of it
// without a word, and then a test below fails. Each entry: the behaviour,
// the code that relies on it, what breaks if it changes, and its test.
//
//  1. File names. A store's directory holds MANIFEST, LOCK, DISCARD,
//     KEYREGISTRY, memtable logs NNNNN.mem, value-log files NNNNNN.vlog
//     and tables NNNNNN.sst, nothing else (beside our idemproxy-wal/).
//     Relied on by checkManifest (*.sst, MANIFEST), removeEmptyLogs
//     (*.mem), createDiscardStats (DISCARD), keepManifestRoom (MANIFEST),
//     syncBadger (*.mem, *.vlog), dirSizes (*.sst, *.vlog), the trimmer
//     (*.sst, *.vlog), waitForSpace (*.sst), copyDir in tests (LOCK).
//     Changed, each of them silently does nothing: no refusal of a
//     directory without its MANIFEST, files not synced at a checkpoint
//     (lost in a power failure), tables made to fail instead of wait.
//     TestBadgerFileNames.
//  2. The directory lock. A second Open of a directory in use fails
//     (LOCK), with an error that says so only in its text ("Another
//     process is using this Badger database"). Relied on by the writer
//     being the only writer (writer.go), the log's replay and the Guard's
//     reopen (it closes before it opens again), and by inUse
//     (degraded.go), which matches the text. Changed, two processes on
//     one directory would each reserve the same key: charged twice; the
//     text changed, a replica replaced on the same volume waits a growing
//     delay to open instead of a second. TestBadgerLocksItsDirectory.
//  3. A commit is in Badger's files when Txn.Commit returns, unsynced:
//     the memtable log (and the value log, for large values) are shared
//     mappings, written in the page cache, which outlives the process.
//     Relied on by Commit (commit.go: an answer goes to its client then)
//     and by docs/operations.md ("A process crash (kill -9) loses
//     nothing"). Changed (a write buffered in the process), kill -9 would
//     lose answers clients got. TestBadgerCommitIsInItsFilesUnsynced.
//  4. How Badger sizes its mapped files: a memtable log is made
//     2 x MemTableSize and a value-log file 2 x ValueLogFileSize by
//     ftruncate, without writing them (sparse), and a value-log file is
//     cut to what it holds when it is closed; DISCARD is 1 MiB, and a
//     zeroed file of that size is taken as new. Relied on by
//     internal/prealloc (it allocates on ftruncate only: a file grown
//     another way would not be backed, and a full disk would be a SIGBUS
//     again), createDiscardStats (discardStatsSize), and the disk figures
//     of docs/operations.md (37 MiB for a new store). Changed, the store
//     may crash on a full disk, or take another amount of disk.
//     TestBadgerSizesItsMappedFiles (internals_linux_test.go:
//     preallocation is Linux's).
//  5. A table is created at its full size and written through its
//     mapping; it ends with its index, the index's length (uint32,
//     big-endian), a checksum and the checksum's length. Relied on by the
//     trimmer (trim_linux.go indexOffset: it keeps only indexes resident).
//     Changed, the trimmer advises the wrong pages out or none: the
//     resident set grows with the keys, or every lookup reads the disk.
//     TestBadgerTableFooter (and TestTrimKeepsOnlyIndexesResident,
//     TestIndexOffsetOfUnwrittenTable).
//  6. A compaction that cannot create one of its tables drops it: the
//     compaction succeeds without it and deletes its input tables, so the
//     keys are gone. Relied on by waitForSpace: tables (*.sst) wait for
//     room instead of failing (internal/prealloc). Changed so that the
//     error is returned, waiting is no longer needed; changed otherwise,
//     it must be looked at again. TestBadgerCompactionDropsAFailedTable.
//  7. A directory with tables but no MANIFEST is opened as a new store,
//     and its tables are deleted. Relied on by checkManifest, which
//     refuses such a directory. Changed (Badger refusing it), the check is
//     redundant. TestBadgerWithoutManifestDeletesTables (and
//     TestOpenRefusesTablesWithoutManifest).
//  8. A memtable log or value-log file of length zero (its ftruncate failed
//     on a full disk, or a power cut took its size) fails the open. Relied on by removeEmptyLogs. Changed, that is
//     redundant. TestBadgerEmptyMemtableLogFailsOpen (and
//     TestOpenWithEmptyMemtableLog, TestOpenWithEmptyValueLog).
//  9. The MANIFEST is appended to in place (same file, growing) with
//     write(2). Relied on by keepManifestRoom (room allocated past its
//     end, so an append on a full disk is never torn). Changed, a full
//     disk may tear it and the store never opens again.
//     TestBadgerAppendsToItsManifest (and TestManifestRoom).
// 10. Value-log garbage collection moves the live values of a file with
//     Badger's own writes (not through the store's writer, so in no
//     segment of the reservation log), and deletes the file only once no
//     iterator opened before is open; with nothing to collect it returns
//     ErrNoRewrite. Relied on by rewriteValueLog (it holds an iterator
//     until the moves are synced) and RunGC (it stops at ErrNoRewrite).
//     Changed, a power failure after a collection can lose answers, or
//     RunGC never stops. TestBadgerValueLogGC (and
//     TestValueLogGCCrashKeepsAnswers).
// 11. An fsync of every *.mem and *.vlog and of the directory
//     (syncBadger; DB.Sync is not called, see there), makes everything
//     committed durable, mappings included: no
//     other file holds committed writes that are not synced by then.
//     Relied on by the log's checkpoints (wal.go): segments are deleted
//     once Badger is synced so. Changed, a power failure after a
//     checkpoint loses reservations: charged twice.
//     TestBadgerSyncCoversEveryCommit (internals_linux_test.go: the
//     power-loss file system is Linux's).
// 12. Conflict detection off (WithDetectConflicts(false)): transactions
//     that read and write the same key both commit. Relied on by the
//     writer, which does not retry ErrConflict (it is the only writer).
//     Changed, every batch could fail. TestBadgerNoConflictDetection.
// 13. DB.Size reports 0, 0 with metrics off. Relied on by Sizes
//     (size.go), which measures the files itself. Changed, nothing breaks;
//     Sizes could use it. TestBadgerSizeWithoutMetrics.
// 14. An entry's ExpiresAt is in unix seconds and an expired entry reads
//     as missing; UserMeta is kept with the entry and read without its
//     value. Relied on by expiry and putAt (a record's TTL is Badger's
//     expiry), List and orphansInDoubt (the state from UserMeta). Changed,
//     records outlive or precede their TTL, or lists show wrong states.
//     TestBadgerExpiryAndUserMeta.
// 15. Values of ValueThreshold bytes or more live in the value log, the
//     tree keeps a pointer. Relied on by Open's layout (valueThreshold).
//     TestAnswersLiveInTheValueLog pins it.
// 16. A Badger whose memtable rotation failed has no memtable: a read
//     panics (recoverably, in the caller), a write makes its write
//     goroutine log.Fatalf. Relied on by commitTxn's probe read and
//     recovered. TestWriteAfterFailedRotation and TestGCAfterFailedRotation
//     pin it.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/fb"
)

// storeOptions returns the Badger options Open uses, for dir.
func storeOptions(t *testing.T, dir string) bdg.Options {
	t.Helper()
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	opts := s.db.Opts()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return opts.WithDir(dir).WithValueDir(dir).WithLogger(nil)
}

// openRaw opens Badger itself in dir with opts, closed when the test ends
// unless the test closed it.
func openRaw(t *testing.T, opts bdg.Options) *bdg.DB {
	t.Helper()
	db, err := bdg.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !db.IsClosed() {
			db.Close()
		}
	})
	return db
}

func set(t *testing.T, db *bdg.DB, k, v []byte) {
	t.Helper()
	if err := db.Update(func(txn *bdg.Txn) error { return txn.Set(k, v) }); err != nil {
		t.Fatal(err)
	}
}

// value reads k from db; nil when it is missing.
func value(t *testing.T, db *bdg.DB, k []byte) []byte {
	t.Helper()
	var v []byte
	err := db.View(func(txn *bdg.Txn) error {
		item, err := txn.Get(k)
		if errors.Is(err, bdg.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func glob(t *testing.T, dir, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

func size(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

var (
	big   = bytes.Repeat([]byte("v"), 4*valueThreshold) // in the value log
	small = []byte("small")                             // in the tree
)

// 1.
func TestBadgerFileNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	set(t, s.db, []byte("big"), big)
	set(t, s.db, []byte("small"), small)
	known := regexp.MustCompile(`^(MANIFEST|LOCK|DISCARD|KEYREGISTRY|\d{5}\.mem|\d{6}\.vlog|\d{6}\.sst|` + walDirName + `)$`)
	check := func(when string, want ...string) {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range ents {
			if !known.MatchString(e.Name()) {
				t.Errorf("%s: Badger's directory holds %s, a file this package does not know", when, e.Name())
			}
			seen[filepath.Ext(e.Name())] = true
			seen[e.Name()] = true
		}
		for _, w := range want {
			if !seen[w] {
				t.Errorf("%s: no %s in Badger's directory (%d entries)", when, w, len(ents))
			}
		}
	}
	check("open", "MANIFEST", "LOCK", "DISCARD", "KEYREGISTRY", ".mem", ".vlog")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed", "MANIFEST", "DISCARD", "KEYREGISTRY", ".vlog", ".sst") // Close flushes the memtable into a table
}

// 2.
func TestBadgerLocksItsDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	openRaw(t, storeOptions(t, dir))
	db, err := bdg.Open(storeOptions(t, dir))
	if err == nil {
		db.Close()
		t.Fatal("a second Open of a directory in use succeeded; want it refused (its LOCK)")
	}
	// Badger wraps the refusal as text: inUse (degraded.go) matches it, so
	// that the Guard tries a directory in use again every second.
	if !strings.Contains(err.Error(), "Another process is using this Badger database") || !inUse(err) {
		t.Errorf("second Open: %q; want Badger's text, which inUse (degraded.go) matches", err)
	}
}

// 3.
func TestBadgerCommitIsInItsFilesUnsynced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openRaw(t, storeOptions(t, dir)) // SyncWrites off, as Open sets it
	set(t, db, []byte("big"), big)
	set(t, db, []byte("small"), small)
	// What a kill -9 leaves: the files as the page cache has them.
	crashed := filepath.Join(t.TempDir(), "crashed")
	copyDir(t, dir, crashed)
	db2 := openRaw(t, storeOptions(t, crashed))
	if v := value(t, db2, []byte("big")); !bytes.Equal(v, big) {
		t.Errorf("a large value committed, in the files as a crash leaves them: %.20q, want it", v)
	}
	if v := value(t, db2, []byte("small")); !bytes.Equal(v, small) {
		t.Errorf("a small value committed, in the files as a crash leaves them: %q, want it", v)
	}
}

// 5.
func TestBadgerTableFooter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openRaw(t, storeOptions(t, dir))
	for i := range 100 {
		set(t, db, fmt.Appendf(nil, "k%03d", i), small)
	}
	if err := db.Close(); err != nil { // flushes the memtable into a table
		t.Fatal(err)
	}
	tables := glob(t, dir, "*.sst")
	if len(tables) == 0 {
		t.Fatal("no table after Close")
	}
	for _, path := range tables {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// As trim_linux.go's indexOffset reads it.
		end := len(b) - 4
		cl := int(binary.BigEndian.Uint32(b[end:]))
		end -= cl + 4
		if cl == 0 || end < 0 {
			t.Fatalf("%s: checksum length %d; want the footer indexOffset reads", path, cl)
		}
		il := int(binary.BigEndian.Uint32(b[end:]))
		start := end - il
		if il == 0 || start <= 0 {
			t.Fatalf("%s: index length %d; want the footer indexOffset reads", path, il)
		}
		index := fb.GetRootAsTableIndex(b[start:end], 0)
		if index.OffsetsLength() == 0 || index.KeyCount() != 100 {
			t.Errorf("%s: the index at %d has %d blocks and %d keys; want the table's index there", path, start, index.OffsetsLength(), index.KeyCount())
		}
	}
}

// 6.
func TestBadgerCompactionDropsAFailedTable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := storeOptions(t, dir).WithNumCompactors(0)
	db := openRaw(t, opts.WithCompactL0OnClose(false))
	const keys = 1000
	for i := range keys {
		set(t, db, fmt.Appendf(nil, "k%04d", i), small)
	}
	if err := db.Close(); err != nil { // level 0 gets a table
		t.Fatal(err)
	}
	db = openRaw(t, opts.WithCompactL0OnClose(true))
	// The tables the compaction on Close makes take the next numbers:
	// taken, Badger cannot create them (as a table whose ftruncate fails
	// on a full disk).
	last := glob(t, dir, "*.sst")
	var n int
	fmt.Sscanf(filepath.Base(last[len(last)-1]), "%06d.sst", &n)
	for i := n + 1; i <= n+64; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close with its compaction's tables failing: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute")
	}
	for i := n + 1; i <= n+64; i++ {
		os.Remove(filepath.Join(dir, fmt.Sprintf("%06d.sst", i)))
	}
	db = openRaw(t, opts)
	found := 0
	for i := range keys {
		if value(t, db, fmt.Appendf(nil, "k%04d", i)) != nil {
			found++
		}
	}
	if found == keys {
		t.Errorf("all %d keys kept after a compaction whose table could not be created: Badger no longer drops it (waitForSpace may be revisited)", keys)
	}
	t.Logf("%d of %d keys left after the compaction dropped its table", found, keys)
}

// 7.
func TestBadgerWithoutManifestDeletesTables(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := storeOptions(t, dir)
	db := openRaw(t, opts)
	set(t, db, []byte("small"), small)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if len(glob(t, dir, "*.sst")) == 0 {
		t.Fatal("no table after Close")
	}
	if err := os.Remove(filepath.Join(dir, "MANIFEST")); err != nil {
		t.Fatal(err)
	}
	db, err := bdg.Open(opts)
	if err != nil {
		t.Fatalf("Badger refuses tables without a MANIFEST now (%v): checkManifest is redundant", err)
	}
	defer db.Close()
	if v := value(t, db, []byte("small")); v != nil {
		t.Errorf("the key is still there without a MANIFEST: %q", v)
	}
	if left := glob(t, dir, "*.sst"); len(left) != 0 {
		t.Errorf("tables left: %v; want Badger to have deleted them (what checkManifest prevents)", left)
	}
}

// 8.
func TestBadgerEmptyMemtableLogFailsOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := storeOptions(t, dir)
	db := openRaw(t, opts)
	set(t, db, []byte("small"), small)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "00099.mem"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := bdg.Open(opts)
	if err == nil {
		db.Close()
		t.Fatal("Badger opens a directory with an empty memtable log: removeEmptyLogs is redundant")
	}
}

// 9.
func TestBadgerAppendsToItsManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := openRaw(t, storeOptions(t, dir).WithCompactL0OnClose(false))
	path := filepath.Join(dir, "MANIFEST")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	set(t, db, []byte("small"), small)
	if err := db.Close(); err != nil { // a table: a change appended
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || after.Size() <= before.Size() {
		t.Errorf("MANIFEST: %d bytes, then %d (same file: %v); want it appended to in place", before.Size(), after.Size(), os.SameFile(before, after))
	}
}

// 10.
func TestBadgerValueLogGC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := storeOptions(t, dir).WithValueLogFileSize(1 << 20).WithCompactL0OnClose(true)
	value := make([]byte, 64<<10)
	fill := func(round byte) {
		db := openRaw(t, opts)
		for i := range 48 {
			value[0] = round
			set(t, db, fmt.Appendf(nil, "big-%d", i), value)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fill(1)
	fill(2) // the first round's values are garbage now
	db := openRaw(t, opts)
	before := glob(t, dir, "*.vlog")
	txn := db.NewTransaction(false)
	it := txn.NewIterator(bdg.IteratorOptions{Prefix: memtableProbe})
	var gcErr error
	rewritten := 0
	for gcErr == nil {
		if gcErr = db.RunValueLogGC(0.5); gcErr == nil {
			rewritten++
		}
	}
	if !errors.Is(gcErr, bdg.ErrNoRewrite) {
		t.Errorf("RunValueLogGC once nothing is left: %v, want ErrNoRewrite (RunGC stops at it)", gcErr)
	}
	if rewritten == 0 {
		t.Fatal("no value-log file rewritten; the test proves nothing")
	}
	for _, f := range before {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s deleted while an iterator opened before the rewrite is open: %v", filepath.Base(f), err)
		}
	}
	it.Close()
	txn.Discard()
	gone := 0
	for _, f := range before {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			gone++
		}
	}
	if gone == 0 {
		t.Errorf("no rewritten value-log file deleted once the iterator closed (%d rewritten)", rewritten)
	}
	if v := valueOf(t, db, "big-0"); len(v) == 0 || v[0] != 2 {
		t.Errorf("after GC, big-0 = %.4q, want the second round's value (moved by Badger's own writes)", v)
	}
}

func valueOf(t *testing.T, db *bdg.DB, k string) []byte { return value(t, db, []byte(k)) }

// 12.
func TestBadgerNoConflictDetection(t *testing.T) {
	t.Parallel()
	db := openRaw(t, storeOptions(t, t.TempDir()))
	k := []byte("k")
	t1, t2 := db.NewTransaction(true), db.NewTransaction(true)
	defer t1.Discard()
	defer t2.Discard()
	for _, txn := range []*bdg.Txn{t1, t2} {
		if _, err := txn.Get(k); !errors.Is(err, bdg.ErrKeyNotFound) {
			t.Fatal(err)
		}
		if err := txn.Set(k, small); err != nil {
			t.Fatal(err)
		}
	}
	if err := t1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := t2.Commit(); err != nil {
		t.Errorf("a transaction that read a key another one wrote since: %v; want it committed (the writer does not retry conflicts)", err)
	}
}

// 13.
func TestBadgerSizeWithoutMetrics(t *testing.T) {
	t.Parallel()
	db := openRaw(t, storeOptions(t, t.TempDir()))
	set(t, db, []byte("big"), big)
	if lsm, vlog := db.Size(); lsm != 0 || vlog != 0 {
		t.Errorf("DB.Size with metrics off = %d, %d; want 0, 0 (Sizes measures the files itself)", lsm, vlog)
	}
}

// 14.
func TestBadgerExpiryAndUserMeta(t *testing.T) {
	t.Parallel()
	db := openRaw(t, storeOptions(t, t.TempDir()))
	now := uint64(time.Now().Unix())
	err := db.Update(func(txn *bdg.Txn) error {
		if err := txn.SetEntry(bdg.NewEntry([]byte("live"), small).WithMeta(metaCompleted).WithTTL(time.Hour)); err != nil {
			return err
		}
		e := bdg.NewEntry([]byte("expired"), small).WithMeta(metaInFlight)
		e.ExpiresAt = now - 1
		return txn.SetEntry(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(txn *bdg.Txn) error {
		if _, err := txn.Get([]byte("expired")); !errors.Is(err, bdg.ErrKeyNotFound) {
			t.Errorf("an entry whose ExpiresAt (unix seconds) passed: %v, want ErrKeyNotFound", err)
		}
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false})
		defer it.Close()
		n := 0
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			n++
			if string(item.Key()) != "live" || item.UserMeta() != metaCompleted {
				t.Errorf("key-only iteration: %q with UserMeta %d, want live with %d", item.Key(), item.UserMeta(), metaCompleted)
			}
			if e := item.ExpiresAt(); e < now+3500 || e > now+3700 {
				t.Errorf("ExpiresAt of an entry with a TTL of an hour = %d, want about %d (unix seconds)", e, now+3600)
			}
		}
		if n != 1 {
			t.Errorf("key-only iteration saw %d keys, want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
