package badger

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/prealloc"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
)

// Guard is a Store that survives Badger failing: a full disk, the data
// directory removed while running, too many open files. Badger answers
// such faults with errors and then, once a memtable could not be rotated,
// with nil-pointer panics in the caller's goroutine, and a disk that fills
// up under its mmapped files is a SIGBUS that no recover can catch. The
// guard
//
//   - refuses new reservations while the free space of the data directory's
//     file system is below a floor (checked with statfs at most once a
//     second), so Badger never writes into a full disk, while commits,
//     releases and in-doubt marks of requests already forwarded still go
//     through and fit in the space left above the floor;
//   - turns panics inside Badger into errors, and on such a fault marks the
//     store broken: every operation then fails fast (503 in the proxy),
//     Ping fails (/readyz 503), and the store is reopened in the background
//     until that works again;
//   - opens the store at start only when the floor allows, so a restart on
//     a still-full disk waits instead of crash-looping.
//
// Every method of the Guard is guarded: while the store is broken it
// fails fast (or, for RunGC and Sizes, does nothing). An operation holds a
// reference to the open store, not a lock, while Badger works: a reopen
// takes the failed store out at once, and closes it once the operations
// under way on it have returned.
type Guard struct {
	mu      sync.RWMutex
	cur     *guarded // the open store; nil while broken. Swapped under mu.
	opts    Options
	floor   uint64
	free    func(dir string) (uint64, error)
	stop    chan struct{}
	done    sync.WaitGroup
	closed  bool
	broken  atomic.Bool
	lastErr atomic.Pointer[error]

	freeBytes atomic.Uint64
	freeAt    atomic.Int64  // unix ns of the last statfs
	written   atomic.Uint64 // bytes written (estimated) since the last statfs
	statMu    sync.Mutex

	// settling is a Group of Options.Settler, the Settler of the stores
	// it opens (their background retries), closed by Close.
	settling *settle.Settler

	// dir is the data directory the open store was opened in (os.Stat),
	// to tell it replaced (epoch.go); replaced is set once it was.
	dir      atomic.Pointer[os.FileInfo]
	replaced atomic.Bool
	// expect is the epoch ID reservations check (ExpectEpoch); nil or
	// "": none.
	expect atomic.Pointer[string]

	lowDisk atomic.Uint64 // reservations refused below the floor
	reopens atomic.Uint64 // successful reopens after a fault

	// closing is closed when the Close of a failed store, abandoned by a
	// reopen, ends; nil when there is none. Only the watch goroutine uses
	// it.
	closing <-chan struct{}
	// recreated is set when the watch goroutine recreated a removed
	// directory for such a Close: the table its flush leaves there is
	// not the store's.
	recreated bool
	// noRoomAt is the free space when an open failed for want of room
	// (isNoRoom), and noRoom whether the last one did: the store is not
	// opened again until more is free. Badger leaks file descriptors
	// (its key registry's) and memory of every Open that fails. Only the
	// watch goroutine uses them, after OpenGuarded.
	noRoom   bool
	noRoomAt uint64
	// open records the failures to open the store (degraded.go).
	open openState
}

var (
	_ store.Store          = (*Guard)(nil)
	_ store.ReconcileStore = (*Guard)(nil)
)

// guarded is a store the Guard opened, with the operations under way on it.
type guarded struct {
	*Store
	// ops counts the operations under way. It is added to under the
	// Guard's read lock, while the store is the Guard's open one: once the
	// store is taken out (under the write lock), ops only goes down, and
	// the store is closed when it reaches zero.
	ops sync.WaitGroup
}

// GuardOptions configures OpenGuarded.
type GuardOptions struct {
	// MinFreeBytes is the free-space floor of the data directory's file
	// system: below it new reservations are refused. Zero: no floor.
	MinFreeBytes uint64
	// FreeBytes reports the bytes available to the process on dir's file
	// system; nil means statfs(2).
	FreeBytes func(dir string) (uint64, error)
	// Remedy says what an operator should run when the store cannot be
	// opened, in the log line that reports it (the program passes its
	// `idemproxy store check` command line); empty: a generic hint.
	Remedy string
}

