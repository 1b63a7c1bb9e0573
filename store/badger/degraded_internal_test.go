package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// closedWithRecords opens a store in dir with SyncWrites, reserves and
// commits n keys pay/-/k0... one at a time (a log record each) and closes
// it: the reservation log is left for the next open.
func closedWithRecords(t *testing.T, dir string, n int) {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	writeRecords(t, s, n)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeRecords reserves and commits n keys pay/-/k0... in s, one at a time.
func writeRecords(t *testing.T, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprintf("pay/-/k%d", i)
		res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Reserve(ctx, key, res); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, key, "tok", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// cutWithRecords is closedWithRecords leaving dir as a power cut can:
// Badger's files from before the writes, the reservation log with all of
// them. The next open replays them from the log, so damage to it matters
// (damage among records Badger holds is passed over).
func cutWithRecords(t *testing.T, dir string, n int) {
	t.Helper()
	s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	early := filepath.Join(t.TempDir(), "early")
	copyDir(t, dir, early)
	writeRecords(t, s, n)
	logDir := filepath.Join(t.TempDir(), "log")
	copyDir(t, filepath.Join(dir, walDirName), logDir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	copyDir(t, early, dir)
	copyDir(t, logDir, filepath.Join(dir, walDirName))
}

// damageLog flips a byte in the middle of the records of the store's
// newest log segment that holds records: valid records synced after the
// damaged one follow it, so it is damage, not a torn tail. It returns the
// function that undoes it.
func damageLog(t *testing.T, dir string) (undo func()) {
	t.Helper()
	wdir := filepath.Join(dir, walDirName)
	nums, err := walSegments(wdir)
	if err != nil || len(nums) == 0 {
		t.Fatalf("no reservation log segments in %s (%v): the test proves nothing", wdir, err)
	}
	for i := len(nums) - 1; i >= 0; i-- {
		name := filepath.Join(wdir, segmentName(nums[i]))
		orig, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(orig) < 4 || bytes.Equal(orig[:4], make([]byte, 4)) {
			continue // a spare: no records
		}
		end := len(orig) - 1
		for end > 0 && orig[end] == 0 {
			end--
		}
		bad := bytes.Clone(orig)
		bad[end/2] ^= 0x5a
		if err := os.WriteFile(name, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := os.WriteFile(name, orig, 0o600); err != nil {
				t.Error(err)
			}
		}
	}
	t.Fatalf("no reservation log segment holds records in %s", wdir)
	return nil
}

// flipFile flips the byte at off (negative: from the end) of path and
// returns the function that restores it.
func flipFile(t *testing.T, path string, off int) (undo func()) {
	t.Helper()
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += len(orig)
	}
	bad := bytes.Clone(orig)
	bad[off] ^= 0x5a
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Error(err)
		}
	}
}

// moveAside renames path to path+".away" and returns the function that
// puts it back.
func moveAside(t *testing.T, path string) (undo func()) {
	t.Helper()
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Rename(path+".away", path); err != nil {
			t.Error(err)
		}
	}
}

