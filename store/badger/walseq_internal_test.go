package badger

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// appliedOf returns the sequence number Badger holds for the log.
func appliedOf(t *testing.T, s *Store) uint64 {
	t.Helper()
	var seq uint64
	if err := s.db.View(func(txn *bdg.Txn) error {
		var err error
		seq, err = readApplied(txn)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return seq
}

// crashCopy is the store in dir as a power loss may leave it: Badger's
// files as in badgerFiles (a copy taken earlier, or dir itself), the log
// as in logDir.
func crashCopy(t *testing.T, badgerFiles, logDir string) string {
	t.Helper()
	crashed := filepath.Join(t.TempDir(), "crashed")
	copyFiles(t, badgerFiles, crashed)
	copyDir(t, logDir, filepath.Join(crashed, walDirName))
	return crashed
}

// TestBadgerAheadOfLog: after a power loss Badger's files may hold writes
// past the log's synced tail (the kernel writes mapped pages back when it
// likes). A reservation synced to the log, then its commit (or its
// release) applied in Badger and Badger's files on disk, with the log's
// segment as before the commit: the store opens with the commit's 2xx
// answer, not the reservation replayed over it and the key in doubt. A
// release leaves no record to compare with (a deleted key reads as one
// Badger lost), so the reservation comes back, in doubt: never forwarded
// again, as the docs allow for a release no sync covered.
func TestBadgerAheadOfLog(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"commit", "release"} {
		t.Run(end, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			const k = "pay/-/charge"
			if _, err := s.Reserve(ctx, k, store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			logBefore := filepath.Join(t.TempDir(), "log")
			copyDir(t, filepath.Join(dir, walDirName), logBefore) // the reservation, synced
			resp := store.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`), BodyStored: true}
			if end == "commit" {
				err = s.Commit(ctx, k, "t", resp, time.Hour)
			} else {
				err = s.Release(ctx, k, "t")
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := syncBadger(dir); err != nil { // the kernel's writeback
				t.Fatal(err)
			}
			crashed := crashCopy(t, dir, logBefore)

			r, err := Open(Options{Dir: crashed, SyncWrites: true})
			if err != nil {
				t.Fatalf("Open with Badger ahead of the log: %v", err)
			}
			defer r.Close()
			got, err := r.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			want := "completed " + string(resp.Body)
			if end == "release" {
				want = "in_doubt"
			}
			if g := stateBody(got); g != want {
				t.Errorf("%s after the power loss = %s, want %s (a client that had its answer must get it again)", k, g, want)
			}
		})
	}
}

func stateBody(r *store.Record) string {
	if r == nil {
		return "none"
	}
	if r.Response == nil {
		return string(r.State)
	}
	return string(r.State) + " " + string(r.Response.Body)
}

// TestSequenceGoesOnAcrossOpens: a store opened, written, crashed (Badger
// as at its last checkpoint, the log as it is) or closed, and reopened,
// six times over: every reservation synced before each crash is there
// after it.
// Sequence numbers restarting at each open would make the next replay
// skip the new records as already applied.
func TestSequenceGoesOnAcrossOpens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	var lastSeq uint64
	for round := range 6 {
		s, err := Open(Options{Dir: dir, SyncWrites: true, checkpointEvery: -1})
		if err != nil {
			t.Fatalf("round %d: Open: %v", round, err)
		}
		if seq := s.w.wal.seq; seq <= lastSeq {
			t.Errorf("round %d: the log begins at sequence %d, not after %d, the last one written", round, seq, lastSeq)
		}
		if a := appliedOf(t, s); a+1 != s.w.wal.seq {
			t.Errorf("round %d: Badger holds sequence %d, the log begins at %d; want the one after it", round, a, s.w.wal.seq)
		}
		for j := range round {
			got, err := s.Get(ctx, fmt.Sprintf("pay/-/crashed-%d", j))
			if err != nil || got == nil || got.State != store.StateInDoubt {
				t.Errorf("round %d: the reservation synced before crash %d = %+v, %v; want it in doubt", round, j, got, err)
			}
		}
		// Writes Badger has durably (a checkpoint), then one it has not.
		for i := range 10 {
			k := fmt.Sprintf("pay/-/r%d-%d", round, i)
			if _, err := s.Reserve(ctx, k, res); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, k, "t", resp, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.checkpoint(); err != nil {
			t.Fatal(err)
		}
		snapshot := filepath.Join(t.TempDir(), "badger")
		copyDir(t, dir, snapshot)
		if _, err := s.Reserve(ctx, fmt.Sprintf("pay/-/crashed-%d", round), res); err != nil {
			t.Fatal(err)
		}
		lastSeq = s.w.wal.seq - 1
		if round%2 == 1 {
			// A clean stop: the log is kept and replayed at the next open.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		dir = crashCopy(t, snapshot, filepath.Join(dir, walDirName))
		s.Close()
	}
}

// TestAppliedKeyIsNoRecord: the applied sequence number, a key of
// Badger's, is never listed, scheduled or turned in doubt, and survives
// the in-flight scan at open.
func TestAppliedKeyIsNoRecord(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Reserve(ctx, "pay/-/a", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if appliedOf(t, s) == 0 {
		t.Fatal("no applied sequence number after a reservation")
	}
	s.Close()
	s, err = Open(Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, q := range []store.ListQuery{{Limit: 100}, {Limit: 100, State: store.StateInDoubt}} {
		got, _, err := s.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Key != "pay/-/a" {
			t.Errorf("List(%+v) = %+v, want only pay/-/a", q, got)
		}
	}
	due, err := s.Unscheduled(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range due {
		if k != "pay/-/a" {
			t.Errorf("Unscheduled lists %q", k)
		}
	}
	if appliedOf(t, s) == 0 {
		t.Error("the applied sequence number is gone after a reopen")
	}
}