// ErrLowDisk is returned (wrapped) by Guard.Reserve and Guard.Ping while the
// data directory's free space is below the floor.
var ErrLowDisk = errors.New("badger: free disk space below the floor; new reservations are refused")

// errBroken is returned (wrapped) by every Guard operation while the store
// failed and has not been reopened yet.
var errBroken = errors.New("badger: the store failed and is being reopened")

// guardRetry is how often a broken or not yet opened store is reopened,
// and how long a free-space figure is used.
const guardRetry = time.Second

// OpenGuarded opens a guarded store. When the disk is below the floor, or
// has no room for the files the store allocates when it opens, it returns
// a Guard that is not open yet and opens it once space is back. When the
// store cannot be opened for another reason (a damaged reservation log, a
// MANIFEST missing or unreadable, a permission error), it returns a Guard
// that is not open either, says why (OpenFailed) and tries again
// (degraded.go). Only options that are invalid whatever the files hold,
// and a system the store does not run on (Windows: platform_other.go),
// are returned as errors.
func OpenGuarded(opts Options, g GuardOptions) (*Guard, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	if err := checkOptions(opts); err != nil {
		return nil, err
	}
	if g.FreeBytes == nil {
		g.FreeBytes = statfsFree
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	gd := &Guard{opts: opts, floor: g.MinFreeBytes, free: g.FreeBytes, stop: make(chan struct{})}
	if gd.opts.Settler == nil {
		gd.opts.Settler = settle.New(opts.Logger)
	}
	gd.settling = gd.opts.Settler.Group()
	gd.opts.Settler = gd.settling // the stores it opens: Groups of its Group
	opts = gd.opts
	gd.initOpen(g.Remedy)
	noteQuarantine(opts.Logger, opts.Dir)
	if gd.belowFloor() {
		opts.Logger.Error("free disk space is below the floor: the store opens once there is room",
			"dir", opts.Dir, "free_bytes", gd.freeBytes.Load(), "min_free_bytes", gd.floor)
		gd.fail(ErrLowDisk)
	} else if s, err := tryOpen(opts); err == nil {
		gd.cur = &guarded{Store: s}
		gd.noteDir()
		gd.opened()
	} else if isNoRoom(err) {
		// Above the floor, but without room for the files Badger
		// allocates when it opens (internal/prealloc): as below it.
		opts.Logger.Error("no room on disk to open the store: it opens once there is room", "dir", opts.Dir, "err", err)
		gd.fail(err)
		gd.noRoomAfter()
		gd.open.err.Store(&err)
	} else {
		gd.openFailed(err)
	}
	gd.done.Add(1)
	go gd.watch()
	return gd, nil
}

// isNoRoom reports whether err says the disk is full. Badger wraps some
// errors as text (y.Wrapf), so the errno is looked for in the message too.
func isNoRoom(err error) bool {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT} {
		if errors.Is(err, errno) || strings.Contains(err.Error(), errno.Error()) {
			return true
		}
	}
	return false
}

// BelowFloor reports whether the data directory's free space is below
// store.badger.min_free_bytes: every reservation is refused then.
func (g *Guard) BelowFloor() bool { return g.belowFloor() }

// belowFloor reports whether the data directory's free space is below the
// floor, calling statfs at most once per guardRetry. A directory that
// cannot be measured (removed) is not reported as full: its operations
// fail on their own.
func (g *Guard) belowFloor() bool {
	if g.floor == 0 {
		return false
	}
	now := time.Now().UnixNano()
	if now-g.freeAt.Load() >= int64(guardRetry) && g.statMu.TryLock() {
		if free, err := g.free(g.opts.Dir); err == nil {
			g.freeBytes.Store(free)
		} else {
			g.freeBytes.Store(^uint64(0))
		}
		g.written.Store(0)
		g.freeAt.Store(now)
		g.statMu.Unlock()
	}
	// Between two statfs calls, count what was written since: a burst of
	// large answers cannot run through the floor in that second.
	free, written := g.freeBytes.Load(), g.written.Load()
	return free < written || free-written < g.floor
}