// syncLog is a log handler's output that tests read while the Guard
// writes.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestGuardStartsDegradedOnAStoreThatDoesNotOpen: a store that cannot be
// opened (its log damaged, its MANIFEST damaged or missing beside its
// data, its directory not a directory) does not make OpenGuarded fail,
// which made the process exit before its admin listener started, in a
// crash loop: the Guard starts broken, says why, refuses every operation,
// leaves the files as they are, and opens the store, with its keys,
// without a restart once an operator repaired it.
func TestGuardStartsDegradedOnAStoreThatDoesNotOpen(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string) (undo func())
		reason string // in OpenFailed's error
		// prepare makes the store: closedWithRecords when nil.
		prepare func(t *testing.T, dir string, n int)
	}{
		{"damaged reservation log", damageLog, "reservation log", cutWithRecords},
		{"damaged MANIFEST", func(t *testing.T, dir string) func() {
			return flipFile(t, filepath.Join(dir, "MANIFEST"), -3)
		}, "manifest", nil},
		{"MANIFEST missing beside tables", func(t *testing.T, dir string) func() {
			return moveAside(t, filepath.Join(dir, "MANIFEST"))
		}, "no MANIFEST", nil},
		{"data directory is a file", func(t *testing.T, dir string) func() {
			undo := moveAside(t, dir)
			if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := os.Remove(dir); err != nil {
					t.Error(err)
				}
				undo()
			}
		}, "not a directory", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			prepare := c.prepare
			if prepare == nil {
				prepare = closedWithRecords
			}
			prepare(t, dir, 200)
			files := storeFiles(t, dir)
			undo := c.damage(t, dir)
			var logs syncLog
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			g, err := OpenGuarded(Options{Dir: dir, SyncWrites: true, Logger: log}, GuardOptions{Remedy: "run the check"})
			if err != nil {
				t.Fatalf("OpenGuarded = %v; want a Guard that starts broken", err)
			}
			defer g.Close()
			ctx := context.Background()
			why := g.OpenFailed()
			if why == nil || !strings.Contains(strings.ToLower(why.Error()), strings.ToLower(c.reason)) {
				t.Fatalf("OpenFailed = %v; want the reason, naming %q", why, c.reason)
			}
			res := store.Reservation{Token: "t2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			if _, err := g.Reserve(ctx, "pay/-/new", res); !errors.Is(err, errBroken) {
				t.Errorf("Reserve = %v; want ErrBroken (503)", err)
			}
			if _, err := g.Get(ctx, "pay/-/k0"); !errors.Is(err, errBroken) {
				t.Errorf("Get = %v; want ErrBroken", err)
			}
			if err := g.Ping(ctx); err == nil {
				t.Error("Ping = nil; want the store reported unavailable")
			}
			if !strings.Contains(logs.String(), "the badger store could not be opened") || !strings.Contains(logs.String(), "run the check") {
				t.Errorf("log %s; want the failure logged with the remedy", logs.String())
			}
			undo()
			got := storeFiles(t, dir)
			for name, size := range files {
				if _, ok := got[name]; strings.HasSuffix(name, ".vlog") && ok {
					// Badger's own close cuts a value-log file to what it
					// holds (after a refused log, it was open).
					continue
				}
				if got[name] != size {
					t.Errorf("%s after the failed opens: %d bytes, want %d, kept as it was (all files now: %v)", name, got[name], size, got)
				}
			}
			waitUntil(t, "the repaired store opens without a restart", func() bool { return g.Ping(ctx) == nil })
			if g.OpenFailed() != nil {
				t.Errorf("OpenFailed = %v once open; want nil", g.OpenFailed())
			}
			for _, k := range []string{"pay/-/k0", "pay/-/k199"} {
				if rec, err := g.Get(ctx, k); err != nil || rec == nil || rec.State != store.StateCompleted {
					t.Errorf("Get(%s) = %+v, %v; want the committed answer, kept", k, rec, err)
				}
			}
		})
	}
}

// storeFiles lists the table and value-log files of dir with their sizes:
// what a failed open must not delete, cut or start over (a value-log file
// may be cut to what it holds, by Badger's close).
func storeFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	files := map[string]int64{}
	for _, pat := range []string{"*.sst", "*.vlog"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, f := range m {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			files[filepath.Base(f)] = fi.Size()
		}
	}
	if len(files) == 0 {
		t.Fatalf("no table or value-log file in %s: the test proves nothing", dir)
	}
	return files
}

// TestOpenGuardedRefusesInvalidOptions: options that are wrong whatever the
// files hold are still an error, not a broken Guard.
func TestOpenGuardedRefusesInvalidOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{{}, {Dir: t.TempDir(), GCInterval: -time.Second}} {
		if g, err := OpenGuarded(o, GuardOptions{}); err == nil {
			g.Close()
			t.Errorf("OpenGuarded(%+v) = nil error; want the options refused", o)
		}
	}
}

