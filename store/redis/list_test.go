package redis

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
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