// wrote adds an estimate of the bytes a write of n value bytes takes on
// disk: Badger writes a value twice (log, then table or value log) plus
// its key and bookkeeping.
func (g *Guard) wrote(n int) { g.written.Add(2*uint64(n) + 1024) }

// FreeBytes is the last measured free space of the data directory's file
// system.
func (g *Guard) FreeBytes() uint64 {
	if f := g.freeBytes.Load(); f != ^uint64(0) {
		return f
	}
	return 0
}

// LowDiskRefusals counts the reservations refused below the floor.
func (g *Guard) LowDiskRefusals() uint64 { return g.lowDisk.Load() }

// Reopens counts the times the store was reopened after a fault.
func (g *Guard) Reopens() uint64 { return g.reopens.Load() }

// fail marks the store broken with cause.
func (g *Guard) fail(cause error) {
	if !g.broken.Swap(true) {
		g.opts.Logger.Error("badger store failed: protected requests get 503 until it is reopened", "err", cause)
	}
	g.lastErr.Store(&cause)
}

// watch reopens a broken store once a second until it works.
func (g *Guard) watch() {
	defer g.done.Done()
	t := time.NewTicker(guardRetry)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		if g.broken.Load() && !g.belowFloor() && g.roomSinceNoRoom() && g.openDue(time.Now()) {
			g.reopen()
		}
	}
}

// noRoomAfter records that an open failed for want of room, and the free
// space then.
func (g *Guard) noRoomAfter() {
	g.noRoom, g.noRoomAt = true, 0
	if free, err := g.free(g.opts.Dir); err == nil {
		g.noRoomAt = free
	}
}

// roomSinceNoRoom reports whether the store may be opened again: the last
// open did not fail for want of room, or more space is free now.
func (g *Guard) roomSinceNoRoom() bool {
	if !g.noRoom {
		return true
	}
	free, err := g.free(g.opts.Dir)
	return err != nil || free > g.noRoomAt
}

// reopen closes the failed store (abandoning a Close that hangs on a lost
// directory) and opens it again.
func (g *Guard) reopen() {
	// The failed store is taken out under the lock, which no operation
	// holds while Badger works (do), so at once; it is closed, once the
	// operations under way on it have returned, and opened without the
	// lock: meanwhile operations fail fast with errBroken instead of
	// queueing behind a slow operation, a Close that hangs or an Open that
	// replays logs.
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	old := g.cur
	g.cur = nil
	g.mu.Unlock()
	if old != nil {
		closed, err := closeWithin(old, 5*time.Second)
		if err != nil {
			g.opts.Logger.Warn("closing the failed badger store failed", "err", err)
		}
		g.closing = closed
	}
	if g.closing != nil {
		select {
		case <-g.closing:
			g.closing = nil
		default:
			// The failed store's Close has not ended: it still flushes its
			// memtable into the directory, and then deletes that
			// memtable's log and its lock file by name, which would be
			// the files of a store opened there meanwhile (its log: every
			// reservation since lost on the next crash). A removed
			// directory is given back, empty, so that the flush can end;
			// the store is opened once the Close has ended.
			if _, err := os.Stat(g.opts.Dir); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(g.opts.Dir, 0o700); err != nil {
					g.opts.Logger.Warn("recreating the badger data directory failed; retrying", "err", err)
				} else {
					g.recreated = true
				}
			}
			return
		}
	}
	s, err := func() (s *Store, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		o := g.opts
		// The requests holding in-flight reservations are still running
		// in this process: they are not orphans. A store never opened in
		// this process holds only the previous process's.
		o.keepInFlight = g.open.opened
		o.orphanTables = g.recreated || g.replaced.Load()
		return Open(o)
	}()
	g.noRoom = false
	if err != nil {
		if isNoRoom(err) {
			g.lastErr.Store(&err)
			g.open.err.Store(&err)
			g.opts.Logger.Warn("reopening the badger store failed; retrying", "err", err)
			g.noRoomAfter()
		} else {
			g.openFailed(err)
		}
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed { // closed while reopening: nobody will serve from it
		s.Close()
		return
	}
	g.cur = &guarded{Store: s}
	g.noteDir()
	g.opened()
	g.replaced.Store(false)
	g.recreated = false
	g.broken.Store(false)
	g.reopens.Add(1)
	g.opts.Logger.Info("badger store reopened; serving again", "dir", g.opts.Dir)
}

