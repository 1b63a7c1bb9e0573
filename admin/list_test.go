package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
)

// listedKey is a key as GET /v1/keys/{route} shows it.
type listedKey struct {
	Route          string     `json:"route"`
	Key            string     `json:"key"`
	ScopeHash      string     `json:"scope_hash"`
	KeyHash        string     `json:"key_hash"`
	State          string     `json:"state"`
	CreatedAt      time.Time  `json:"created_at"`
	ExpiresAt      *time.Time `json:"expires_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	StoredStatus   int        `json:"stored_status"`
}

type listAnswer struct {
	Keys       []listedKey `json:"keys"`
	NextCursor *string     `json:"next_cursor"`
}

// list runs GET target and decodes its 200 answer.
func list(t *testing.T, h http.Handler, target string) listAnswer {
	t.Helper()
	rec := serve(t, h, http.MethodGet, target, bearer, nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s = %d %s, want 200", target, rec.Code, rec.Body)
	}
	for _, secret := range []string{ownerToken, "ch_SECRET_BODY", "fp-"} {
		if strings.Contains(rec.Body.String(), secret) {
			t.Errorf("GET %s shows %q: a listing shows no token, fingerprint or body", target, secret)
		}
	}
	var a listAnswer
	decode(t, rec, &a)
	if a.Keys == nil {
		t.Errorf("GET %s: keys = null, want a list", target)
	}
	return a
}

// listAll follows next_cursor from target's first page to its last and
// returns the keys by route/scope_hash/key; a key listed twice fails.
func listAll(t *testing.T, h http.Handler, target string) map[string]listedKey {
	t.Helper()
	out := map[string]listedKey{}
	cursor := ""
	for pages := 0; pages < 1000; pages++ {
		tgt := target
		if cursor != "" {
			tgt += "&cursor=" + url.QueryEscape(cursor)
		}
		a := list(t, h, tgt)
		for _, k := range a.Keys {
			id := k.Route + "/" + k.ScopeHash + "/" + k.Key
			if _, dup := out[id]; dup {
				t.Errorf("GET %s: %s listed twice", target, id)
			}
			out[id] = k
		}
		if a.NextCursor == nil {
			return out
		}
		if *a.NextCursor == "" {
			t.Fatalf("GET %s: next_cursor is empty, want it absent on the last page", tgt)
		}
		cursor = *a.NextCursor
	}
	t.Fatalf("GET %s: more than 1000 pages", target)
	return nil
}

func wantListed(t *testing.T, what string, got map[string]listedKey, want ...string) {
	t.Helper()
	var g []string
	for id := range got {
		g = append(g, id)
	}
	slices.Sort(g)
	slices.Sort(want)
	if !slices.Equal(g, want) {
		t.Errorf("%s: listed %q, want %q", what, g, want)
	}
}

func TestListKeys(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	alice := store.Key("refunds", "alice", "")
	aliceHash := strings.Split(alice, "/")[1]
	bobHash := strings.Split(store.Key("refunds", "bob", ""), "/")[1]
	seeds := []struct{ sk, state string }{
		{store.Key("charges", "", "ORD-1"), seedInFlight},
		{store.Key("charges", "", "ORD-2"), seedCompleted},
		{store.Key("charges", "", "ORD-3"), seedInDoubt},
		{store.Key("charges", "", "ORD/4"), seedLapsed},
		{store.Key("charges", "", "ORD-5"), seedNoBody},
		{store.Key("charges2", "", "ORD-1"), seedInDoubt}, // another route, named alike
		{store.Key("refunds", "alice", "R-1"), seedInDoubt},
		{store.Key("refunds", "bob", "R-1"), seedCompleted},
	}
	for _, s := range seeds {
		seed(t, st, s.sk, s.state)
	}
	before := time.Now()

	all := listAll(t, h, "/v1/keys/charges?limit=2")
	wantListed(t, "charges, all", all, "charges/-/ORD-1", "charges/-/ORD-2", "charges/-/ORD-3", "charges/-/ORD/4", "charges/-/ORD-5")
	for id, k := range all {
		sk := store.Key("charges", "", k.Key)
		if k.Route != "charges" || k.ScopeHash != "-" || k.KeyHash != store.KeyHash(sk) {
			t.Errorf("%s: route %q, scope_hash %q, key_hash %q; want charges, -, %s", id, k.Route, k.ScopeHash, k.KeyHash, store.KeyHash(sk))
		}
		if k.CreatedAt.After(before) || k.CreatedAt.Before(before.Add(-time.Minute)) {
			t.Errorf("%s: created_at %v, want just before %v", id, k.CreatedAt, before)
		}
		if k.ExpiresAt == nil || k.ExpiresAt.Before(before.Add(ttl-time.Minute)) {
			t.Errorf("%s: expires_at %v, want about now + %v", id, k.ExpiresAt, ttl)
		}
	}
	for _, c := range []struct {
		id, state string
		status    int
		lease     bool
	}{
		{"charges/-/ORD-1", "in_flight", 0, true},
		{"charges/-/ORD-2", "completed", http.StatusCreated, false},
		{"charges/-/ORD-3", "in_doubt", 0, false},
		{"charges/-/ORD/4", "in_doubt", 0, false}, // a lapsed lease, as GET of the key says
		{"charges/-/ORD-5", "completed", http.StatusOK, false},
	} {
		k := all[c.id]
		if k.State != c.state || k.StoredStatus != c.status || (k.LeaseExpiresAt != nil) != c.lease {
			t.Errorf("%s: state %q, stored_status %d, lease_expires_at %v; want %s, %d, lease set %v",
				c.id, k.State, k.StoredStatus, k.LeaseExpiresAt, c.state, c.status, c.lease)
		}
	}

	wantListed(t, "charges, in doubt", listAll(t, h, "/v1/keys/charges?state=in_doubt&limit=1"),
		"charges/-/ORD-3", "charges/-/ORD/4")
	wantListed(t, "charges, completed", listAll(t, h, "/v1/keys/charges?state=completed"),
		"charges/-/ORD-2", "charges/-/ORD-5")
	wantListed(t, "refunds, every scope", listAll(t, h, "/v1/keys/refunds?limit=1"),
		"refunds/"+aliceHash+"/R-1", "refunds/"+bobHash+"/R-1")
	wantListed(t, "refunds, alice", listAll(t, h, "/v1/keys/refunds?scope=alice"), "refunds/"+aliceHash+"/R-1")

	// key_hash finds the key of a log line.
	sk := store.Key("charges", "", "ORD/4")
	got := listAll(t, h, "/v1/keys/charges?key_hash="+store.KeyHash(sk))
	wantListed(t, "key_hash", got, "charges/-/ORD/4")
	wantListed(t, "key_hash of another route", listAll(t, h, "/v1/keys/charges?key_hash="+store.KeyHash(store.Key("charges2", "", "ORD-1"))))
	wantListed(t, "unknown key_hash", listAll(t, h, "/v1/keys/charges?key_hash=0123456789ab"))
	// The raw key it shows is the one the key endpoints take.
	if rec := serve(t, h, http.MethodGet, "/v1/keys/charges/"+url.PathEscape(got["charges/-/ORD/4"].Key), bearer, nil); rec.Code != http.StatusOK {
		t.Errorf("GET of the listed key = %d %s, want 200", rec.Code, rec.Body)
	}
}

func TestListKeysRefusesBadParameters(t *testing.T) {
	st := openStore(t)
	for i := range 3 {
		seed(t, st, store.Key("charges", "", "k"+string(rune('a'+i))), seedInDoubt)
	}
	h := newHandler(t, st, nil)
	first := list(t, h, "/v1/keys/charges?limit=1")
	if first.NextCursor == nil {
		t.Fatal("first page of 1 of 3 keys: no next_cursor")
	}
	tests := []struct {
		target string
		status int
		name   string
	}{
		{"/v1/keys/charges?state=doubtful", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?state=IN_DOUBT", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?limit=0", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?limit=1001", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?limit=ten", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?key_hash=ABCDEF012345", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?key_hash=abc", http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/charges?cursor=garbage", http.StatusBadRequest, "invalid-parameter"},
		// A cursor belongs to its listing.
		{"/v1/keys/refunds?cursor=" + url.QueryEscape(*first.NextCursor), http.StatusBadRequest, "invalid-parameter"},
		{"/v1/keys/payouts", http.StatusNotFound, "unknown-route"},
		{"/v1/keys/charges?scope=alice", http.StatusBadRequest, "scope-not-allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			checkProblem(t, serve(t, h, http.MethodGet, tc.target, bearer, nil), tc.target, tc.status, tc.name)
		})
	}
	checkProblem(t, serve(t, h, http.MethodGet, "/v1/keys/charges", "", nil), "/v1/keys/charges", http.StatusUnauthorized, "unauthorized")
	if a := list(t, h, "/v1/keys/charges?limit=1000"); len(a.Keys) != 3 || a.NextCursor != nil {
		t.Errorf("limit=1000: %d keys, next_cursor %v; want the 3 keys and none", len(a.Keys), a.NextCursor)
	}
	if a := list(t, h, "/v1/keys/charges"); len(a.Keys) != 3 {
		t.Errorf("no limit: %d keys, want the 3 (the default is %d)", len(a.Keys), admin.DefaultListLimit)
	}
}

// notLister is a store that cannot list.
type notLister struct{ admin.Store }

func TestListKeysWithoutALister(t *testing.T) {
	h := newHandler(t, notLister{openStore(t)}, nil)
	checkProblem(t, serve(t, h, http.MethodGet, "/v1/keys/charges", bearer, nil), "/v1/keys/charges", http.StatusNotFound, "listing-unavailable")
}

// pagedStore answers every List call with one record at most and a cursor
// until it has listed n: a store whose calls each return short pages.
type pagedStore struct {
	admin.Store
	n     int
	calls int
}

func (p *pagedStore) List(_ context.Context, q store.ListQuery) ([]store.Listed, string, error) {
	p.calls++
	i := 0
	if q.Cursor != "" {
		if err := json.Unmarshal([]byte(q.Cursor), &i); err != nil {
			return nil, "", store.ErrBadCursor
		}
	}
	if i >= p.n {
		return nil, "", nil
	}
	var recs []store.Listed
	if i%2 == 0 { // every other call finds nothing, as a filter may
		recs = append(recs, store.Listed{Key: store.Key("charges", "", "k"+string(rune('a'+i))), State: store.StateInDoubt, CreatedAt: time.Now()})
	}
	next, _ := json.Marshal(i + 1)
	if i+1 == p.n {
		next = nil
	}
	return recs, string(next), nil
}

// TestListKeysFillsAPageWithinABound: a page takes several store calls
// to fill itself when each finds few keys, but a bounded number of them.
func TestListKeysFillsAPageWithinABound(t *testing.T) {
	p := &pagedStore{Store: openStore(t), n: 100}
	h := newHandler(t, p, nil)
	a := list(t, h, "/v1/keys/charges?limit=3")
	if len(a.Keys) != 3 || a.NextCursor == nil {
		t.Errorf("limit 3 over calls finding 1 or 0 keys: %d keys, next_cursor %v; want 3 and a cursor", len(a.Keys), a.NextCursor)
	}
	p.calls = 0
	a = list(t, h, "/v1/keys/charges?limit=1000")
	if p.calls > 8 || a.NextCursor == nil {
		t.Errorf("limit 1000: %d store calls, next_cursor %v; want at most 8 and a cursor", p.calls, a.NextCursor)
	}
}
