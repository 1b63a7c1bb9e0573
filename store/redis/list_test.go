package redis

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestListConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storetest.RunList(t, func(t *testing.T) storetest.ListStore {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	// On a Cluster a listing goes through the masters one after the other.
	c := redistest.StartCluster(t, 3)
	t.Run("cluster", func(t *testing.T) {
		storetest.RunList(t, func(t *testing.T) storetest.ListStore {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
}

// TestListPagesAcrossNodes lists with one SCAN of one key per call, so
// that pages end at every place a walk can: inside a node's scan, at the
// end of a node, and at the end of the last one; every key is listed
// once, on a single node and on a Cluster.
func TestListPagesAcrossNodes(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	single := redistest.Start(t)
	for name, opts := range map[string]Options{"single": {Addrs: []string{single.Addr()}}, "cluster": {Addrs: c.Addrs()}} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, opts)
			want := map[string]bool{}
			for i := range 30 {
				k := store.Key("walk", "", fmt.Sprintf("k%02d", i))
				if _, err := s.Reserve(ctx(t), k, res); err != nil {
					t.Fatal(err)
				}
				want[k] = true
			}
			q := store.ListQuery{Prefix: "walk/", Limit: 2}
			got := map[string]int{}
			for calls := 0; ; calls++ {
				if calls > 10000 {
					t.Fatal("more than 10000 calls")
				}
				cur, err := decodeListCursor(q.Cursor, q.Prefix)
				if err != nil {
					t.Fatal(err)
				}
				nodes, err := s.nodesWithin(ctx(t))
				if err != nil {
					t.Fatal(err)
				}
				i, found := slices.BinarySearchFunc(nodes, cur.Node, func(n listNode, addr string) int { return strings.Compare(n.addr, addr) })
				if !found && q.Cursor != "" {
					t.Fatalf("cursor names node %q, not a master", cur.Node)
				}
				recs, next, err := s.list(ctx(t), q, cur, nodes, i, 1, 1)
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) > q.Limit {
					t.Fatalf("%d records, limit %d", len(recs), q.Limit)
				}
				for _, r := range recs {
					got[r.Key]++
				}
				if next == "" {
					break
				}
				q.Cursor = next
			}
			for k := range want {
				if got[k] != 1 {
					t.Errorf("%s listed %d times, want once", k, got[k])
				}
			}
			if len(got) != len(want) {
				t.Errorf("listed %d keys, want %d", len(got), len(want))
			}
		})
	}
}

// TestListSkipsKeysScanReturnsTwice: SCAN returns keys again when the
// node's hash table shrinks between two calls (other keys removed
// meanwhile); a listing still lists no key twice. The walk lists pages of
// one SCAN each, then the other keys are deleted and Redis shrinks its
// table (DEBUG HTSTATS shows it), then the walk goes on: the buckets SCAN
// visits next hold keys of buckets it had visited.
func TestListSkipsKeysScanReturnsTwice(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	want := map[string]bool{}
	for i := range 4000 {
		k := store.Key("dup", "", fmt.Sprintf("k%04d", i))
		if _, err := s.Reserve(c, k, res); err != nil {
			t.Fatal(err)
		}
		want[k] = true
	}
	const fillers = 40000
	pipe := raw.Pipeline()
	for i := range fillers {
		pipe.Set(c, fmt.Sprintf("other:%d", i), "x", 0)
	}
	if _, err := pipe.Exec(c); err != nil {
		t.Fatal(err)
	}
	big := tableSize(t, srv)

	got := map[string]int{}
	q := store.ListQuery{Prefix: "dup/", Limit: 1000}
	for page := 0; ; page++ {
		if page == 100 {
			// The other keys go: Redis shrinks the table (serverCron).
			pipe := raw.Pipeline()
			for i := range fillers {
				pipe.Del(c, fmt.Sprintf("other:%d", i))
			}
			if _, err := pipe.Exec(c); err != nil {
				t.Fatal(err)
			}
			// serverCron shrinks it within a second on an idle machine;
			// a CI run waited more than 30 s for it. Past 10 s, DEBUG
			// RELOAD rebuilds the table at the size of what is left: to
			// the SCAN cursor, the same smaller table.
			deadline := time.Now().Add(10 * time.Second)
			for tableSize(t, srv) >= big/8 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if tableSize(t, srv) >= big/8 {
				if _, err := srv.Do("DEBUG", "RELOAD"); err != nil {
					t.Fatalf("DEBUG RELOAD: %v", err)
				}
			}
			if n := tableSize(t, srv); n >= big/8 {
				stats, _ := srv.Do("DEBUG", "HTSTATS", "0")
				t.Fatalf("the table did not shrink from %d (now %d):\n%s", big, n, stats)
			}
		}
		// One SCAN of about 20 buckets per call: pages end between SCANs.
		cur, err := decodeListCursor(q.Cursor, q.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := s.nodesWithin(c)
		if err != nil {
			t.Fatal(err)
		}
		recs, next, err := s.list(c, q, cur, nodes, 0, 20, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got[r.Key]++
		}
		if next == "" {
			break
		}
		q.Cursor = next
	}
	if len(got) < len(want)/2 {
		t.Fatalf("listed %d keys of %d", len(got), len(want))
	}
	for k, n := range got {
		if n != 1 {
			t.Errorf("%s listed %d times, want once", k, n)
		}
	}
}

// tableSize returns the size of database 0's main hash table (DEBUG
// HTSTATS), after any rehashing.
func tableSize(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	out, err := srv.Do("DEBUG", "HTSTATS", "0")
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "table size:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			size = max(size, n)
		}
	}
	if size == 0 {
		t.Fatalf("DEBUG HTSTATS 0 shows no table size: %q", out)
	}
	return size
}

// TestListCursorSeenIsBounded: a cursor remembering more keys than a
// listing ever carries, or a broken hash, is not one the store returned.
func TestListCursorSeenIsBounded(t *testing.T) {
	t.Parallel()
	for name, seen := range map[string][]byte{
		"too many": make([]byte, 8*(maxSeen+1)),
		"partial":  make([]byte, 12),
	} {
		c := listCursor{Prefix: "p/", Seen: seen}.encode()
		if _, err := decodeListCursor(c, "p/"); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("%s: decodeListCursor = %v, want ErrBadCursor", name, err)
		}
	}
	ok := listCursor{Prefix: "p/", Seen: make([]byte, 8*maxSeen)}.encode()
	if _, err := decodeListCursor(ok, "p/"); err != nil {
		t.Errorf("a full cursor: %v", err)
	}
}