// do runs op on the open store, turning a panic into an error and a store
// fault into a broken store. op holds a reference to the store, not the
// Guard's lock, while it runs: Badger can keep it waiting (up to the
// writer's wait), and a reopen must not wait for it to take the failed
// store out, nor new operations queue behind that reopen.
func (g *Guard) do(op func(s *Store) error) (err error) {
	cur := g.acquire()
	if cur == nil {
		cause := errBroken
		if p := g.lastErr.Load(); p != nil {
			cause = fmt.Errorf("%w: %w", errBroken, *p)
		}
		return cause
	}
	defer cur.ops.Done()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("badger: panic: %v", p)
			g.fail(err)
		}
	}()
	err = op(cur.Store)
	if err != nil && isFault(err) {
		g.fail(err)
	}
	return err
}

// acquire returns the open store with one more operation counted on it,
// nil while the store is broken (or closed).
func (g *Guard) acquire() *guarded {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.cur == nil || g.broken.Load() {
		return nil
	}
	g.cur.ops.Add(1)
	return g.cur
}

// Reserve implements store.Store; below the free-space floor it refuses.
func (g *Guard) Reserve(ctx context.Context, key string, res store.Reservation) (rec *store.Record, err error) {
	if g.belowFloor() {
		g.lowDisk.Add(1)
		return nil, fmt.Errorf("%w (%d bytes free, floor %d)", ErrLowDisk, g.FreeBytes(), g.floor)
	}
	g.wrote(len(key) + len(res.Fingerprint) + len(res.Origin))
	expect := g.expectedEpoch()
	if expect != "" && g.dirReplaced() {
		return nil, fmt.Errorf("badger: %w: the data directory %s was replaced", store.ErrKeysLost, g.opts.Dir)
	}
	err = g.do(func(s *Store) error {
		if expect != "" {
			if err := s.checkEpoch(ctx, expect); err != nil {
				return err
			}
		}
		rec, err = s.Reserve(ctx, key, res)
		return err
	})
	return rec, err
}

// Commit implements store.Store. It is not held back by the floor: the
// request was forwarded, and its answer fits in the space above it.
func (g *Guard) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	g.wrote(len(key) + len(resp.Body))
	return g.do(func(s *Store) error { return s.Commit(ctx, key, token, resp, ttl) })
}

// Release implements store.Store.
func (g *Guard) Release(ctx context.Context, key, token string) error {
	return g.do(func(s *Store) error { return s.Release(ctx, key, token) })
}

// MarkInDoubt implements store.Store.
func (g *Guard) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error {
	return g.do(func(s *Store) error { return s.MarkInDoubt(ctx, key, token, ttl) })
}

// Get implements store.Store.
func (g *Guard) Get(ctx context.Context, key string) (rec *store.Record, err error) {
	err = g.do(func(s *Store) error {
		rec, err = s.Get(ctx, key)
		return err
	})
	return rec, err
}

// Ping implements store.Store: it fails while the store is broken or the
// disk is below the floor.
func (g *Guard) Ping(ctx context.Context) error {
	if g.belowFloor() {
		return fmt.Errorf("%w (%d bytes free, floor %d)", ErrLowDisk, g.FreeBytes(), g.floor)
	}
	return g.do(func(s *Store) error { return s.Ping(ctx) })
}

// ScheduleLookup implements store.ReconcileStore.
func (g *Guard) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	return g.do(func(s *Store) error { return s.ScheduleLookup(ctx, key, after) })
}

// Unscheduled implements store.ReconcileStore.
func (g *Guard) Unscheduled(ctx context.Context, prefix string, limit int) (keys []string, err error) {
	err = g.do(func(s *Store) error {
		keys, err = s.Unscheduled(ctx, prefix, limit)
		return err
	})
	return keys, err
}

