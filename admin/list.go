package admin

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/store"
)

// The limits of GET /v1/keys/{route}.
const (
	// DefaultListLimit is the page size when ?limit= is absent.
	DefaultListLimit = 100
	// MaxListLimit is the largest ?limit= taken.
	MaxListLimit = 1000
	// listCalls is the most store calls one page makes to fill itself
	// when a filter selects few of the keys each call examines: a page
	// reads at most listCalls x store.ListBudget keys (or limit keys per
	// call, when larger).
	listCalls = 8
)

// keyHashPattern is the form of a key hash in the logs (store.KeyHash).
var keyHashPattern = regexp.MustCompile(`^[0-9a-f]{12}$`)

// listView is a key as the listing shows it. Its fields have the names of
// keyView's where they overlap.
type listView struct {
	Route string `json:"route"`
	Key   string `json:"key"`
	// ScopeHash is "-" for an unscoped key, else the hash of its scope
	// (store.Key).
	ScopeHash      string      `json:"scope_hash"`
	KeyHash        string      `json:"key_hash"`
	State          store.State `json:"state"`
	CreatedAt      time.Time   `json:"created_at"`
	ExpiresAt      *time.Time  `json:"expires_at,omitempty"`
	LeaseExpiresAt *time.Time  `json:"lease_expires_at,omitempty"`
	StoredStatus   int         `json:"stored_status,omitempty"`
}

// listPage is the answer of GET /v1/keys/{route}.
type listPage struct {
	Keys       []listView `json:"keys"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// listKeys lists the keys of a route: GET /v1/keys/{route}?state=&limit=
// &cursor=&key_hash=&scope=. Every scope of a scoped route unless ?scope=
// names one. A page holds at most limit keys, and may hold fewer (none,
// even) while next_cursor is set: each page reads a bounded number of
// keys, of which a filter may select few.
func (h *Handler) listKeys(w http.ResponseWriter, r *http.Request) {
	lister := h.opts.Lister
	if lister == nil {
		lister, _ = h.opts.Store.(store.Lister)
	}
	if lister == nil {
		problem.Write(w, r, probNoLister, "this store cannot list its keys", 0, nil)
		return
	}
	route := r.PathValue("route")
	header, ok := h.opts.Routes.RouteScope(route)
	if !ok {
		problem.Write(w, r, probUnknownRoute, "no route named "+strconv.Quote(route), 0, nil)
		return
	}
	qv := r.URL.Query()
	q := store.ListQuery{Prefix: route + "/", Limit: DefaultListLimit, Cursor: qv.Get("cursor")}
	if scope := qv.Get("scope"); scope != "" {
		if header == "" {
			problem.Write(w, r, probScopeNotAllowed, "route "+route+" is not scoped: drop ?scope=", 0, nil)
			return
		}
		q.Prefix = store.Key(route, scope, "") // "route/<scope hash>/"
	}
	switch st := store.State(qv.Get("state")); st {
	case "", store.StateInFlight, store.StateCompleted, store.StateInDoubt:
		q.State = st
	default:
		problem.Write(w, r, probBadParameter, "state "+strconv.Quote(string(st))+" is not one of in_flight, completed, in_doubt", 0, nil)
		return
	}
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxListLimit {
			problem.Write(w, r, probBadParameter, "limit "+strconv.Quote(s)+" is not a number from 1 to "+strconv.Itoa(MaxListLimit), 0, nil)
			return
		}
		q.Limit = n
	}
	if kh := qv.Get("key_hash"); kh != "" {
		if !keyHashPattern.MatchString(kh) {
			problem.Write(w, r, probBadParameter, "key_hash "+strconv.Quote(kh)+" is not 12 lower-case hex digits (the key_hash of a log line)", 0, nil)
			return
		}
		q.KeyHash = kh
	}
	page, limit := listPage{Keys: []listView{}}, q.Limit
	for calls := 0; calls < listCalls; calls++ {
		recs, next, err := lister.List(r.Context(), q)
		if err != nil {
			detail := err.Error()
			if errors.Is(err, store.ErrBadCursor) {
				detail = "cursor is not one this listing returned: start again without ?cursor="
			}
			problem.Write(w, r, problemFor(err), detail, 0, nil)
			return
		}
		for _, l := range recs {
			page.Keys = append(page.Keys, view(route, l))
		}
		page.NextCursor = next
		if next == "" || len(page.Keys) == limit || (q.KeyHash != "" && len(page.Keys) > 0) {
			break
		}
		q.Cursor, q.Limit = next, limit-len(page.Keys)
	}
	writeJSON(w, r, http.StatusOK, page)
}

// view is how the listing shows l, a key of route.
func view(route string, l store.Listed) listView {
	rest := strings.TrimPrefix(l.Key, route+"/")
	scope, key, _ := strings.Cut(rest, "/")
	v := listView{
		Route: route, Key: key, ScopeHash: scope, KeyHash: store.KeyHash(l.Key), State: l.State,
		CreatedAt: l.CreatedAt.UTC(), StoredStatus: l.StoredStatus,
	}
	if !l.ExpiresAt.IsZero() {
		t := l.ExpiresAt.UTC()
		v.ExpiresAt = &t
	}
	if !l.LeaseExpiresAt.IsZero() {
		t := l.LeaseExpiresAt.UTC()
		v.LeaseExpiresAt = &t
	}
	return v
}
