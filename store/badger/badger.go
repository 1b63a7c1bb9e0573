// Package badger is idemproxy's embedded key store, on Badger.
//
// Each key record is one Badger entry: the value is the record in a compact,
// versioned binary encoding (record.go), the entry's UserMeta byte mirrors
// its state (so that start-up can find in-flight records without reading
// values), and the record's TTL is Badger's own expiry. Reserve, Commit,
// Release and MarkInDoubt are each one closure applied by the store's single
// writer, which batches the closures queued meanwhile into one Badger
// transaction and, with SyncWrites, one fdatasync of the store's own
// reservation log (group commit, writer.go; the log, wal.go): reservations
// are atomic among the requests of this process, and durable together. A
// commit is answered once Badger and the log have it, before that sync
// (commit.go). Badger locks
// its directory, so one store serves exactly one process: the embedded
// store is per replica.
package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/idemproxy/idemproxy/internal/prealloc"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
)

var _ store.Store = (*Store)(nil)

// UserMeta values, one per state.
const (
	metaInFlight  byte = 1
	metaCompleted byte = 2
	metaInDoubt   byte = 3
)

// Options configures Open.
type Options struct {
	// Dir is the data directory, created if missing. Required.
	Dir string
	// SyncWrites makes every write that needs it durable before it
	// returns, so a reservation is on disk before its request is
	// forwarded. The store's writer applies concurrent writes in one
	// transaction, so they share one sync, and a batch of only commits,
	// releases and in-doubt marks (whose loss leaves a key in doubt, never
	// charged twice) is not synced: the next reservation's sync covers it.
	// Those writes return once Badger and the log have them (in the page
	// cache, which a process crash leaves), before their batch's sync.
	//
	// Badger itself then runs unsynced: every batch's writes are appended,
	// after its commit, to the store's reservation log in
	// Dir/idemproxy-wal (wal.go), and a batch is made durable by one
	// fdatasync of that log (a few hundred bytes in a preallocated file)
	// instead of Badger's DB.Sync, which msyncs its memtable log and
	// value-log mappings. Open replays the log into Badger before serving;
	// every 30 s, and whenever a 16 MiB segment fills, Badger is synced in
	// the background and the log emptied. The log takes two segments on
	// disk (32 MiB). A failed write of the log fails the batch's writes
	// (applied, maybe not logged), a failed sync the writes that waited for
	// it (applied, maybe not durable), and either every later write (not
	// applied) until the store is reopened (the Guard does); a segment
	// that cannot be made (a full disk) fails its batch before it is
	// applied. False: no log, nothing synced; a
	// log left by a store run with SyncWrites is still replayed at Open.
	// Value-log garbage collection holds the writer's exclusive lock, and
	// syncs Badger after a rewrite.
	SyncWrites bool
	// GCInterval is how often value-log garbage collection runs (the
	// program passes store.badger.gc_interval, which package config
	// defaults). Zero: never on its own, only through RunGC; Open refuses
	// a negative interval.
	GCInterval time.Duration
	// Logger receives Badger's warnings and errors and the store's own
	// messages; nil discards them.
	Logger *slog.Logger
	// Settler takes back, in the background, the reservations whose callers
	// were told they failed (releaseAbandoned), in a Group of it that Close
	// stops; nil: a Settler of the store's own.
	Settler *settle.Settler
	// keepInFlight leaves in-flight records as they are at open: set by
	// Guard.reopen, whose process still runs the requests that hold them
	// (a lapsed lease reads as in doubt all the same).
	keepInFlight bool
	// orphanTables lets Open start a store whose directory holds tables
	// but no MANIFEST: set by Guard.reopen for a directory it recreated,
	// where the failed store's last flush left a table nothing refers to.
	orphanTables bool
	// trimEvery overrides trimPoll; negative: never (tests trim
	// themselves).
	trimEvery time.Duration
	// noCompactions stops Badger's compactions (tests that count the
	// tables' pages).
	noCompactions bool
	// checkpointEvery overrides walCheckpointEvery; negative: no
	// checkpoints nor spare segments in the background (tests make them).
	checkpointEvery time.Duration
}

