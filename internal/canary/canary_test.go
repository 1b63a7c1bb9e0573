package canary_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/canary"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/redis"
)

// losses records what the canaries told.
type losses struct{ reasons []string }

func (l *losses) lost(reason string) bool { l.reasons = append(l.reasons, reason); return true }

func openBadger(t *testing.T) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestCanariesOnBadger: on a store that keeps what it is given, rounds of
// canaries write and read back without an alarm; canaries are no route's
// keys (a listing of a route does not show them); and canaries written
// under an epoch an operator has since replaced are not judged.
func TestCanariesOnBadger(t *testing.T) {
	st := openBadger(t)
	var l losses
	epoch := "e1"
	c := canary.New(canary.Options{Store: st, Interval: time.Second, Epoch: func() string { return epoch }, Lost: l.lost})
	ctx := context.Background()
	for range 6 {
		if c.Round(ctx, false) {
			t.Fatalf("a round saw a loss on a store that lost nothing: %q", l.reasons)
		}
	}
	s := c.Stats()
	if s.Places != 1 || s.Writes != 6 || s.OK < 5 || s.Missing != 0 || s.WriteErrors+s.ReadErrors != 0 {
		t.Errorf("Stats = %+v, want 1 place, 6 written, 5 or more read back, nothing missing", s)
	}
	recs, _, err := st.List(ctx, store.ListQuery{Prefix: "canary/", Limit: 100})
	if err != nil || len(recs) != 0 {
		t.Errorf("List(canary/) = %v, %v; want no record: canaries are under %s", recs, err, canary.Prefix)
	}
	// No epoch trusted: nothing written, nothing judged.
	epoch = ""
	if c.Round(ctx, false) || c.Stats().Writes != 6 {
		t.Errorf("a round without a trusted epoch wrote or judged: %+v", c.Stats())
	}
	epoch = "e2"
	if c.Round(ctx, true) || len(l.reasons) != 0 {
		t.Errorf("canaries of an earlier epoch were judged: %q", l.reasons)
	}
}

// TestReleaseMarks: a release mark says a key was released on purpose; a
// second mark of the same key replaces the first.
func TestReleaseMarks(t *testing.T) {
	st := openBadger(t)
	ctx := context.Background()
	for range 2 {
		if err := canary.MarkReleased(ctx, st, "charges/-/ORD-1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for key, want := range map[string]bool{"charges/-/ORD-1": true, "charges/-/ORD-2": false} {
		if got, err := canary.Released(ctx, st, key); err != nil || got != want {
			t.Errorf("Released(%s) = %v, %v; want %v", key, got, err, want)
		}
	}
}

// TestCanaryOnEveryClusterMaster: on a Redis Cluster the canaries are
// written on every master (one hash tag each), so a master that loses its
// data while the others (and the epoch marker's) keep theirs is seen: the
// round after a FLUSHALL of each master in turn names the canary lost.
func TestCanaryOnEveryClusterMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	st, err := redis.New(redis.Options{Addrs: cl.Addrs(), KeyPrefix: "canary-test:", DialTimeout: time.Second, OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	tags, err := st.CanaryTags(ctx, canary.Prefix+"canary/")
	if err != nil || len(tags) != 3 {
		t.Fatalf("CanaryTags = %q, %v; want one tag for each of the 3 masters", tags, err)
	}
	for _, node := range cl.Nodes {
		var l losses
		c := canary.New(canary.Options{Store: st, Interval: time.Second, Epoch: func() string { return "e1" }, Lost: l.lost,
			Tags: func(ctx context.Context) ([]string, error) { return st.CanaryTags(ctx, canary.Prefix+"canary/") }})
		for range 2 {
			if c.Round(ctx, false) {
				t.Fatalf("a round saw a loss before any: %q", l.reasons)
			}
		}
		if s := c.Stats(); s.Places != 3 || s.Writes != 6 {
			t.Fatalf("Stats = %+v, want 3 places, 6 canaries written", s)
		}
		if _, err := node.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		if !c.Round(ctx, true) || len(l.reasons) != 1 || !strings.Contains(l.reasons[0], "is missing on the part of the store that holds {c") {
			t.Errorf("after FLUSHALL of master %s: lost %q, want one canary missing, naming its tag", node.Addr(), l.reasons)
		}
	}
}

// TestCanariesAfterSuspend: a host suspended longer than a canary's TTL
// (a laptop asleep, a VM paused) wakes with its monotonic clock stopped
// while the store's went on and expired every canary: that is no loss,
// and no round marks the store lost. The same canaries gone without the
// suspend are one.
func TestCanariesAfterSuspend(t *testing.T) {
	rd := redistest.Start(t)
	st, err := redis.New(redis.Options{Addrs: []string{rd.Addr()}, KeyPrefix: "canary-test:", DialTimeout: time.Second, OpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, suspended := range []bool{true, false} {
		var l losses
		c := canary.New(canary.Options{Store: st, Interval: time.Second, Epoch: func() string { return "e1" }, Lost: l.lost})
		for range 3 {
			if c.Round(ctx, false) {
				t.Fatalf("a round saw a loss before any: %q", l.reasons)
			}
		}
		if suspended {
			// Asleep for twice the TTL: the store expired the canaries.
			canary.StepWall(c, 2*canary.TTL(time.Second))
		}
		if _, err := rd.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		lost := c.Round(ctx, true)
		if suspended && (lost || len(l.reasons) != 0) {
			t.Errorf("after a suspend longer than the canaries' TTL: lost %q, want no loss", l.reasons)
		}
		if !suspended && (!lost || len(l.reasons) != 1) {
			t.Errorf("canaries gone within their TTL: lost %q, want one loss", l.reasons)
		}
	}
}
