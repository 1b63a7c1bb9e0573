package admin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
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
	// maxListLimit is the largest ?limit= taken.
	maxListLimit = 1000
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
	page, err := h.listRoute(r.Context(), r.PathValue("route"), r.URL.Query(), listCalls)
	if err != nil {
		prob, detail := listProblem(err)
		problem.Write(w, r, prob, detail, 0, nil)
		return
	}
	writeJSON(w, r, http.StatusOK, page)
}

// listError is a listing refused before the store was asked: no lister,
// an unknown route, a bad parameter.
type listError struct {
	prob   problem.Type
	detail string
}

func (e *listError) Error() string { return e.detail }

// listProblem is the problem and detail of an error of listRoute.
func listProblem(err error) (problem.Type, string) {
	var le *listError
	switch {
	case errors.As(err, &le):
		return le.prob, le.detail
	case errors.Is(err, store.ErrBadCursor):
		return problemFor(err), "cursor is not one this listing returned: start again without ?cursor="
	default:
		return problemFor(err), err.Error()
	}
}

// lister is the store's Lister, nil when it cannot list.
func (h *Handler) lister() store.Lister {
	if h.opts.Lister != nil {
		return h.opts.Lister
	}
	l, _ := h.opts.Store.(store.Lister)
	return l
}

// listRoute is one page of the keys of route that the parameters qv select
// (state, limit, cursor, key_hash, scope: those of GET /v1/keys/{route}),
// from at most calls store calls: the one listing of the key API and the
// console. Its errors are *listError for a refused listing, else the
// store's.
func (h *Handler) listRoute(ctx context.Context, route string, qv url.Values, calls int) (listPage, error) {
	lister := h.lister()
	if lister == nil {
		return listPage{}, &listError{probNoLister, "this store cannot list its keys"}
	}
	header, ok := h.opts.Routes.RouteScope(route)
	if !ok {
		return listPage{}, &listError{probUnknownRoute, "no route named " + strconv.Quote(route)}
	}
	keyspace := h.keyspace(route)
	q := store.ListQuery{Prefix: keyspace + "/", Limit: DefaultListLimit, Cursor: qv.Get("cursor")}
	if scope := qv.Get("scope"); scope != "" {
		if header == "" {
			return listPage{}, &listError{probScopeNotAllowed, "route " + route + " is not scoped: drop ?scope="}
		}
		q.Prefix = store.Key(keyspace, scope, "") // "keyspace/<scope hash>/"
	}
	switch st := store.State(qv.Get("state")); st {
	case "", store.StateInFlight, store.StateCompleted, store.StateInDoubt:
		q.State = st
	default:
		return listPage{}, &listError{probBadParameter, "state " + strconv.Quote(string(st)) + " is not one of in_flight, completed, in_doubt"}
	}
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			return listPage{}, &listError{probBadParameter, "limit " + strconv.Quote(s) + " is not a number from 1 to " + strconv.Itoa(maxListLimit)}
		}
		q.Limit = n
	}
	if kh := qv.Get("key_hash"); kh != "" {
		if !keyHashPattern.MatchString(kh) {
			return listPage{}, &listError{probBadParameter, "key_hash " + strconv.Quote(kh) + " is not 12 lower-case hex digits (the key_hash of a log line)"}
		}
		q.KeyHash = kh
	}
	return h.listPages(ctx, lister, route, q, calls)
}

// listPages fills a page of at most q.Limit keys of route from at most
// calls store calls.
func (h *Handler) listPages(ctx context.Context, lister store.Lister, route string, q store.ListQuery, calls int) (listPage, error) {
	page, limit := listPage{Keys: []listView{}}, q.Limit
	keyspace, _, _ := strings.Cut(q.Prefix, "/") // the one the query was made for
	for range calls {
		recs, next, err := lister.List(ctx, q)
		if err != nil {
			return listPage{}, err
		}
		for _, l := range recs {
			page.Keys = append(page.Keys, view(route, keyspace, l))
		}
		page.NextCursor = next
		if next == "" || len(page.Keys) == limit || (q.KeyHash != "" && len(page.Keys) > 0) {
			break
		}
		q.Cursor, q.Limit = next, limit-len(page.Keys)
	}
	return page, nil
}

// view is how the listing shows l, a key of route in keyspace.
func view(route, keyspace string, l store.Listed) listView {
	rest := strings.TrimPrefix(l.Key, keyspace+"/")
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