// Store is the Badger key store. Its methods are safe for concurrent use.
type Store struct {
	dir  string
	db   *bdg.DB
	w    *writer
	log  *slog.Logger
	now  func() time.Time
	stop chan struct{}
	done sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	// epochChecked is the marker a reservation's checkEpoch last found,
	// and epochSwaps the number of SwapEpoch calls begun and ended: the
	// process is the directory's only writer, so that while no swap ran
	// since, the marker is unchanged and need not be read again (epoch.go).
	epochChecked atomic.Pointer[checkedEpoch]
	epochSwaps   atomic.Uint64

	sizes    sizeCache       // Sizes' last measurement (size.go)
	trim     *trimmer        // returns mapped table pages to the kernel (trim_linux.go)
	settling *settle.Settler // a Group of Options.Settler: the store's retries

	// afterRewrite, when set (tests), is called after each value-log
	// rewrite returns, before it is synced.
	afterRewrite func()
}

// record is the stored form of a store.Record, encoded by marshal
// (record.go).
type record struct {
	State       store.State
	Token       string
	Fingerprint string
	CreatedAt   int64 // unix ms
	Lease       int64 // unix ms, in flight only
	Response    *store.Response
	// Reconciliation (reconcile.go): the next lookup, and the lookup
	// lease's token and end, unix ms; in doubt only.
	NextLookup  int64
	LookupToken string
	LookupLease int64
	// LogSeq is the reservation log sequence number of the batch that
	// wrote the record (putAt sets it; 0 without a log): a replay does not
	// write a log entry over a record a later batch wrote.
	LogSeq uint64
	// Origin is the reservation's store.Reservation.Origin ("": none, or
	// a record of an earlier release).
	Origin string
}

