package badger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestAnswersLiveInTheValueLog pins the store's layout: an answer with its
// body is written once to the value log, and the tree, which compactions
// rewrite again and again as the store grows, keeps only its key and a
// pointer; a reservation, which every new key's lookup may find, stays in
// the tree. With answers in the tree (the earlier layout) a million keys
// made a tree of 300 MiB instead of 40.
func TestAnswersLiveInTheValueLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := []byte(`{"chargeId":"ch_0123456789ABCDEFGHIJKLMNOP","orderId":"order-0000000","amount":10,"createdAt":"2026-12-02T01:53:12.123456789Z"}`)
	const n = 20000
	for i := range n {
		k := fmt.Sprintf("charges/-/order-%07d", i)
		res := store.Reservation{Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: strings.Repeat("f", 64), Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Reserve(ctx, k, res); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, res.Token, store.Response{Status: 201, Body: body, BodyStored: true}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// A reservation alone, and its record, small enough for the tree.
	res := store.Reservation{Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: strings.Repeat("f", 64), Lease: time.Minute, TTL: time.Hour}
	if _, err := s.Reserve(ctx, "charges/-/in-flight", res); err != nil {
		t.Fatal(err)
	}
	inFlight, err := (&record{State: store.StateInFlight, Token: res.Token, Fingerprint: res.Fingerprint,
		CreatedAt: time.Now().UnixMilli(), Lease: time.Now().UnixMilli()}).marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(inFlight) >= valueThreshold {
		t.Errorf("a reservation's record takes %d bytes, at or over the value threshold %d: every new key's lookup would read the value log", len(inFlight), valueThreshold)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Compacted, as the tree of a store that has run for a while is: the
	// reservations that commits replaced are dropped. Whether a
	// compaction had run before the close was a matter of timing, and
	// the test failed when none had (reservations and answers' pointers
	// both in the tree).
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	sst, vlog := filesSizeOf(t, dir, ".sst"), filesSizeOf(t, dir, ".vlog")
	mem := filesSizeOf(t, dir, ".mem")
	t.Logf("%d answers: tables %d bytes, value log %d bytes, memtable logs %d bytes", n, sst, vlog, mem)
	// Each answer's record is about 300 bytes; its key and pointer about
	// 60. The tree may also hold reservations not yet compacted away.
	if answers := int64(n) * int64(len(body)); vlog < answers {
		t.Errorf("the value log holds %d bytes, less than the %d bytes of the answers' bodies: the answers are not in it", vlog, answers)
	}
	if sst+mem > vlog/2 {
		t.Errorf("the tree (tables %d bytes, memtable logs %d) is more than half the value log (%d): the answers are in the tree", sst, mem, vlog)
	}
}

// filesSizeOf is the sum of the sizes of dir's files ending in suffix.
func filesSizeOf(t *testing.T, dir, suffix string) int64 {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range matches {
		fi, err := os.Stat(m)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}
