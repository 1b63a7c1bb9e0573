package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// ListStore is a store that can also list its keys.
type ListStore interface {
	store.Store
	store.Lister
}

// lenv is what a list case gets: the store and a route name of its own
// (and its neighbour route+"2", whose keys share the prefix's letters).
type lenv struct {
	*env
	ls    store.Lister
	route string
}

type listCase struct {
	name string
	run  func(e *lenv)
}

// RunList runs the listing cases (paging, state and key-hash filters,
// prefix isolation, expiry, limits and cursors) against the stores
// newStore returns, like Run.
func RunList(t *testing.T, newStore func(t *testing.T) ListStore) {
	for _, tc := range listCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			e := &lenv{env: &env{t: t, s: s, ctx: ctx, key: newKey(tc.name)}, ls: s, route: "lt" + hex.EncodeToString(b)}
			tc.run(e)
		})
	}
}

// keyIn returns the store key of k on e's route (scope "" for unscoped).
func (e *lenv) keyIn(scope, k string) string { return store.Key(e.route, scope, k) }

// all follows the cursors of q from its first page to its last, checking
// each page's length against q.Limit, and returns the records by key; a
// key listed twice fails the test.
func (e *lenv) all(q store.ListQuery) map[string]store.Listed {
	e.t.Helper()
	out := map[string]store.Listed{}
	q.Cursor = ""
	for page := 0; ; page++ {
		if page > 10000 {
			e.t.Fatalf("List(%+v): more than 10000 pages", q)
		}
		recs, next, err := e.ls.List(e.ctx, q)
		if err != nil {
			e.t.Fatalf("List(%+v): %v", q, err)
		}
		if len(recs) > q.Limit {
			e.t.Fatalf("List(%+v) returned %d records, want at most the limit %d", q, len(recs), q.Limit)
		}
		for _, r := range recs {
			if _, dup := out[r.Key]; dup {
				e.t.Errorf("List(%+v): key %q listed twice", q, r.Key)
			}
			out[r.Key] = r
		}
		if next == "" {
			return out
		}
		q.Cursor = next
	}
}

// wantKeys checks that got holds exactly the keys of want.
func (e *lenv) wantKeys(what string, got map[string]store.Listed, want ...string) {
	e.t.Helper()
	g := slices.Sorted(maps.Keys(got))
	w := slices.Sorted(slices.Values(want))
	if !slices.Equal(g, w) {
		e.t.Errorf("%s: listed %q, want %q", what, g, w)
	}
}