// Open opens (or creates) the store in opts.Dir, turns every reservation
// left in flight by a previous process into in doubt (no request of that
// process can still be running, and it may have reached the upstream), and
// starts value-log garbage collection in the background. Off Unix
// (Windows) it refuses with an error naming the system (platform_other.go).
func Open(opts Options) (*Store, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		return nil, errors.New("badger: a data directory is required")
	}
	if opts.GCInterval < 0 {
		return nil, fmt.Errorf("badger: gc interval %v is negative", opts.GCInterval)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	bo := bdg.DefaultOptions(opts.Dir).
		WithSyncWrites(false). // the writer syncs, see Options.SyncWrites
		WithLogger(logger{opts.Logger}).
		// Sized for a sidecar: a few tens of MiB instead of Badger's
		// server-sized defaults (64 MiB memtables x5, a 256 MiB block cache,
		// 1 GiB value-log files). The Go heap holds the memtables' arenas
		// (about 1.4 times MemTableSize each) and the table builders, whose
		// buffers start at twice the table's size and are kept, up to 8,
		// in Badger's allocator pool: small memtables and tables, all of
		// one size (TableSizeMultiplier 1 below: no larger tables, and so
		// larger buffers, deeper down), keep both to a few MiB whatever
		// the keys stored.
		WithMemTableSize(1 << 20).
		WithNumMemtables(2).
		// Keys are random, so a compaction of level 0 rewrites the whole
		// base level: four level-0 tables and a base level of 2 MiB keep
		// each compaction to a few MiB, a burst short enough not to take
		// both cores from the requests for long. Measured open-loop at
		// 2,500 requests/s on a million keys: p99 1.4 times the fresh
		// store's and a peak RSS of 77 MiB, against 1.7 times and 107 MiB
		// with eight tables and Badger's 10 MiB base level.
		WithNumLevelZeroTables(4).
		WithNumLevelZeroTablesStall(16).
		WithBaseLevelSize(2 << 20).
		WithBaseTableSize(512 << 10).
		// Without compression or encryption Badger reads blocks and
		// indexes straight from its mapped tables: a block cache only
		// caches their headers, and the index cache is not used at all.
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		WithValueLogFileSize(valueLogFileSize).
		// Records of valueThreshold bytes or more (an answer with its
		// body) live in the value log, written once; the tree keeps their
		// key and a pointer. Compactions rewrite the tree again and again
		// as it grows (each level about ten times, keys being random): with
		// a million answers of ~300 bytes stored, a tree of 40 MiB instead
		// of 300 MiB, four times less work and memory per write. A
		// reservation (~110 bytes, ~170 with its origin span) stays in the
		// tree, where the lookup that finds it does not read the log.
		WithValueThreshold(valueThreshold).
		WithNumCompactors(2).
		WithNumGoroutines(2).
		WithMetricsEnabled(false).
		// Records are small and mostly random (tokens, hashes): compression
		// gains little and costs CPU and a goroutine pool per table built.
		WithCompression(options.None).
		// The store's writer is the only writer (writer.go): its
		// transactions cannot conflict, so their reads need no tracking.
		WithDetectConflicts(false)
	bo.TableSizeMultiplier = 1 // see above (there is no With method)
	if opts.noCompactions {
		bo = bo.WithNumCompactors(0)
	}
	if err := makeStoreDir(opts.Dir); err != nil {
		return nil, err
	}
	if !opts.orphanTables {
		if err := checkManifest(opts.Dir); err != nil {
			return nil, err
		}
	}
	if err := checkQuarantineDone(opts.Dir); err != nil {
		return nil, err
	}
	// Not in a directory another process holds (a replica being replaced
	// on the same volume, whose Guard tries every second): Badger creates
	// its files and sizes them after, so a file the running store has just
	// created is empty for a moment, and removed, its writes would go to a
	// file nobody finds again. Where the lock is not supported, as before.
	unlockDir, err := lockStoreDir(opts.Dir)
	if errors.Is(err, errInUse) {
		return nil, fmt.Errorf("badger: open %s: %w", opts.Dir, err)
	}
	if err == nil {
		err = removeEmptyLogs(opts.Dir)
		if err == nil {
			err = createDiscardStats(opts.Dir)
		}
		unlockDir()
	} else if err = removeEmptyLogs(opts.Dir); err == nil {
		err = createDiscardStats(opts.Dir)
	}
	if err != nil {
		return nil, err
	}
	// Badger maps and reads every table as it opens, and the scan below
	// reads them all: trim meanwhile, or the whole store would be resident
	// once, and stay in the peak resident set (VmHWM) for good.
	trim := newTrimmer(opts.Dir)
	stopTrim := trim.trimWhile(openTrimInterval)
	db, err := bdg.Open(bo)
	if err != nil {
		stopTrim()
		trim.close()
		return nil, fmt.Errorf("badger: open %s: %w", opts.Dir, err)
	}
	// The reservation log is replayed whether or not SyncWrites is set
	// now: a store last run with it holds its latest writes there.
	walDir := filepath.Join(opts.Dir, walDirName)
	replayed, nextNum, nextSeq, err := replayWAL(db, opts.Dir, walDir, time.Now())
	var l *wal
	if err == nil && opts.SyncWrites {
		l, err = openWAL(walDir, nextNum, nextSeq)
	}
	if err != nil {
		stopTrim()
		trim.close()
		db.Close()
		return nil, fmt.Errorf("badger: open %s: %w", opts.Dir, err)
	}
	if opts.Settler == nil {
		opts.Settler = settle.New(opts.Logger)
	}
	s := &Store{dir: opts.Dir, db: db, w: newWriter(db, opts.SyncWrites, l), log: opts.Logger, now: time.Now, stop: make(chan struct{}),
		trim: trim, settling: opts.Settler.Group()}
	if replayed > 0 {
		s.log.Info("replayed the reservation log into the store", "records", replayed)
	}
	n, err := 0, error(nil)
	if !opts.keepInFlight {
		n, err = s.orphansInDoubt()
	}
	stopTrim()
	if err != nil {
		s.trim.close()
		s.w.close()
		if l != nil {
			l.close()
		}
		db.Close()
		return nil, fmt.Errorf("badger: recover in-flight reservations: %w", err)
	}
	if n > 0 {
		s.log.Warn("reservations left in flight by the previous process are now in doubt", "keys", n)
	}
	if opts.trimEvery == 0 {
		opts.trimEvery = trimPoll
	}
	s.keepManifestRoom()
	s.done.Add(1)
	go s.gcLoop(opts.GCInterval, opts.trimEvery)
	if opts.checkpointEvery == 0 {
		opts.checkpointEvery = walCheckpointEvery
	}
	if l != nil && opts.checkpointEvery > 0 {
		s.done.Add(1)
		go s.checkpointLoop(opts.checkpointEvery)
	}
	return s, nil
}