// TestFailedStartTurnsOrphansInDoubt: a store opened by the Guard after
// failing at start holds the previous process's reservations only: those
// left in flight are in doubt at once (nobody will settle them), as on a
// start that opened at first, not kept in flight for their lease as a
// reopen after a fault keeps this process's own.
func TestFailedStartTurnsOrphansInDoubt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	if _, err := s.Reserve(ctx, "pay/-/orphan", res); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	undo := flipFile(t, filepath.Join(dir, "MANIFEST"), -3)
	g, err := OpenGuarded(Options{Dir: dir, SyncWrites: true}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.OpenFailed() == nil {
		t.Fatal("the damaged store opened: the test proves nothing")
	}
	undo()
	waitUntil(t, "the repaired store opens", func() bool { return g.Ping(ctx) == nil })
	rec, err := g.Get(ctx, "pay/-/orphan")
	if err != nil || rec == nil || rec.State != store.StateInDoubt {
		t.Errorf("the previous process's reservation = %+v, %v; want in doubt", rec, err)
	}
}

// TestOpenRetryWaitsForAChange: after failures in a row, the store is not
// opened again before its delay unless its files changed: a change (a
// quarantine, a restored file) is tried within a second, while an
// unchanged store is not opened (tables mapped, logs read) every second
// for as long as nobody repairs it.
func TestOpenRetryWaitsForAChange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithRecords(t, dir, 3)
	flipFile(t, filepath.Join(dir, "MANIFEST"), -3)
	g, err := OpenGuarded(Options{Dir: dir}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g.Close() // the watch goroutine stopped: the test drives openDue
	for range 6 {
		g.openFailed(g.OpenFailed())
	}
	now := time.Now()
	if g.openDue(now) {
		t.Errorf("after 7 failures, due at once with nothing changed; want it to wait")
	}
	if wait := g.open.next.Sub(now); wait < 20*time.Second || wait > openRetryMax {
		t.Errorf("next try in %v; want the delay grown to about %v", wait, openRetryMax)
	}
	if !g.openDue(g.open.next) {
		t.Errorf("not due once the delay passed")
	}
	if err := os.WriteFile(filepath.Join(dir, walDirName, "restored"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !g.openDue(now) {
		t.Errorf("not due after the log directory changed; want a try at once")
	}
}

// TestStartNotesAQuarantine: a start on a store whose directory holds set
// aside log segments says so, with their count: the reservations they
// held are not in the store.
func TestStartNotesAQuarantine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	q := filepath.Join(dir, quarantineDirName, "20261203T170000Z")
	if err := os.MkdirAll(q, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{segmentName(3), segmentName(4)} {
		if err := os.WriteFile(filepath.Join(q, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncLog
	g, err := OpenGuarded(Options{Dir: dir, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.OpenFailed() != nil {
		t.Fatalf("OpenFailed = %v; a quarantine directory must not keep the store from opening", g.OpenFailed())
	}
	out := logs.String()
	if !strings.Contains(out, "set aside by `idemproxy store quarantine`") || !strings.Contains(out, `"segments":2`) {
		t.Errorf("log %s; want the quarantine noted with its 2 segments", out)
	}
}

// waitUntil waits for cond, failing the test if it does not hold within a
// minute (a loaded machine).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// TestGuardOpensOnceTheDirectoryIsReleased: a directory held by another
// process (a replica being replaced on the same volume) is tried again
// every second, not after a growing delay: its release does not show in
// the files.
func TestGuardOpensOnceTheDirectoryIsReleased(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithRecords(t, dir, 1)
	unlock, err := LockDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := OpenGuarded(Options{Dir: dir}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	lockErr := g.OpenFailed()
	if lockErr == nil || !inUse(lockErr) {
		t.Fatalf("OpenFailed = %v; want the directory in use", lockErr)
	}
	unlock()
	waitUntil(t, "opened once released", func() bool { return g.OpenFailed() == nil })

	// Failures in a row do not stretch the delay, on a record of its own
	// (the Guard's belongs to its watch goroutine).
	r := &Guard{opts: Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)}}
	r.initOpen("")
	for range 7 {
		r.openFailed(lockErr)
	}
	if wait := time.Until(r.open.next); wait > guardRetry {
		t.Errorf("next try in %v after 7 failures in a row; want at most %v", wait, guardRetry)
	}
}
