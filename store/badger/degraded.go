package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/lograte"
)

// A store that does not open.
//
// When Open fails (a damaged reservation log, a MANIFEST that is missing
// or cannot be read, a permission error, anything Badger's own open
// refuses), OpenGuarded does not fail: it returns a Guard whose store is
// broken, with the reason (OpenFailed), so that the process serves its
// admin listener and its passthrough routes, and protected requests get
// errBroken (503 in the proxy). The Guard tries again: at once when the
// store's files changed (an operator moved damaged segments aside with
// `idemproxy store quarantine`, restored a MANIFEST or fixed permissions),
// and otherwise after a delay that grows to openRetryMax, since each try
// opens Badger (its tables mapped, its logs replayed). Each failure is
// logged, at most once a minute with the count of those left out, saying
// what the operator should run. Nothing is ever started empty in place of
// a store that could not be read: the files stay as they are.

// openRetryMax bounds the delay between two tries to open a store whose
// files did not change.
const openRetryMax = 30 * time.Second

// openLogEvery is how often a failure to open the store is logged (with
// the count of those left out).
const openLogEvery = time.Minute

// openState is the Guard's record of its failed opens.
type openState struct {
	// err is the error of the last try to open the store, nil once it is
	// open (or while the disk is below the floor and it was not tried).
	err atomic.Pointer[error]
	// log is the Guard's logger, limited to one line a minute for each
	// message; remedy is GuardOptions.Remedy.
	log    *slog.Logger
	remedy string

	// Only OpenGuarded, then the watch goroutine, use these.
	opened   bool      // the store was open once in this process
	failures int       // tries that failed in a row
	next     time.Time // when to try again if the files do not change
	seen     string    // the files' fingerprint after the last failure
}

// OpenFailed returns why the store could not be opened, while it is not
// open because the last try to open it (at start, or after a fault)
// failed; nil once it is open, and while it waits for disk space above
// the floor without having tried.
func (g *Guard) OpenFailed() error {
	if p := g.open.err.Load(); p != nil {
		return *p
	}
	return nil
}

// initOpen sets up the record of failed opens.
func (g *Guard) initOpen(remedy string) {
	g.open.log = slog.New(lograte.New(g.opts.Logger.Handler(), lograte.Options{Burst: 1, Interval: openLogEvery}))
	g.open.remedy = remedy
	if g.open.remedy == "" {
		g.open.remedy = "run `idemproxy store check -config FILE` to see what is wrong"
	}
}

// tryOpen opens the store with o, turning a panic in Open into an error.
func tryOpen(o Options) (s *Store, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("badger: open %s: panic: %v", o.Dir, p)
		}
	}()
	return Open(o)
}

// openFailed records that opening the store failed with err: the store is
// broken, OpenFailed says why, and the next try waits until the store's
// files change or a delay doubling up to openRetryMax has passed.
func (g *Guard) openFailed(err error) {
	g.lastErr.Store(&err)
	g.open.err.Store(&err)
	g.broken.Store(true)
	g.open.failures++
	wait := min(guardRetry<<min(g.open.failures-1, 5), openRetryMax)
	if inUse(err) {
		// Another process holds the directory (a replica being replaced
		// on the same volume): trying costs nothing, and its end does not
		// show in the files.
		wait = guardRetry
	}
	g.open.next = time.Now().Add(wait)
	g.open.seen = filesFingerprint(g.opts.Dir)
	g.open.log.Error("the badger store could not be opened: protected routes answer 503 store-unavailable, passthrough routes are served, and opening is tried again when its files change",
		"dir", g.opts.Dir, "err", err, "attempts", g.open.failures, "next_attempt_in", wait.String(), "remedy", g.open.remedy)
}

// inUse reports whether err is Badger's refusal of a directory another
// process holds (its flock), which it wraps as text.
func inUse(err error) bool {
	return errors.Is(err, errInUse) || errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "Another process is using this Badger database")
}

// opened records that the store is open.
func (g *Guard) opened() {
	if g.open.failures > 0 {
		g.opts.Logger.Info("the badger store opened after failing to", "dir", g.opts.Dir, "failed_attempts", g.open.failures)
	}
	g.open.err.Store(nil)
	g.open.opened = true
	g.open.failures = 0
	g.open.seen = ""
}

// openDue reports whether the store may be tried again: no try failed,
// or the last one failed for want of room (roomSinceNoRoom decides), or
// the store's files changed since, or the delay has passed.
func (g *Guard) openDue(now time.Time) bool {
	if g.open.failures == 0 || g.noRoom || !now.Before(g.open.next) {
		return true
	}
	return filesFingerprint(g.opts.Dir) != g.open.seen
}

// filesFingerprint describes the store directory's files (names, sizes,
// modes, times) and its reservation log's and quarantine's, so that a
// change an operator made is seen within a second. Errors are part of it:
// a directory that becomes readable changes it.
func filesFingerprint(dir string) string {
	var b strings.Builder
	for _, d := range []string{dir, filepath.Join(dir, walDirName), filepath.Join(dir, quarantineDirName)} {
		fi, err := os.Stat(d)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", d, err)
			continue
		}
		fmt.Fprintf(&b, "%s %v %d\n", d, fi.Mode(), fi.ModTime().UnixNano())
		ents, err := os.ReadDir(d)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", d, err)
			continue
		}
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				fmt.Fprintf(&b, " %s: %v\n", e.Name(), err)
				continue
			}
			fmt.Fprintf(&b, " %s %v %d %d\n", e.Name(), info.Mode(), info.Size(), info.ModTime().UnixNano())
		}
	}
	return b.String()
}

// checkOptions refuses the options Open refuses whatever the files hold:
// OpenGuarded returns those errors rather than start broken.
func checkOptions(o Options) error {
	if o.Dir == "" {
		return errors.New("badger: a data directory is required")
	}
	if o.GCInterval < 0 {
		return fmt.Errorf("badger: gc interval %v is negative", o.GCInterval)
	}
	return nil
}

// noteQuarantine logs, at start, that the store's directory holds log
// segments an operator set aside (Quarantine): their reservations are not
// in the store, so retries of those requests may have been forwarded
// again.
func noteQuarantine(log *slog.Logger, dir string) {
	qdir := filepath.Join(dir, quarantineDirName)
	sets, err := os.ReadDir(qdir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		log.Warn("the store's quarantine directory cannot be read", "dir", qdir, "err", err)
		return
	}
	var segments int
	var names []string
	for _, s := range sets {
		names = append(names, s.Name())
		if segs, err := os.ReadDir(filepath.Join(qdir, s.Name())); err == nil {
			segments += len(segs)
		}
	}
	log.Warn("the store's directory holds reservation log segments set aside by `idemproxy store quarantine`: requests whose reservations they held may have been forwarded again; remove the directory once the upstream was checked",
		"dir", qdir, "quarantines", len(sets), "segments", segments, "names", strings.Join(names, ","))
}