// checkpointLoop checkpoints the reservation log every period, when
// anything was written, and whenever a segment fills. A checkpoint keeps
// the segment it empties as the next one; a spare segment is written only
// when there is none by the time the active one is half full (a store just
// opened), not at start, where its 16 MiB of zeros would compete with the
// first requests' syncs.
func (s *Store) checkpointLoop(every time.Duration) {
	defer s.done.Done()
	l := s.w.wal
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-l.half:
			if err := l.prepare(); err != nil {
				s.log.Warn("preparing a reservation log segment failed", "err", err)
			}
			continue
		case <-t.C:
		case <-l.full:
		}
		if err := s.checkpoint(); err != nil {
			s.log.Warn("reservation log checkpoint failed; retrying", "err", err)
		}
		if err := l.prepare(); err != nil {
			s.log.Warn("preparing a reservation log segment failed", "err", err)
		}
	}
}

// checkpoint empties the reservation log of what Badger holds: under the
// writer's exclusive lock, the active segment is synced and a new one begun
// (the older ones then hold every write Badger committed); Badger is made
// durable, and the older segments deleted.
func (s *Store) checkpoint() error {
	l := s.w.wal
	l.ckptMu.Lock()
	defer l.ckptMu.Unlock()
	// The segment to go on in, made now if there is none (the first
	// checkpoint after an open): not by the cut, under the writer's lock.
	if err := l.prepare(); err != nil {
		return err
	}
	s.w.exclusive.Lock()
	old, err := l.cut()
	needed := l.seq // the active segment's first record: the older ones hold the rest
	s.w.exclusive.Unlock()
	if err != nil || len(old) == 0 {
		return err
	}
	if err := syncBadger(s.dir); err != nil {
		return err
	}
	if err := writeCheckpoint(l.dir, needed); err != nil {
		return err
	}
	return l.drop(old)
}

// manifestRoom is the room kept allocated past the end of the MANIFEST.
const manifestRoom = 1 << 20

// keepManifestRoom keeps blocks allocated past the end of Badger's
// MANIFEST. Badger appends to it with write(2), and applies each change in
// memory before writing it: an append that fails halfway on a full disk
// leaves a torn record that the next open refuses (checksum mismatch), so
// the store would never reopen. With room allocated, appends take no new
// blocks. Badger rewrites the MANIFEST now and then (after 10,000 table
// deletions) into a new file, which gets its room within a second: that
// second is not covered.
func (s *Store) keepManifestRoom() {
	_ = prealloc.KeepRoom(filepath.Join(s.dir, "MANIFEST"), manifestRoom)
}

// removeEmptyLogs removes the memtable logs and value-log files of length
// zero in dir. A file that could not be sized (a full disk: its ftruncate
// failed), or whose size a power cut took (created, never synced), is left
// empty, and Badger then fails to open the directory once ("Create a new
// file"), leaking the files and goroutines of that attempt, and succeeds
// the next time. An empty file holds nothing: not even the header every
// one of them starts with.
func removeEmptyLogs(dir string) error {
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		logs, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil
		}
		for _, l := range logs {
			if fi, err := os.Stat(l); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
				if err := os.Remove(l); err != nil {
					return fmt.Errorf("badger: remove the empty file %s: %w", l, err)
				}
			}
		}
	}
	return nil
}

// makeStoreDir creates the store's directory when it does not exist, and
// makes its name durable (an fsync of its parent): the reservation log in
// it is what makes acknowledged reservations survive a power cut, and a
// file system may lose a new directory whose parent was not synced.
func makeStoreDir(dir string) error {
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return nil // there, or an error Open reports as it opens
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("badger: create %s: %w", dir, err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return fmt.Errorf("badger: create %s: %w", dir, err)
	}
	return nil
}

// discardStatsSize is the size Badger gives its discard-stats file
// (DISCARD) when it creates it.
const discardStatsSize = 1 << 20