// lapsed reserves key with a short lease and waits until Get reports it
// in doubt.
func (e *lenv) lapsed(key string) {
	e.t.Helper()
	e.reserveOK(key, "tok-l", "fp-l", shortLease, longTTL)
	deadline := time.Now().Add(eventually)
	for {
		if rec := e.getOrNil(key); rec != nil && rec.State == store.StateInDoubt {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%q not in doubt %v after its lease", key, eventually)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// states leaves keys in every state on e's route and returns them by
// state: in flight, completed (201), marked in doubt, and in doubt by a
// lapsed lease, some unscoped and some scoped.
func (e *lenv) states() map[store.State][]string {
	e.t.Helper()
	byState := map[store.State][]string{}
	for i := range 12 {
		scope := ""
		if i%3 == 0 {
			scope = "tenant-a"
		}
		k := e.keyIn(scope, fmt.Sprintf("order-%02d", i))
		e.reserveOK(k, "tok", "fp", longLease, longTTL)
		switch i % 4 {
		case 0:
			byState[store.StateInFlight] = append(byState[store.StateInFlight], k)
		case 1, 2:
			e.commit(k, "tok", store.Response{Status: http.StatusCreated, Body: []byte("ok"), BodyStored: true}, longTTL, nil)
			byState[store.StateCompleted] = append(byState[store.StateCompleted], k)
		case 3:
			e.markInDoubt(k, "tok", longTTL, nil)
			byState[store.StateInDoubt] = append(byState[store.StateInDoubt], k)
		}
	}
	k := e.keyIn("", "lapsed")
	e.lapsed(k)
	byState[store.StateInDoubt] = append(byState[store.StateInDoubt], k)
	return byState
}

var listCases = []listCase{
	{"pages list every key once, within the limit", func(e *lenv) {
		byState := e.states()
		var want []string
		for _, ks := range byState {
			want = append(want, ks...)
		}
		for _, limit := range []int{1, 4, 5, 1000} {
			got := e.all(store.ListQuery{Prefix: e.route + "/", Limit: limit})
			e.wantKeys(fmt.Sprintf("limit %d", limit), got, want...)
		}
	}},
	{"listed records carry their state, times and stored status", func(e *lenv) {
		before := time.Now()
		byState := e.states()
		got := e.all(store.ListQuery{Prefix: e.route + "/", Limit: 100})
		for st, keys := range byState {
			for _, k := range keys {
				l, ok := got[k]
				if !ok {
					e.t.Errorf("%q not listed", k)
					continue
				}
				if l.State != st {
					e.t.Errorf("%q: State = %q, want %q", k, l.State, st)
				}
				if l.CreatedAt.Before(before.Add(-slack)) || l.CreatedAt.After(time.Now().Add(slack)) {
					e.t.Errorf("%q: CreatedAt = %v, want about %v", k, l.CreatedAt, before)
				}
				if !l.ExpiresAt.IsZero() && l.ExpiresAt.Before(time.Now().Add(longTTL-eventually-slack)) {
					e.t.Errorf("%q: ExpiresAt = %v, want about now + %v", k, l.ExpiresAt, longTTL)
				}
				wantLease := st == store.StateInFlight
				if l.LeaseExpiresAt.IsZero() == wantLease {
					e.t.Errorf("%q (%s): LeaseExpiresAt = %v, want it set only in flight", k, st, l.LeaseExpiresAt)
				}
				wantStatus := 0
				if st == store.StateCompleted {
					wantStatus = http.StatusCreated
				}
				if l.StoredStatus != wantStatus {
					e.t.Errorf("%q (%s): StoredStatus = %d, want %d", k, st, l.StoredStatus, wantStatus)
				}
				// Get and List agree.
				if rec := e.get(k); rec.State != l.State {
					e.t.Errorf("%q: Get says %q, List %q", k, rec.State, l.State)
				}
			}
		}
	}},
	{"state filter, a lapsed lease listed in doubt", func(e *lenv) {
		byState := e.states()
		for _, st := range []store.State{store.StateInFlight, store.StateCompleted, store.StateInDoubt} {
			for _, limit := range []int{2, 100} {
				got := e.all(store.ListQuery{Prefix: e.route + "/", State: st, Limit: limit})
				e.wantKeys(fmt.Sprintf("state %s, limit %d", st, limit), got, byState[st]...)
				for k, l := range got {
					if l.State != st {
						e.t.Errorf("state %s: %q listed as %q", st, k, l.State)
					}
				}
			}
		}
	}},
	{"prefix isolation: a route, its scopes, and a route named alike", func(e *lenv) {
		mine, scoped := e.keyIn("", "a"), e.keyIn("tenant-a", "a")
		other := store.Key(e.route+"2", "", "a")
		otherScoped := store.Key(e.route+"2", "tenant-a", "b")
		for _, k := range []string{mine, scoped, other, otherScoped} {
			e.reserveOK(k, "tok", "fp", longLease, longTTL)
		}
		e.wantKeys("route prefix", e.all(store.ListQuery{Prefix: e.route + "/", Limit: 10}), mine, scoped)
		e.wantKeys("unscoped prefix", e.all(store.ListQuery{Prefix: e.route + "/-/", Limit: 10}), mine)
		scopePrefix := scoped[:len(scoped)-1] // "route/<scope hash>/"
		e.wantKeys("scope prefix", e.all(store.ListQuery{Prefix: scopePrefix, Limit: 10}), scoped)
		e.wantKeys("the other route", e.all(store.ListQuery{Prefix: e.route + "2/", Limit: 1}), other, otherScoped)
		e.wantKeys("no such route", e.all(store.ListQuery{Prefix: e.route + "3/", Limit: 10}))
	}},
	{"the write probe's keys are never a route's", func(e *lenv) {
		// A probe that succeeds leaves nothing; one that failed leaves its
		// key in flight, then in doubt: neither is listed with a route.
		mine := e.keyIn("", "a")
		e.reserveOK(mine, "tok", "fp", longLease, longTTL)
		if err := store.NewWriteProbe(e.s, store.ProbeOptions{}).Probe(e.ctx); err != nil {
			e.t.Fatalf("write probe: %v", err)
		}
		e.lapsed(store.Key(store.ProbeRoute, "", e.route))
		e.wantKeys("route prefix", e.all(store.ListQuery{Prefix: e.route + "/", Limit: 10}), mine)
		e.wantKeys("in doubt", e.all(store.ListQuery{Prefix: e.route + "/", State: store.StateInDoubt, Limit: 10}))
	}},
	{"expired records are not listed", func(e *lenv) {
		live, gone, doubt := e.keyIn("", "live"), e.keyIn("", "gone"), e.keyIn("", "gone-in-doubt")
		e.reserveOK(live, "tok", "fp", longLease, longTTL)
		e.reserveOK(gone, "tok", "fp", longLease, shortTTL)
		e.reserveOK(doubt, "tok", "fp", longLease, longTTL)
		e.markInDoubt(doubt, "tok", shortTTL, nil)
		deadline := time.Now().Add(eventually)
		for e.getOrNil(gone) != nil || e.getOrNil(doubt) != nil {
			if time.Now().After(deadline) {
				e.t.Fatalf("records not expired %v after their TTL", eventually)
			}
			time.Sleep(50 * time.Millisecond)
		}
		e.wantKeys("all states", e.all(store.ListQuery{Prefix: e.route + "/", Limit: 10}), live)
		e.wantKeys("in doubt", e.all(store.ListQuery{Prefix: e.route + "/", State: store.StateInDoubt, Limit: 10}))
	}},
	{"released records are not listed", func(e *lenv) {
		kept, released := e.keyIn("", "kept"), e.keyIn("", "released")
		e.reserveOK(kept, "tok", "fp", longLease, longTTL)
		e.reserveOK(released, "tok", "fp", longLease, longTTL)
		e.release(released, "tok", nil)
		e.wantKeys("after a release", e.all(store.ListQuery{Prefix: e.route + "/", Limit: 10}), kept)
	}},
	{"key hash finds one key", func(e *lenv) {
		var keys []string
		for i := range 6 {
			k := e.keyIn("", fmt.Sprintf("order-%d", i))
			e.reserveOK(k, "tok", "fp", longLease, longTTL)
			keys = append(keys, k)
		}
		scoped := e.keyIn("tenant-b", "order-3")
		e.reserveOK(scoped, "tok", "fp", longLease, longTTL)
		for _, k := range []string{keys[3], scoped} {
			got := e.all(store.ListQuery{Prefix: e.route + "/", KeyHash: store.KeyHash(k), Limit: 1})
			e.wantKeys("key hash of "+k, got, k)
		}
		got := e.all(store.ListQuery{Prefix: e.route + "/", KeyHash: store.KeyHash(keys[2]), State: store.StateCompleted, Limit: 5})
		e.wantKeys("key hash and another state", got)
		got = e.all(store.ListQuery{Prefix: e.route + "/", KeyHash: "000000000000", Limit: 5})
		e.wantKeys("unknown key hash", got)
	}},
	{"a filtered listing examines a bounded number of keys per call", func(e *lenv) {
		// Twice the budget of keys in flight, three in doubt among them:
		// no call can examine them all, so the in-doubt keys take several
		// calls, some of which may return nothing but a cursor.
		n := 2*store.ListBudget + 10
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		work := make(chan int)
		for range 32 {
			wg.Go(func() {
				for i := range work {
					k := e.keyIn("", fmt.Sprintf("bulk-%05d", i))
					rec, err := e.s.Reserve(e.ctx, k, store.Reservation{Token: "tok", Fingerprint: "fp", Lease: longLease, TTL: longTTL})
					if err == nil && rec != nil {
						err = fmt.Errorf("Reserve(%q) found a record", k)
					}
					if err == nil && i%(n/3) == 7 {
						err = e.s.MarkInDoubt(e.ctx, k, "tok", longTTL)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if len(errs) > 0 {
			e.t.Fatalf("%d writes failed, the first: %v", len(errs), errs[0])
		}
		var want []string
		for i := range n {
			if i%(n/3) == 7 {
				want = append(want, e.keyIn("", fmt.Sprintf("bulk-%05d", i)))
			}
		}
		q := store.ListQuery{Prefix: e.route + "/", State: store.StateInDoubt, Limit: 10}
		calls, got := 0, map[string]store.Listed{}
		for {
			calls++
			recs, next, err := e.ls.List(e.ctx, q)
			if err != nil {
				e.t.Fatalf("List(%+v): %v", q, err)
			}
			for _, r := range recs {
				got[r.Key] = r
			}
			if next == "" {
				break
			}
			q.Cursor = next
		}
		e.wantKeys("in doubt among many", got, want...)
		if calls < 2 {
			e.t.Errorf("one List call examined all %d keys; want at most %d per call", n, store.ListBudget)
		}
	}},
	{"a bad cursor or limit is an error", func(e *lenv) {
		for i := range 3 {
			e.reserveOK(e.keyIn("", fmt.Sprintf("k%d", i)), "tok", "fp", longLease, longTTL)
		}
		e.reserveOK(store.Key(e.route+"2", "", "k"), "tok", "fp", longLease, longTTL)
		q := store.ListQuery{Prefix: e.route + "/", Limit: 1}
		_, next, err := e.ls.List(e.ctx, q)
		if err != nil || next == "" {
			e.t.Fatalf("List(%+v) = next %q, %v; want a next cursor", q, next, err)
		}
		for _, bad := range []string{"garbage", "x" + next, next[:len(next)/2] + "!"} {
			q.Cursor = bad
			if _, _, err := e.ls.List(e.ctx, q); !errors.Is(err, store.ErrBadCursor) {
				e.t.Errorf("List with cursor %q = %v, want ErrBadCursor", bad, err)
			}
		}
		// A cursor belongs to the listing of its prefix.
		other := store.ListQuery{Prefix: e.route + "2/", Limit: 1, Cursor: next}
		if _, _, err := e.ls.List(e.ctx, other); !errors.Is(err, store.ErrBadCursor) {
			e.t.Errorf("List of another prefix with this prefix's cursor = %v, want ErrBadCursor", err)
		}
		for _, limit := range []int{0, -1} {
			q := store.ListQuery{Prefix: e.route + "/", Limit: limit}
			if _, _, err := e.ls.List(e.ctx, q); err == nil || errors.Is(err, store.ErrBadCursor) {
				e.t.Errorf("List with limit %d = %v, want an error", limit, err)
			}
		}
	}},
}
