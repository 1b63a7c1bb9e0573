//go:build linux

package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/chaos/check"
)

// lockedBuffer is the run's log, written by the run's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPowerLoss is the chaos run's power-loss fault in short: the real
// idemproxy on Badger (sync_writes: true), its data directory on the
// power-loss file system this test serves (internal/testenv/powerloss), clients
// charging, and the power cut at seeded random points, each followed by a
// remount and a restart on what survived. The checker then reads the
// history and the stub's statement: no key charged twice (property 1), no
// answered key forwarded again (3), each key's history a path of its state
// machine with a cut undoing only what was not synced (4), and an answer
// that a later synced reservation covered replayed after every cut, never
// in doubt (7). It needs root and /dev/fuse, and fails without them.
//
// The long form: IDEMPROXY_POWERLOSS_DURATION=5m (60 or so cuts), with
// IDEMPROXY_POWERLOSS_WRITEBACK=0.5 for a disk that kept half the pages
// not synced, IDEMPROXY_POWERLOSS_HARSH=1 for names durable only by their
// directory's fsync; IDEMPROXY_POWERLOSS_SEED replays a seed, as does
// go run ./chaos -stores badger -faults power-loss -seed S -duration D.
func TestPowerLoss(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("the power-loss test needs root (a FUSE mount and a tmpfs)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("the power-loss test needs /dev/fuse: %v", err)
	}
	duration := 30 * time.Second
	if v := os.Getenv("IDEMPROXY_POWERLOSS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("IDEMPROXY_POWERLOSS_DURATION: %v", err)
		}
		duration = d
	}
	seed := rand.Int64N(1<<53) + 1
	if v := os.Getenv("IDEMPROXY_POWERLOSS_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("IDEMPROXY_POWERLOSS_SEED: %v", err)
		}
		seed = s
	}
	var writeback float64
	if v := os.Getenv("IDEMPROXY_POWERLOSS_WRITEBACK"); v != "" {
		w, err := strconv.ParseFloat(v, 64)
		if err != nil || w < 0 || w > 1 {
			t.Fatalf("IDEMPROXY_POWERLOSS_WRITEBACK: %q is not a share from 0 to 1", v)
		}
		writeback = w
	}
	harsh := os.Getenv("IDEMPROXY_POWERLOSS_HARSH") == "1"
	out, err := os.MkdirTemp("", "idemproxy-powerloss-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, %v of load, writeback %v, harsh %v (again: IDEMPROXY_POWERLOSS_SEED=%d IDEMPROXY_POWERLOSS_DURATION=%v IDEMPROXY_POWERLOSS_WRITEBACK=%v); folder %s",
		seed, duration, writeback, harsh, seed, duration, writeback, out)

	var log lockedBuffer
	r := &run{opts: options{seed: seed, duration: duration, out: out, stores: []string{"badger"}, clients: 4, kinds: []string{kPowerLoss}, writeback: writeback, harsh: harsh,
		interval: 2 * time.Second}, // as before the CI form grew denser: a cut every few seconds
		out: out, log: &log}
	t.Cleanup(r.stopAll)
	ctx, cancel := context.WithTimeout(context.Background(), duration+6*time.Minute)
	defer cancel()
	violations, err := r.execute(ctx)
	r.stopAll()
	t.Logf("the run's log:\n%s", log.String())
	if err != nil {
		t.Fatalf("the run failed (history and logs in %s): %v", out, err)
	}
	c := r.res.Cuts
	t.Logf("%v", c)
	if violations > 0 {
		t.Errorf("%d violations (the run's log above; history, proxy log b0.log and violations.txt in %s)", violations, out)
	}
	if c.Cuts < 3 || r.inj.applied[kPowerLoss] != c.Cuts {
		t.Errorf("%d power cuts in the history, %d applied; want 3 or more, all recorded", c.Cuts, r.inj.applied[kPowerLoss])
	}
	// The properties were exercised: answers went through cuts, and some
	// were covered by a sync before theirs (property 7 had keys to check).
	if c.Answered == 0 || c.Synced == 0 || c.SyncedReplayed == 0 {
		t.Errorf("no answered key went through a cut covered by a sync: the run checked nothing (%v)", c)
	}
	for _, v := range r.res.Violations {
		if v.Property == check.PropChargedOnce {
			t.Errorf("charged twice: %v", v)
		}
	}
	if !t.Failed() {
		os.RemoveAll(out)
	}
}

// TestOperationsSaysWhatAPowerCutCosts checks that docs/operations.md
// states what TestPowerLoss checks, in the words it checks: each promise
// with the property of the checker that holds the run to it.
func TestOperationsSaysWhatAPowerCutCosts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	const heading = "### What a power cut costs"
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/operations.md has no section %q", heading)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	sec = strings.Join(strings.Fields(sec), " ")
	for _, tt := range []struct {
		says     string
		property int // the checker's property that holds the run to it; 0: the run's set-up
	}{
		{"With `sync_writes: true` it can cost this, and no more", 0},
		{"**An acknowledged reservation survives or its key is in doubt.**", check.PropLinearizable},
		{"never forwarded again and never charged twice", check.PropChargedOnce},
		{"**An answer a client received is replayed, unless the power went before the next sync.**", check.PropPowerCut},
		{"An answer received before a later request was forwarded is on disk", check.PropPowerCut},
		{"may come back in doubt, never forwarded again", check.PropNothingLost},
		{"value-log garbage collection", 0},
		{"**Unsynced Badger state is rebuilt from the log.**", 0},
		{"`go run ./chaos -stores badger -faults " + kPowerLoss + "`", 0},
		{"`TestPowerLoss` (`chaos/`)", 0},
	} {
		if !strings.Contains(sec, tt.says) {
			t.Errorf("%q does not say %q (property %d)", heading, tt.says, tt.property)
		}
	}
}