// createDiscardStats creates Badger's discard-stats file in dir, zeroed
// at its initial size, when it does not exist yet (a new store): Badger
// creates it with y.Check, so that a full disk (its ftruncate fails,
// preallocated) would log.Fatalf. Made here, that is an ENOSPC error the
// Guard waits out. Badger opens a zeroed file as it would a new one.
func createDiscardStats(dir string) error {
	path := filepath.Join(dir, "DISCARD")
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil // Badger reports it
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil // Badger reports it
	}
	err = f.Truncate(discardStatsSize)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("badger: create %s: %w", path, err)
	}
	return nil
}

// Close stops garbage collection and the store's background releases of
// abandoned reservations, and closes the database. Operations after Close fail; closing again returns the first
// Close's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.done.Wait()
		now, cancel := context.WithCancel(context.Background())
		cancel()
		s.settling.Close(now) // before the writer closes: a retry under way waits for it
		s.trim.close()
		s.w.close() // applies what is queued; later writes fail
		if s.w.wal != nil {
			s.w.wal.close() // kept: the next open replays it
		}
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("badger: close: %w", err)
		}
	})
	return s.closeErr
}

// trimPoll is how often the store asks whether the mapped tables should
// be trimmed (trimmer.poll): the resident set grows by at most what
// flushes and compactions touch in that time, beyond trimGrowth.
const trimPoll = 25 * time.Millisecond

// openTrimInterval is how often the mapped tables are trimmed while the
// store opens: Badger maps every table and reads its index and last block
// (each fault maps the kernel's fault-around window, 64 KiB, not a page:
// with a million keys the tables alone would reach 70 MiB), then the
// start-up scan reads them all, a few hundred MB per second.
const openTrimInterval = 5 * time.Millisecond

// trimWhile trims the mapped tables every period until the returned
// function is called; that function trims once more and returns.
func (t *trimmer) trimWhile(every time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				t.trim() // an error is said by the gc loop's trims
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		t.trim()
	}
}

func (s *Store) gcLoop(every, trimEvery time.Duration) {
	defer s.done.Done()
	var gc <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		gc = t.C
	}
	room := time.NewTicker(time.Second)
	defer room.Stop()
	var trim <-chan time.Time
	if trimEvery > 0 {
		tt := time.NewTicker(trimEvery)
		defer tt.Stop()
		trim = tt.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-gc:
			s.RunGC()
		case <-room.C:
			s.keepManifestRoom()
		case now := <-trim:
			if err := s.trim.poll(now); err != nil {
				s.log.Warn("mapped tables stay resident", "err", err)
			}
		}
	}
}

// RunGC runs value-log garbage collection until a pass finds nothing to
// rewrite, and returns the number of files rewritten.
func (s *Store) RunGC() int {
	n := 0
	for {
		select {
		case <-s.stop:
			return n
		default:
		}
		err := s.rewriteValueLog()
		if err != nil {
			if !errors.Is(err, bdg.ErrNoRewrite) && !errors.Is(err, bdg.ErrRejected) {
				s.log.Warn("value-log garbage collection failed", "err", err)
			}
			return n
		}
		n++
	}
}

// rewriteValueLog runs one value-log rewrite. The rewrite moves the live
// values out of a file and then deletes that file; with the reservation
// log, Badger runs unsynced and the moves are in no segment of the log: a
// power loss after the deletion reached the disk but before the moves did
// would leave the tree pointing into a file that is gone (those keys'
// answers lost, each read failing for the key's TTL). So an iterator is
// held open across the rewrite, which makes Badger defer the deletion
// until it closes, and the moves are synced before it closes. If the sync
// fails, the file is deleted all the same (Badger gives no way to keep
// it): that is logged.
func (s *Store) rewriteValueLog() error {
	// Recovered: a Badger that lost its memtable (a failed rotation)
	// panics on the iterator's first read, here in the gc goroutine,
	// before the rewrite takes any lock. The rewrite itself would panic
	// on it with Badger's lock held (DB.MaxVersion), which no later
	// operation, Close included, would ever get back
	// (TestValueLogGCAfterAFailedRotation).
	return recovered(func() error {
		txn := s.db.NewTransaction(false)
		defer txn.Discard()
		// A prefix no key has: no table is read.
		hold := txn.NewIterator(bdg.IteratorOptions{Prefix: memtableProbe})
		defer hold.Close() // with the log: deletes the rewritten file, once synced
		err := func() error {
			s.w.exclusive.Lock() // no rewrite between a batch's commit and its sync
			defer s.w.exclusive.Unlock()
			return s.db.RunValueLogGC(0.5)
		}()
		if err != nil || s.w.wal == nil {
			return err
		}
		if s.afterRewrite != nil {
			s.afterRewrite()
		}
		if err := syncBadger(s.dir); err != nil {
			s.log.Warn("syncing after value-log garbage collection failed", "err", err)
		}
		return nil
	})
}