// DueLookups implements store.ReconcileStore.
func (g *Guard) DueLookups(ctx context.Context, limit int) (keys []string, err error) {
	err = g.do(func(s *Store) error {
		keys, err = s.DueLookups(ctx, limit)
		return err
	})
	return keys, err
}

// ClaimLookup implements store.ReconcileStore.
func (g *Guard) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error {
	return g.do(func(s *Store) error { return s.ClaimLookup(ctx, key, token, lease, force) })
}

// ResolveLookup implements store.ReconcileStore.
func (g *Guard) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) error {
	if res.Applied != nil {
		g.wrote(len(key) + len(res.Applied.Body))
	}
	return g.do(func(s *Store) error { return s.ResolveLookup(ctx, key, token, res) })
}

// UnscheduleLookup implements store.ReconcileStore.
func (g *Guard) UnscheduleLookup(ctx context.Context, key string) error {
	return g.do(func(s *Store) error { return s.UnscheduleLookup(ctx, key) })
}

// Sizes returns the open store's sizes on disk (zero while broken).
func (g *Guard) Sizes() (lsm, vlog int64) {
	g.do(func(s *Store) error { lsm, vlog = s.Sizes(); return nil })
	return lsm, vlog
}

// RunGC runs value-log garbage collection on the open store (Store.RunGC),
// and returns the number of files rewritten: zero while broken.
func (g *Guard) RunGC() (n int) {
	g.do(func(s *Store) error { n = s.RunGC(); return nil })
	return n
}

// Close stops reopening and the stores' background retries, and closes the open store once the
// operations under way on it have returned.
func (g *Guard) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	close(g.stop)
	s := g.cur
	g.cur = nil
	g.mu.Unlock()
	now, cancel := context.WithCancel(context.Background())
	cancel()
	g.settling.Close(now)
	g.done.Wait()
	if s == nil {
		return nil
	}
	if g.broken.Load() {
		_, err := closeWithin(s, 5*time.Second)
		return err
	}
	return closeUnlessFull(s)
}

// closeUnlessFull closes s, but gives up once a file it creates waits for
// disk space (prealloc.Waiting): Badger flushes its memtable into a new
// table when it closes, and retries that for ever, so on a disk that stays
// full the Close would never end, nor the process that waits for it. What
// the memtable holds is in its log, replayed when the store opens; the
// Close is left to finish in the background, should room come back.
func closeUnlessFull(s *guarded) error {
	result := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				result <- fmt.Errorf("badger: panic closing: %v", p)
			}
		}()
		s.ops.Wait()
		result <- s.Close()
	}()
	t := time.NewTicker(closePoll)
	defer t.Stop()
	for {
		select {
		case err := <-result:
			return err
		case <-t.C:
			if prealloc.Waiting() > 0 {
				return errors.New("badger: close abandoned: no room on disk for the memtable's table; its log keeps the writes, replayed when the store opens")
			}
		}
	}
}

// closePoll is how often closeUnlessFull looks for a file waiting for
// space.
const closePoll = time.Second

// closeWithin closes a store that failed, once the operations under way
// on it have returned: such a Badger can hang closing (its directory is
// gone) or panic, and an operation can wait for its writer, so it gets d,
// and is then left to finish in the background. The returned channel is
// closed when the Close ends, also after d.
func closeWithin(s *guarded, d time.Duration) (<-chan struct{}, error) {
	result := make(chan error, 1)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		defer func() {
			if p := recover(); p != nil {
				result <- fmt.Errorf("badger: panic closing: %v", p)
			}
		}()
		s.ops.Wait()
		result <- s.Close()
	}()
	select {
	case err := <-result:
		<-closed
		return closed, err
	case <-time.After(d):
		return closed, errors.New("badger: close of the failed store did not finish")
	}
}

// List implements store.Lister. A bad limit or cursor is refused before
// the store is asked: it is not a fault of the store.
func (g *Guard) List(ctx context.Context, q store.ListQuery) (recs []store.Listed, next string, err error) {
	if _, err := checkList(q); err != nil {
		return nil, "", err // the query's fault, not the store's
	}
	err = g.do(func(s *Store) error {
		recs, next, err = s.List(ctx, q)
		return err
	})
	return recs, next, err
}