// orphansInDoubt rewrites every in-flight record as in doubt, keeping its
// expiry.
// probePrefix begins the keys of the write probe's reservations.
var probePrefix = []byte(store.ProbeRoute + "/")

func (s *Store) orphansInDoubt() (int, error) {
	type orphan struct {
		key       []byte
		expiresAt uint64
	}
	var orphans []orphan
	err := s.view(func(txn *bdg.Txn) error {
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			// A write probe's reservation (store.WriteProbe) was no
			// request's: it is left to expire, neither in doubt nor counted.
			if item.UserMeta() == metaInFlight && !bytes.HasPrefix(item.Key(), probePrefix) {
				orphans = append(orphans, orphan{item.KeyCopy(nil), item.ExpiresAt()})
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, o := range orphans {
		err := s.update(func(txn *wtxn) error {
			rec, _, err := get(txn, o.key)
			if err != nil || rec == nil || rec.State != store.StateInFlight {
				return err
			}
			rec.State = store.StateInDoubt
			rec.Lease = 0
			return putAt(txn, o.key, rec, o.expiresAt)
		})
		if err != nil {
			return 0, err
		}
	}
	return len(orphans), nil
}

// update runs fn in the read-write transaction of the writer's next batch
// and returns fn's error, or the batch's commit error; with SyncWrites the
// batch is synced before update returns. fn sees the writes
// of the closures before it in the batch and may run more than once (when
// another closure of its batch fails), so it must set every result it
// returns through captured variables anew on each run. Every write to the
// database goes through update: the writer is the only writer.
func (s *Store) update(fn func(txn *wtxn) error) error { return s.w.update(fn, true) }

// updateLazy is update for a write whose loss after a power failure is
// safe (it leaves the key in flight, which a restart turns in doubt): it
// returns once applied, and its batch is synced only if another write in
// it needs that.
func (s *Store) updateLazy(fn func(txn *wtxn) error) error { return s.w.update(fn, false) }

// Reserve implements store.Store.
func (s *Store) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := store.CheckOrigin(res.Origin); err != nil {
		return nil, fmt.Errorf("badger: reserve: %w", err)
	}
	var (
		existing  *store.Record
		abandoned atomic.Bool
	)
	err := s.update(func(txn *wtxn) error {
		if abandoned.Load() {
			return errAbandoned
		}
		existing = nil
		k := []byte(key)
		rec, exp, err := get(txn, k)
		if err != nil {
			return err
		}
		if rec != nil {
			existing = s.public(rec, exp)
			if existing.State == store.StateInFlight && rec.Token == res.Token {
				existing = nil // the caller's own reservation, applied before
			}
			return nil
		}
		now := s.now()
		rec = &record{
			State:       store.StateInFlight,
			Token:       res.Token,
			Fingerprint: res.Fingerprint,
			CreatedAt:   now.UnixMilli(),
			Lease:       now.Add(res.Lease).UnixMilli(),
			Origin:      res.Origin,
		}
		return put(txn, k, rec, now, res.TTL)
	})
	if errors.Is(err, errStalled) {
		abandoned.Store(true)
		s.releaseAbandoned(key, res.Token)
	}
	if err != nil {
		return nil, fmt.Errorf("badger: reserve: %w", err)
	}
	return existing, nil
}

// errAbandoned is the error of a reservation's closure run after its
// caller was answered that it failed.
var errAbandoned = errors.New("badger: reservation abandoned by its caller")

// releaseAbandoned undoes a reservation whose caller was answered that it
// failed (the writer stalled: a full disk), and so forwards nothing. Its
// closure, if it had not run yet, now writes nothing; if it ran, its batch
// is still being applied, and a release queued behind it deletes the
// record once it is. Left, the key would read in flight for the lease and
// then in doubt for its TTL, though its request was never sent. The release
// is queued by the settler in the background (Settler.Go), as the queue may
// be full; Close waits for it to be queued, and its writer applies it. Once
// the settler takes no more jobs (a Guard or the program closing), it is
// queued by the caller, whose operation the store's Close waits for; one
// that comes after the writer closed is lost (the key then lapses in
// doubt, as before).
func (s *Store) releaseAbandoned(key, token string) {
	k := []byte(key)
	failed := func(err error) {
		if err != nil {
			s.log.Warn("releasing an abandoned reservation failed; the key will be in doubt when its lease ends",
				"key_hash", store.KeyHash(key), "err", err)
		}
	}
	release := func(txn *wtxn) error {
		rec, _, err := get(txn, k)
		if err != nil || rec == nil || rec.Token != token || rec.State != store.StateInFlight {
			return err
		}
		return txn.Delete(k)
	}
	wait := s.w.wait
	j := settle.Job{Key: key, Operation: "release", Attempt: func(context.Context) error {
		err := s.w.updateAsyncWithin(release, failed, wait)
		failed(err)
		return err
	}}
	if !s.settling.Go(j) {
		// The settler is closing (a Guard closing, or the program): the
		// store may still be open, its Close waiting for this caller's
		// operation, so the release is queued now, before it closes.
		s.settling.Once(j)
	}
}

// MarkInDoubt implements store.Store.
func (s *Store) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.transition(ctx, "mark in doubt", key, token, func(rec *record) time.Duration {
		rec.State = store.StateInDoubt
		rec.Lease = 0
		return ttl
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.transition(ctx, "release", key, token, nil)
}

// transition applies change to the record under key if it carries token;
// a nil change deletes the record.
func (s *Store) transition(ctx context.Context, op, key, token string, change func(*record) time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.updateLazy(func(txn *wtxn) error {
		k := []byte(key)
		rec, _, err := get(txn, k)
		if err != nil {
			return err
		}
		if rec == nil || rec.Token != token {
			return store.ErrNotOwner
		}
		if change == nil {
			return txn.Delete(k)
		}
		if rec.State == store.StateCompleted {
			return nil // the first answer stays
		}
		ttl := change(rec)
		return put(txn, k, rec, s.now(), ttl)
	})
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		return fmt.Errorf("badger: %s: %w", op, err)
	}
	return err
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *store.Record
	err := s.view(func(txn *bdg.Txn) error {
		rec, exp, err := get(txn, []byte(key))
		if rec != nil {
			out = s.public(rec, exp)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("badger: get: %w", err)
	}
	return out, nil
}

// Ping implements store.Store: it fails once the database is closed.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.db.IsClosed() {
		return asFault(errors.New("badger: database is closed"))
	}
	return nil
}

// public converts a stored record, deriving in doubt from a lapsed lease.
func (s *Store) public(rec *record, expiresAt uint64) *store.Record {
	out := &store.Record{
		State:       rec.State,
		Token:       rec.Token,
		Fingerprint: rec.Fingerprint,
		CreatedAt:   time.UnixMilli(rec.CreatedAt),
		Response:    rec.Response,
		Origin:      rec.Origin,
	}
	if expiresAt > 0 {
		out.ExpiresAt = time.Unix(int64(expiresAt), 0)
	}
	if rec.State == store.StateInFlight {
		out.LeaseExpiresAt = time.UnixMilli(rec.Lease)
		if !s.now().Before(out.LeaseExpiresAt) {
			out.State = store.StateInDoubt
			out.LeaseExpiresAt = time.Time{}
		}
	}
	return out
}

// view runs fn in a read-only transaction of the database. An error of
// Badger's own, not fn's, is a fault of the store (fault.go).
func (s *Store) view(fn func(txn *bdg.Txn) error) error {
	var fnErr error
	err := s.db.View(func(txn *bdg.Txn) error {
		fnErr = fn(txn)
		return fnErr
	})
	if err != nil && err != fnErr {
		return asFault(err)
	}
	return err
}

// getter is a transaction get reads from: Badger's (a read-only view) or
// the writer's.
type getter interface {
	Get(key []byte) (*bdg.Item, error)
}

// get reads the record under k; (nil, 0, nil) when there is none.
func get(txn getter, k []byte) (*record, uint64, error) {
	item, err := txn.Get(k)
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, asFault(err)
	}
	var rec record
	err = item.Value(rec.unmarshal)
	if err != nil {
		return nil, 0, fmt.Errorf("decode record: %w", corrupt(err))
	}
	return &rec, item.ExpiresAt(), nil
}

func put(txn *wtxn, k []byte, rec *record, now time.Time, ttl time.Duration) error {
	return putAt(txn, k, rec, expiry(now, ttl))
}

// expiry is the Badger expiry of a record written at now for ttl. Badger's
// expiry has one-second granularity: it is rounded up, so a record is
// never forgotten early.
func expiry(now time.Time, ttl time.Duration) uint64 {
	return uint64(now.Add(ttl + time.Second - 1).Unix())
}

// Preallocate makes the files Badger grows with ftruncate preallocated,
// from now on, in the whole process (internal/prealloc): Badger writes
// through mappings of those files, and preallocated, a disk that fills is
// an error from that ftruncate (the store answers 503) instead of a SIGBUS
// on a later write, which kills the process. The program calls it once,
// before opening the store; where it returns an error (seccomp user
// notification unavailable; the caller logs it, or refuses to start) the
// store runs as before, protected by the Guard's free-space floor alone.
//
// It is not done by Open: a process can install only one such filter in
// its line (the kernel refuses a second listener, EBUSY), and children
// inherit it, so a test process that opened a store would leave the
// binaries it starts unprotected.
func Preallocate(log *slog.Logger) error { return prealloc.Start(log, waitForSpace) }

// waitForSpace reports whether creating the file at path waits for disk
// space instead of failing: tables do. A compaction drops the error of a
// table it could not create (badger v4.9.6, levels.go subcompact: the
// builder's deferred Done(err) takes err before it is set) and commits
// without that table's keys, deleting the tables they were in: committed
// keys would be forgotten, and their requests charged again. Waiting, the
// compaction (or memtable flush) finishes once there is room; meanwhile
// writes stall and fail (503) like any write on a full disk. Memtable logs
// and value-log files fail at once: Badger returns those errors.
func waitForSpace(path string) bool { return strings.HasSuffix(path, ".sst") }

// valueLogFileSize is the size of Badger's value-log files, and so the
// largest value it stores: it refuses a larger one.
const valueLogFileSize = 16 << 20

// valueThreshold is the size from which a record is stored in the value
// log rather than in the tree (see Open).
const valueThreshold = 192

func putAt(txn *wtxn, k []byte, rec *record, expiresAt uint64) error {
	if txn.rec != nil {
		stamped := *rec
		stamped.LogSeq = txn.seq
		rec = &stamped
	}
	v, err := rec.marshal()
	if err != nil {
		return fmt.Errorf("encode record: %w", err)
	}
	if len(v) > valueLogFileSize && rec.Response != nil && rec.Response.BodyStored {
		// An answer Badger cannot hold (max_stored_body_bytes raised past
		// it) is kept as one too large to store: its duplicates get 409
		// response-not-replayable. Failing the commit instead would leave
		// the key in doubt for its whole TTL.
		small := *rec
		resp := *rec.Response
		resp.Body, resp.BodyStored = nil, false
		small.Response = &resp
		if v, err = small.marshal(); err != nil {
			return fmt.Errorf("encode record: %w", err)
		}
	}
	e := bdg.NewEntry(k, v).WithMeta(meta(rec.State))
	e.ExpiresAt = expiresAt
	return txn.SetEntry(e)
}

func meta(st store.State) byte {
	switch st {
	case store.StateInFlight:
		return metaInFlight
	case store.StateCompleted:
		return metaCompleted
	default:
		return metaInDoubt
	}
}

// logger adapts slog to Badger's Logger, keeping warnings and errors only.
type logger struct{ l *slog.Logger }

func (l logger) Errorf(f string, a ...any)   { l.l.Error("badger: " + trim(fmt.Sprintf(f, a...))) }
func (l logger) Warningf(f string, a ...any) { l.l.Warn("badger: " + trim(fmt.Sprintf(f, a...))) }
func (l logger) Infof(string, ...any)        {}
func (l logger) Debugf(string, ...any)       {}

func trim(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
