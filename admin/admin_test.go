package admin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// routes is the admin.Routes of the tests: route name → scope header.
type routes map[string]string

func (r routes) RouteScope(name string) (string, bool) {
	h, ok := r[name]
	return h, ok
}

// testRoutes has an unscoped route and one scoped by a header.
var testRoutes = routes{"charges": "", "refunds": "X-Tenant"}

const testToken = "s3cret-admin-token-0123456789"

// failingPing is the real Badger store with a Ping that fails.
type failingPing struct{ *badger.Store }

func (failingPing) Ping(context.Context) error { return errors.New("disk on fire") }

func openStore(t testing.TB) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: false})
	if err != nil {
		t.Fatalf("badger.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newHandler returns a handler on st with the test routes and token;
// change adjusts the options first.
func newHandler(t testing.TB, st admin.Store, change func(*admin.Options)) *admin.Handler {
	t.Helper()
	opts := admin.Options{Store: st, Routes: testRoutes, Gatherer: prometheus.NewRegistry(), Token: testToken}
	if change != nil {
		change(&opts)
	}
	return admin.NewHandler(opts)
}

// serve runs one request through h. A non-empty auth becomes the
// Authorization header; header adds more.
func serve(t testing.TB, h http.Handler, method, target, auth string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const bearer = "Bearer " + testToken

// The states the tests put records in.
const (
	seedInFlight  = "in_flight"
	seedCompleted = "completed"
	seedNoBody    = "completed_body_not_stored"
	seedInDoubt   = "in_doubt"
	seedLapsed    = "lapsed_lease"
)

const (
	ownerToken = "owner-token-must-not-leak"
	secretBody = `{"charge":"ch_SECRET_BODY_7f3a","amount":4200}`
	lease      = time.Hour
	ttl        = 24 * time.Hour
)

// seed puts a record in the given state under sk, through the store's
// own Reserve, Commit and MarkInDoubt.
func seed(t testing.TB, st *badger.Store, sk, state string) {
	t.Helper()
	ctx := context.Background()
	res := store.Reservation{Token: ownerToken, Fingerprint: "fp-" + state, Lease: lease, TTL: ttl}
	if state == seedLapsed {
		res.Lease = time.Nanosecond // lapsed as soon as it is written
	}
	if rec, err := st.Reserve(ctx, sk, res); err != nil || rec != nil {
		t.Fatalf("Reserve(%q) = %v, %v; want nil, nil", sk, rec, err)
	}
	var err error
	switch state {
	case seedInFlight, seedLapsed:
	case seedCompleted:
		err = st.Commit(ctx, sk, ownerToken, store.Response{
			Status: http.StatusCreated, Header: http.Header{"Location": {"/charges/ch_1"}},
			Body: []byte(secretBody), BodyStored: true,
		}, ttl)
	case seedNoBody:
		err = st.Commit(ctx, sk, ownerToken, store.Response{Status: http.StatusOK, BodyStored: false}, ttl)
	case seedInDoubt:
		err = st.MarkInDoubt(ctx, sk, ownerToken, ttl)
	default:
		t.Fatalf("seed: unknown state %q", state)
	}
	if err != nil {
		t.Fatalf("seed %s %q: %v", state, sk, err)
	}
}

func decode(t testing.TB, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("decode %q: %v", rec.Body.String(), err)
	}
}

// problemBody is an RFC 9457 problem as the admin API answers it.
type problemBody struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail"`
	Instance string `json:"instance"`
	State    string `json:"state"`
}

// checkProblem asserts that rec is the admin problem name with status: its
// status, content type, type, title (the one admin.Problems lists),
// status member and instance.
func checkProblem(t testing.TB, rec *httptest.ResponseRecorder, target string, status int, name string) problemBody {
	t.Helper()
	var p problemBody
	if rec.Code != status {
		t.Errorf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json; body %s", ct, rec.Body)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", cc)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	var title string
	for _, q := range admin.Problems() {
		if q.Name == name {
			title = q.Title
		}
	}
	u, _ := url.Parse(target)
	if want := problem.TypePrefix + name; p.Type != want || p.Status != status || p.Title != title || p.Instance != u.Path {
		t.Errorf("problem = %+v; want type %s, status %d, title %q, instance %q", p, want, status, title, u.Path)
	}
	return p
}

func TestKeyAPIAuth(t *testing.T) {
	tests := []struct {
		name     string
		token    string // configured token
		tokenEnv string
		auth     string // Authorization header
		want     int
		wantBody string
	}{
		{name: "no token configured", token: "", tokenEnv: "IDEMPROXY_ADMIN_TOKEN", auth: "", want: http.StatusForbidden, wantBody: "IDEMPROXY_ADMIN_TOKEN"},
		{name: "no token configured, no env var named", token: "", auth: "", want: http.StatusForbidden, wantBody: "no admin token is configured"},
		{name: "no token configured, custom env var", token: "", tokenEnv: "MY_ADMIN_TOKEN", auth: bearer, want: http.StatusForbidden, wantBody: "MY_ADMIN_TOKEN"},
		{name: "no token configured, empty bearer", token: "", auth: "Bearer ", want: http.StatusForbidden, wantBody: "disabled"},
		{name: "missing header", token: testToken, auth: "", want: http.StatusUnauthorized},
		{name: "basic scheme", token: testToken, auth: "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+testToken)), want: http.StatusUnauthorized},
		{name: "other scheme, right token", token: testToken, auth: "Token " + testToken, want: http.StatusUnauthorized},
		{name: "token without scheme", token: testToken, auth: testToken, want: http.StatusUnauthorized},
		{name: "scheme only", token: testToken, auth: "Bearer", want: http.StatusUnauthorized},
		{name: "empty bearer", token: testToken, auth: "Bearer ", want: http.StatusUnauthorized},
		{name: "wrong token, same length", token: testToken, auth: "Bearer " + strings.Repeat("x", len(testToken)), want: http.StatusUnauthorized},
		{name: "wrong token, last byte differs", token: testToken, auth: "Bearer " + testToken[:len(testToken)-1] + "X", want: http.StatusUnauthorized},
		{name: "shorter token (prefix)", token: testToken, auth: "Bearer " + testToken[:8], want: http.StatusUnauthorized},
		{name: "longer token", token: testToken, auth: bearer + "0", want: http.StatusUnauthorized},
		{name: "two spaces", token: testToken, auth: "Bearer  " + testToken, want: http.StatusUnauthorized},
		{name: "right token", token: testToken, auth: bearer, want: http.StatusOK},
		{name: "right token, scheme in lower case", token: testToken, auth: "bearer " + testToken, want: http.StatusOK},
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		for _, tt := range tests {
			t.Run(method+"/"+tt.name, func(t *testing.T) {
				st := openStore(t)
				sk := store.Key("charges", "", "k1")
				seed(t, st, sk, seedCompleted)
				h := newHandler(t, st, func(o *admin.Options) { o.Token, o.TokenEnv = tt.token, tt.tokenEnv })

				rec := serve(t, h, method, "/v1/keys/charges/k1", tt.auth, nil)
				if rec.Code != tt.want {
					t.Fatalf("%s status = %d, want %d; body %s", method, rec.Code, tt.want, rec.Body)
				}
				switch tt.want {
				case http.StatusForbidden:
					if p := checkProblem(t, rec, "/v1/keys/charges/k1", tt.want, "admin-api-disabled"); !strings.Contains(p.Detail, tt.wantBody) {
						t.Errorf("detail = %q, want it to contain %q", p.Detail, tt.wantBody)
					}
				case http.StatusUnauthorized:
					checkProblem(t, rec, "/v1/keys/charges/k1", tt.want, "unauthorized")
				}
				gotWWW := rec.Header().Get("WWW-Authenticate")
				if wantWWW := tt.want == http.StatusUnauthorized; (gotWWW != "") != wantWWW || (wantWWW && !strings.HasPrefix(gotWWW, "Bearer ")) {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge: %v", gotWWW, wantWWW)
				}
				if strings.Contains(rec.Body.String(), testToken) {
					t.Errorf("body %q shows the token", rec.Body)
				}
				// A refused request leaves the record alone.
				got, err := st.Get(context.Background(), sk)
				if err != nil {
					t.Fatal(err)
				}
				wantKept := tt.want != http.StatusOK || method == http.MethodGet
				if (got != nil) != wantKept {
					t.Errorf("record present after %s = %v, want %v", method, got != nil, wantKept)
				}
			})
		}
	}
}

// TestAuthBeforeRouteLookup: without a valid token nothing is revealed,
// not even whether a route exists.
func TestAuthBeforeRouteLookup(t *testing.T) {
	st := openStore(t)
	tests := []struct {
		name, token, auth, target string
		want                      int
		wantType                  string
	}{
		{"unknown route, no token configured", "", "", "/v1/keys/nope/k", http.StatusForbidden, "admin-api-disabled"},
		{"unknown route, no header", testToken, "", "/v1/keys/nope/k", http.StatusUnauthorized, "unauthorized"},
		{"scoped route without scope, no header", testToken, "", "/v1/keys/refunds/k", http.StatusUnauthorized, "unauthorized"},
		{"unknown route, right token", testToken, bearer, "/v1/keys/nope/k", http.StatusNotFound, "unknown-route"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, st, func(o *admin.Options) { o.Token = tt.token })
			p := checkProblem(t, serve(t, h, http.MethodGet, tt.target, tt.auth, nil), tt.target, tt.want, tt.wantType)
			if tt.want != http.StatusNotFound && strings.Contains(p.Detail, "nope") {
				t.Errorf("detail %q names the route before the token was checked", p.Detail)
			}
		})
	}
}

// keyView mirrors the JSON of GET /v1/keys.
type keyView struct {
	Route          string     `json:"route"`
	Key            string     `json:"key"`
	State          string     `json:"state"`
	CreatedAt      time.Time  `json:"created_at"`
	ExpiresAt      *time.Time `json:"expires_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	Fingerprint    string     `json:"fingerprint"`
	StoredStatus   int        `json:"stored_status"`
	StoredBytes    *int       `json:"stored_body_bytes"`
}

// TestGetKeyShowsItsOrigin: a key whose request was traced shows the span
// that forwarded it as "origin"; one that was not shows no such field.
func TestGetKeyShowsItsOrigin(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	const origin = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	for _, tt := range []struct{ key, origin string }{{"traced", origin}, {"untraced", ""}} {
		res := store.Reservation{Token: ownerToken, Fingerprint: "fp", Lease: lease, TTL: ttl, Origin: tt.origin}
		if rec, err := st.Reserve(context.Background(), store.Key("charges", "", tt.key), res); err != nil || rec != nil {
			t.Fatalf("Reserve(%q) = %v, %v; want nil, nil", tt.key, rec, err)
		}
		rec := serve(t, h, http.MethodGet, "/v1/keys/charges/"+tt.key, bearer, nil)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status = %d, want 200; body %s", tt.key, rec.Code, rec.Body)
		}
		var fields map[string]any
		decode(t, rec, &fields)
		got, ok := fields["origin"]
		if want := tt.origin != ""; ok != want || (want && got != tt.origin) {
			t.Errorf("%s: origin = %v (present %v), want %q (present %v)", tt.key, got, ok, tt.origin, want)
		}
	}
}

func TestGetKeyStates(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	intp := func(n int) *int { return &n }
	tests := []struct {
		seed       string
		wantState  string
		wantLease  bool
		wantStatus int
		wantBytes  *int
	}{
		{seed: seedInFlight, wantState: "in_flight", wantLease: true},
		{seed: seedCompleted, wantState: "completed", wantStatus: http.StatusCreated, wantBytes: intp(len(secretBody))},
		{seed: seedNoBody, wantState: "completed", wantStatus: http.StatusOK},
		{seed: seedInDoubt, wantState: "in_doubt"},
		{seed: seedLapsed, wantState: "in_doubt"},
	}
	for _, tt := range tests {
		t.Run(tt.seed, func(t *testing.T) {
			key := "key-" + tt.seed
			before := time.Now()
			seed(t, st, store.Key("charges", "", key), tt.seed)
			after := time.Now()

			rec := serve(t, h, http.MethodGet, "/v1/keys/charges/"+key, bearer, nil)
			if rec.Code != http.StatusOK {
				t.Fatalf("status = %d, want 200; body %s", rec.Code, rec.Body)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", cc)
			}
			var got keyView
			decode(t, rec, &got)
			if got.Route != "charges" || got.Key != key || got.State != tt.wantState {
				t.Errorf("route, key, state = %q, %q, %q; want charges, %q, %q", got.Route, got.Key, got.State, key, tt.wantState)
			}
			if want := "fp-" + tt.seed; got.Fingerprint != want {
				t.Errorf("fingerprint = %q, want %q", got.Fingerprint, want)
			}
			// Badger keeps created_at in milliseconds and expiry in seconds.
			if got.CreatedAt.Before(before.Add(-time.Millisecond)) || got.CreatedAt.After(after) {
				t.Errorf("created_at = %v, want between %v and %v", got.CreatedAt, before, after)
			}
			if got.CreatedAt.Location() != time.UTC {
				t.Errorf("created_at %v is not in UTC", got.CreatedAt)
			}
			if got.ExpiresAt == nil {
				t.Errorf("expires_at missing")
			} else if lo, hi := before.Add(ttl-time.Second), after.Add(ttl+time.Second); got.ExpiresAt.Before(lo) || got.ExpiresAt.After(hi) {
				t.Errorf("expires_at = %v, want between %v and %v", got.ExpiresAt, lo, hi)
			}
			if (got.LeaseExpiresAt != nil) != tt.wantLease {
				t.Errorf("lease_expires_at = %v, want present: %v", got.LeaseExpiresAt, tt.wantLease)
			} else if tt.wantLease {
				if lo, hi := before.Add(lease-time.Millisecond), after.Add(lease); got.LeaseExpiresAt.Before(lo) || got.LeaseExpiresAt.After(hi) {
					t.Errorf("lease_expires_at = %v, want between %v and %v", got.LeaseExpiresAt, lo, hi)
				}
			}
			if got.StoredStatus != tt.wantStatus {
				t.Errorf("stored_status = %d, want %d", got.StoredStatus, tt.wantStatus)
			}
			if (got.StoredBytes == nil) != (tt.wantBytes == nil) || (got.StoredBytes != nil && *got.StoredBytes != *tt.wantBytes) {
				t.Errorf("stored_body_bytes = %v, want %v", deref(got.StoredBytes), deref(tt.wantBytes))
			}

			// Never the stored body (raw or as base64), its headers or the owner token.
			raw := rec.Body.String()
			for _, secret := range []string{
				"ch_SECRET_BODY_7f3a", base64.StdEncoding.EncodeToString([]byte(secretBody)),
				"/charges/ch_1", ownerToken,
			} {
				if strings.Contains(raw, secret) {
					t.Errorf("response shows %q:\n%s", secret, raw)
				}
			}
			var fields map[string]any
			decode(t, rec, &fields)
			for _, f := range []string{"body", "response", "header", "token"} {
				if _, ok := fields[f]; ok {
					t.Errorf("response has field %q:\n%s", f, raw)
				}
			}
		})
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestKeyPaths: keys with '/', spaces and other escaped characters are
// found whether or not the slash is escaped, through a real server and
// client.
func TestKeyPaths(t *testing.T) {
	st := openStore(t)
	srv := httptest.NewServer(newHandler(t, st, nil))
	defer srv.Close()
	keys := []string{"a/b c", "a//b", "100%", "q?x#y", "ключ-1", "dir/", "+plus&amp;", "..", ".", "a/../b", "x/./y"}
	for _, k := range keys {
		seed(t, st, store.Key("charges", "", k), seedCompleted)
	}
	tests := []struct {
		path    string // after /v1/keys/charges/
		want    int
		wantKey string
	}{
		{"a%2Fb%20c", http.StatusOK, "a/b c"},
		{"a/b%20c", http.StatusOK, "a/b c"},
		{"a%2fb%20c", http.StatusOK, "a/b c"},
		{"a%2F%2Fb", http.StatusOK, "a//b"},
		{"100%25", http.StatusOK, "100%"},
		{"q%3Fx%23y", http.StatusOK, "q?x#y"},
		{url.PathEscape("ключ-1"), http.StatusOK, "ключ-1"},
		{"dir/", http.StatusOK, "dir/"},
		{"dir%2F", http.StatusOK, "dir/"},
		{"+plus&amp;", http.StatusOK, "+plus&amp;"},
		{"a%2Fb", http.StatusNotFound, ""},
		{"%2E%2E", http.StatusOK, ".."},
		{"%2E", http.StatusOK, "."},
		{"a%2F%2E%2E%2Fb", http.StatusOK, "a/../b"},
		{"x%2F.%2Fy", http.StatusOK, "x/./y"},
		{"a/b+c", http.StatusNotFound, ""}, // '+' is not a space in a path
		{"dir", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			code, body := sendKeyAPI(t, srv, http.MethodGet, "charges/"+tt.path)
			if code != tt.want {
				t.Fatalf("GET %s = %d, want %d; body %s", tt.path, code, tt.want, body)
			}
			if tt.want != http.StatusOK {
				return
			}
			var got keyView
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if got.Key != tt.wantKey || got.State != "completed" {
				t.Errorf("key, state = %q, %q; want %q, completed", got.Key, got.State, tt.wantKey)
			}
		})
	}

	// Release through the escaped form, then both forms are gone.
	rec := serve(t, srv.Config.Handler, http.MethodDelete, "/v1/keys/charges/a%2Fb%20c", bearer, nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("DELETE a%%2Fb%%20c = %d, want 200; body %s", rec.Code, rec.Body)
	}
	for _, p := range []string{"a%2Fb%20c", "a/b%20c"} {
		if rec := serve(t, srv.Config.Handler, http.MethodGet, "/v1/keys/charges/"+p, bearer, nil); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s after release = %d, want 404", p, rec.Code)
		}
	}
}

func TestScopedRoute(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	const scope = "tenant a/1"
	seed(t, st, store.Key("refunds", scope, "r1"), seedCompleted)
	seed(t, st, store.Key("charges", "", "c1"), seedCompleted)
	q := "?scope=" + url.QueryEscape(scope)
	tests := []struct {
		name, target string
		want         int
		wantType     string // the problem's, for an error
		wantBody     string
	}{
		{"right scope", "/v1/keys/refunds/r1" + q, http.StatusOK, "", `"state": "completed"`},
		{"other scope", "/v1/keys/refunds/r1?scope=tenant-b", http.StatusNotFound, "no-record", "no record"},
		{"scope differs in case", "/v1/keys/refunds/r1?scope=" + url.QueryEscape(strings.ToUpper(scope)), http.StatusNotFound, "no-record", "no record"},
		{"missing scope", "/v1/keys/refunds/r1", http.StatusBadRequest, "scope-required", "X-Tenant"},
		{"empty scope", "/v1/keys/refunds/r1?scope=", http.StatusBadRequest, "scope-required", "X-Tenant"},
		{"unscoped key on a scoped route", "/v1/keys/refunds/c1?scope=x", http.StatusNotFound, "no-record", "no record"},
		{"scope on an unscoped route", "/v1/keys/charges/c1?scope=x", http.StatusBadRequest, "scope-not-allowed", "not scoped"},
		{"unscoped route", "/v1/keys/charges/c1", http.StatusOK, "", `"state": "completed"`},
		{"unknown route", "/v1/keys/payouts/c1", http.StatusNotFound, "unknown-route", "payouts"},
		{"unknown key", "/v1/keys/charges/c2", http.StatusNotFound, "no-record", "no record"},
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		for _, tt := range tests {
			if method == http.MethodDelete && tt.want == http.StatusOK {
				continue // releases are TestRelease's
			}
			t.Run(method+"/"+tt.name, func(t *testing.T) {
				rec := serve(t, h, method, tt.target, bearer, nil)
				if rec.Code != tt.want {
					t.Fatalf("%s %s = %d, want %d; body %s", method, tt.target, rec.Code, tt.want, rec.Body)
				}
				if !strings.Contains(rec.Body.String(), tt.wantBody) {
					t.Errorf("body = %q, want it to contain %q", rec.Body, tt.wantBody)
				}
				if tt.wantType != "" {
					checkProblem(t, rec, tt.target, tt.want, tt.wantType)
					return
				}
				var v map[string]any
				decode(t, rec, &v)
			})
		}
	}
	// The failed DELETEs above released nothing.
	for _, sk := range []string{store.Key("refunds", scope, "r1"), store.Key("charges", "", "c1")} {
		if rec, err := st.Get(context.Background(), sk); err != nil || rec == nil {
			t.Errorf("Get(%q) = %v, %v; want the record kept", sk, rec, err)
		}
	}
	if rec := serve(t, h, http.MethodDelete, "/v1/keys/refunds/r1"+q, bearer, nil); rec.Code != http.StatusOK {
		t.Errorf("DELETE with the right scope = %d, want 200; body %s", rec.Code, rec.Body)
	}
	if rec := serve(t, h, http.MethodGet, "/v1/keys/refunds/r1"+q, bearer, nil); rec.Code != http.StatusNotFound {
		t.Errorf("GET after release = %d, want 404", rec.Code)
	}
}

func TestRelease(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	tests := []struct {
		seed      string
		wantState string
	}{
		{seedInFlight, "in_flight"},
		{seedCompleted, "completed"},
		{seedNoBody, "completed"},
		{seedInDoubt, "in_doubt"},
		{seedLapsed, "in_doubt"},
	}
	for _, tt := range tests {
		t.Run(tt.seed, func(t *testing.T) {
			key := "rel-" + tt.seed
			sk := store.Key("charges", "", key)
			seed(t, st, sk, tt.seed)
			target := "/v1/keys/charges/" + key

			if tt.wantState == "in_flight" {
				// Its request is at the upstream now: releasing needs force.
				checkProblem(t, serve(t, h, http.MethodDelete, target, bearer, nil), target, http.StatusConflict, "key-in-flight")
				if rec, err := st.Get(context.Background(), sk); err != nil || rec == nil {
					t.Fatalf("the refused DELETE removed the record: %v, %v", rec, err)
				}
				target += "?force=true"
			}
			rec := serve(t, h, http.MethodDelete, target, bearer, nil)
			if rec.Code != http.StatusOK {
				t.Fatalf("DELETE = %d, want 200; body %s", rec.Code, rec.Body)
			}
			var got struct {
				Released      bool   `json:"released"`
				PreviousState string `json:"previous_state"`
			}
			decode(t, rec, &got)
			if !got.Released || got.PreviousState != tt.wantState {
				t.Errorf("DELETE answered released=%v previous_state=%q; want true, %q", got.Released, got.PreviousState, tt.wantState)
			}
			plain := "/v1/keys/charges/" + key
			if rec := serve(t, h, http.MethodGet, plain, bearer, nil); rec.Code != http.StatusNotFound {
				t.Errorf("GET after release = %d, want 404; body %s", rec.Code, rec.Body)
			}
			checkProblem(t, serve(t, h, http.MethodDelete, plain, bearer, nil), plain, http.StatusNotFound, "no-record")
			// The key can be used again: that is the point of a release.
			res := store.Reservation{Token: "new-owner", Fingerprint: "fp2", Lease: lease, TTL: ttl}
			if prev, err := st.Reserve(context.Background(), sk, res); err != nil || prev != nil {
				t.Errorf("Reserve after release = %v, %v; want nil, nil", prev, err)
			}
		})
	}
	t.Run("never seen", func(t *testing.T) {
		const target = "/v1/keys/charges/never-seen"
		checkProblem(t, serve(t, h, http.MethodDelete, target, bearer, nil), target, http.StatusNotFound, "no-record")
	})
}

func TestReleaseAuditLog(t *testing.T) {
	st := openStore(t)
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	const (
		rawKey   = "order-RAW-KEY-9f3a/x"
		rawScope = "tenant-RAW-SCOPE-77"
	)
	sk := store.Key("refunds", rawScope, rawKey)
	seed(t, st, sk, seedInDoubt)

	// Refused and failed requests write no audit line; the wrong token
	// writes its own warning, without the key.
	serve(t, h, http.MethodDelete, "/v1/keys/refunds/"+url.PathEscape(rawKey)+"?scope="+rawScope, "Bearer wrong", nil)
	serve(t, h, http.MethodDelete, "/v1/keys/refunds/missing?scope="+rawScope, bearer, nil)
	serve(t, h, http.MethodGet, "/v1/keys/refunds/"+url.PathEscape(rawKey)+"?scope="+rawScope, bearer, nil)
	failed := logs.String()
	if l := strings.Split(strings.TrimSpace(failed), "\n"); len(l) != 1 || !strings.Contains(l[0], `"msg":"admin authentication failed"`) {
		t.Fatalf("log before any release, want only the failed authentication:\n%s", failed)
	}
	logs.Reset()

	req := httptest.NewRequest(http.MethodDelete,
		"/v1/keys/refunds/"+url.PathEscape(rawKey)+"?scope="+rawScope+"&reason="+url.QueryEscape("INC-42 reprocess"), nil)
	req.Header.Set("Authorization", bearer)
	req.Header.Set("X-Operator", "alice@example.com")
	req.RemoteAddr = "198.51.100.7:51234"
	before := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	after := time.Now()
	if rec.Code != http.StatusOK {
		t.Fatalf("DELETE = %d, want 200; body %s", rec.Code, rec.Body)
	}

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d log lines, want 1:\n%s", len(lines), logs.String())
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatalf("log line %q: %v", lines[0], err)
	}
	sum := sha256.Sum256([]byte(sk))
	want := map[string]string{
		"level":          "WARN",
		"msg":            "key released by an operator",
		"route":          "refunds",
		"key_hash":       hex.EncodeToString(sum[:6]),
		"previous_state": "in_doubt",
		"operator":       "alice@example.com",
		"reason":         "INC-42 reprocess",
		"remote_addr":    "198.51.100.7:51234",
	}
	for k, w := range want {
		if got, _ := line[k].(string); got != w {
			t.Errorf("log %s = %q, want %q", k, got, w)
		}
	}
	at, _ := line["at"].(string)
	if got, err := time.Parse(time.RFC3339Nano, at); err != nil {
		t.Errorf("log at = %q: %v", at, err)
	} else if got.Before(before) || got.After(after) {
		t.Errorf("log at = %v, want between %v and %v", got, before, after)
	}
	for _, secret := range []string{"RAW-KEY", url.PathEscape(rawKey), "RAW-SCOPE", testToken} {
		if strings.Contains(failed+logs.String(), secret) {
			t.Errorf("audit log contains %q:\n%s%s", secret, failed, logs.String())
		}
	}
}

// TestStoreErrors: a store that cannot answer gives 503, on the real
// Badger store once it is closed: a store-unavailable problem from the key
// API, the probe's text from /readyz.
func TestStoreErrors(t *testing.T) {
	st := openStore(t)
	seed(t, st, store.Key("charges", "", "k"), seedCompleted)
	h := newHandler(t, st, nil)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ method, target string }{
		{http.MethodGet, "/v1/keys/charges/k"},
		{http.MethodDelete, "/v1/keys/charges/k"},
		{http.MethodGet, "/readyz"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			rec := serve(t, h, tt.method, tt.target, bearer, nil)
			if tt.target == "/readyz" {
				if rec.Code != http.StatusServiceUnavailable || !strings.HasPrefix(rec.Body.String(), "store unavailable") {
					t.Errorf("/readyz = %d %q, want 503 saying the store is unavailable", rec.Code, rec.Body)
				}
				return
			}
			_, storeErr := st.Get(context.Background(), store.Key("charges", "", "k"))
			if p := checkProblem(t, rec, tt.target, http.StatusServiceUnavailable, "store-unavailable"); storeErr == nil || p.Detail != storeErr.Error() {
				t.Errorf("detail = %q, want the store's error %v", p.Detail, storeErr)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	st := openStore(t)
	tests := []struct {
		name      string
		store     admin.Store
		stopping  bool
		optional  bool // every route fails open
		wantReady int
		wantBody  string
	}{
		{"ready", st, false, false, http.StatusOK, "ready"},
		{"stopping", st, true, false, http.StatusServiceUnavailable, "shutting down"},
		{"ping fails", failingPing{st}, false, false, http.StatusServiceUnavailable, "disk on fire"},
		{"ping fails and stopping", failingPing{st}, true, false, http.StatusServiceUnavailable, "shutting down"},
		{"ping fails, every route fails open", failingPing{st}, false, true, http.StatusOK, "disk on fire"},
		{"every route fails open, stopping", failingPing{st}, true, true, http.StatusServiceUnavailable, "shutting down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, tt.store, func(o *admin.Options) { o.StoreOptional = func() bool { return tt.optional } })
			if tt.stopping {
				h.SetStopping()
			}
			for range 2 { // the answer does not change on its own
				rec := serve(t, h, http.MethodGet, "/readyz", "", nil)
				if rec.Code != tt.wantReady || !strings.Contains(rec.Body.String(), tt.wantBody) {
					t.Errorf("/readyz = %d %q, want %d containing %q", rec.Code, rec.Body, tt.wantReady, tt.wantBody)
				}
				if rec := serve(t, h, http.MethodGet, "/livez", "", nil); rec.Code != http.StatusOK {
					t.Errorf("/livez = %d, want 200", rec.Code)
				}
			}
		})
	}

	t.Run("ready then stopping", func(t *testing.T) {
		h := newHandler(t, st, nil)
		if rec := serve(t, h, http.MethodGet, "/readyz", "", nil); rec.Code != http.StatusOK {
			t.Fatalf("/readyz before SetStopping = %d, want 200", rec.Code)
		}
		h.SetStopping()
		if rec := serve(t, h, http.MethodGet, "/readyz", "", nil); rec.Code != http.StatusServiceUnavailable {
			t.Errorf("/readyz after SetStopping = %d, want 503", rec.Code)
		}
		if rec := serve(t, h, http.MethodGet, "/livez", "", nil); rec.Code != http.StatusOK {
			t.Errorf("/livez after SetStopping = %d, want 200", rec.Code)
		}
	})

	t.Run("livez with the store closed", func(t *testing.T) {
		closed := openStore(t)
		closed.Close()
		h := newHandler(t, closed, nil)
		if rec := serve(t, h, http.MethodGet, "/livez", "", nil); rec.Code != http.StatusOK {
			t.Errorf("/livez = %d, want 200", rec.Code)
		}
	})
}

func TestMetrics(t *testing.T) {
	st := openStore(t)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idemproxy_admin_test_total", Help: "Test counter."}, []string{"route"})
	reg.MustRegister(c)
	c.WithLabelValues("charges").Add(3)
	h := newHandler(t, st, func(o *admin.Options) { o.Gatherer = reg })

	tests := []struct {
		name, accept, wantType string
	}{
		{"text", "", "text/plain"},
		{"openmetrics", "application/openmetrics-text; version=1.0.0", "application/openmetrics-text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := http.Header{}
			if tt.accept != "" {
				hdr.Set("Accept", tt.accept)
			}
			rec := serve(t, h, http.MethodGet, "/metrics", "", hdr)
			if rec.Code != http.StatusOK {
				t.Fatalf("/metrics = %d, want 200", rec.Code)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tt.wantType) {
				t.Errorf("Content-Type = %q, want %s", ct, tt.wantType)
			}
			body := rec.Body.String()
			if want := `idemproxy_admin_test_total{route="charges"} 3`; !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
			if strings.Contains(body, "go_goroutines") {
				t.Errorf("/metrics shows the default registry, want only the given one:\n%s", body)
			}
		})
	}

	t.Run("nil gatherer is the default registry", func(t *testing.T) {
		h := newHandler(t, st, func(o *admin.Options) { o.Gatherer = nil })
		rec := serve(t, h, http.MethodGet, "/metrics", "", nil)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "go_goroutines") {
			t.Errorf("/metrics = %d, want 200 with go_goroutines", rec.Code)
		}
	})
}

func TestReload(t *testing.T) {
	st := openStore(t)
	tests := []struct {
		name     string
		reload   func() error
		method   string
		auth     string
		token    string
		want     int
		wantType string // the problem's, for an error
		wantBody string
		wantCall bool
	}{
		{"ok", func() error { return nil }, http.MethodPost, bearer, testToken, http.StatusOK, "", "reloaded", true},
		{"failing", func() error { return errors.New("routes[2].match: bad pattern") }, http.MethodPost, bearer, testToken, http.StatusBadRequest, "reload-failed", "routes[2].match: bad pattern", true},
		{"nil", nil, http.MethodPost, bearer, testToken, http.StatusNotFound, "reload-unavailable", "does not reload", false},
		{"GET is not allowed", func() error { return nil }, http.MethodGet, bearer, testToken, http.StatusMethodNotAllowed, "method-not-allowed", "allowed: POST", false},
		{"no token sent", func() error { return nil }, http.MethodPost, "", testToken, http.StatusUnauthorized, "unauthorized", "bearer token", false},
		{"wrong token", func() error { return nil }, http.MethodPost, "Bearer guess", testToken, http.StatusUnauthorized, "unauthorized", "bearer token", false},
		{"no token configured", func() error { return nil }, http.MethodPost, "Bearer ", "", http.StatusForbidden, "admin-api-disabled", "disabled", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			var reload func() error
			if tt.reload != nil {
				reload = func() error { called = true; return tt.reload() }
			}
			h := newHandler(t, st, func(o *admin.Options) { o.Reload, o.Token = reload, tt.token })
			rec := serve(t, h, tt.method, "/-/reload", tt.auth, nil)
			if rec.Code != tt.want || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("%s /-/reload = %d %q, want %d containing %q", tt.method, rec.Code, rec.Body, tt.want, tt.wantBody)
			}
			if tt.wantType != "" {
				checkProblem(t, rec, "/-/reload", tt.want, tt.wantType)
			}
			if tt.want == http.StatusMethodNotAllowed && rec.Header().Get("Allow") != "POST" {
				t.Errorf("Allow = %q, want POST", rec.Header().Get("Allow"))
			}
			if called != tt.wantCall {
				t.Errorf("Reload called = %v, want %v", called, tt.wantCall)
			}
		})
	}
}

func TestPprof(t *testing.T) {
	st := openStore(t)
	on := newHandler(t, st, func(o *admin.Options) { o.Pprof = true })
	off := newHandler(t, st, nil)
	tests := []struct {
		name string
		h    http.Handler
		auth string
		want int
	}{
		{"enabled, with the token", on, bearer, http.StatusOK},
		{"enabled, no token", on, "", http.StatusUnauthorized},
		{"enabled, wrong token", on, "Bearer nope", http.StatusUnauthorized},
		{"disabled", off, bearer, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(t, tt.h, "GET", "/debug/pprof/goroutine?debug=1", tt.auth, nil)
			if rec.Code != tt.want {
				t.Fatalf("GET /debug/pprof/goroutine: status %d, want %d: %s", rec.Code, tt.want, rec.Body)
			}
			if tt.want == http.StatusNotFound {
				checkProblem(t, rec, "/debug/pprof/goroutine", tt.want, "not-found")
			}
			if tt.want == http.StatusOK && !strings.Contains(rec.Body.String(), "goroutine profile") {
				t.Errorf("body is not a goroutine profile: %.200s", rec.Body)
			}
		})
	}
	if rec := serve(t, on, "GET", "/debug/pprof/", "", nil); rec.Code != http.StatusUnauthorized {
		t.Errorf("GET /debug/pprof/ without the token: status %d, want 401", rec.Code)
	}
}

// replacedAfterGet is the real Badger store whose Get, once, lets the key
// move on after it was read: the record read is settled (a reconcile
// lookup's release, or its TTL) and a client's retry reserves the key again.
type replacedAfterGet struct {
	*badger.Store
	once  *sync.Once
	after func()
}

func (s replacedAfterGet) Get(ctx context.Context, key string) (*store.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	s.once.Do(s.after)
	return rec, err
}

// TestReleaseLeavesANewReservationAlone: a DELETE releases the record it
// read. A reservation made since, whose request is at the upstream now,
// is not removed: a second retry would be forwarded while the first is
// still being charged.
func TestReleaseLeavesANewReservationAlone(t *testing.T) {
	st := openStore(t)
	sk := store.Key("charges", "", "raced")
	seed(t, st, sk, seedInDoubt)
	retry := store.Reservation{Token: "retry-owner", Fingerprint: "fp-retry", Lease: lease, TTL: ttl}
	racing := replacedAfterGet{Store: st, once: new(sync.Once), after: func() {
		ctx := context.Background()
		if err := st.Release(ctx, sk, ownerToken); err != nil {
			t.Errorf("settle the record read: %v", err)
		}
		if prev, err := st.Reserve(ctx, sk, retry); err != nil || prev != nil {
			t.Errorf("retry's Reserve = %v, %v; want nil, nil", prev, err)
		}
	}}
	h := newHandler(t, racing, nil)
	checkProblem(t, serve(t, h, http.MethodDelete, "/v1/keys/charges/raced", bearer, nil), "/v1/keys/charges/raced", http.StatusConflict, "key-changed")
	got, err := st.Get(context.Background(), sk)
	if err != nil || got == nil || got.State != store.StateInFlight || got.Token != retry.Token {
		t.Fatalf("record after the DELETE = %+v, %v; want the retry's reservation, in flight", got, err)
	}
}

// TestReadyChecks: a failing ready check makes /readyz 503 with its reason,
// also when every route fails open; passing checks leave it ready, and
// shutting down still wins.
func TestReadyChecks(t *testing.T) {
	st := openStore(t)
	saturated := func() error { return errors.New("connection limit reached") }
	fine := func() error { return nil }
	tests := []struct {
		name      string
		store     admin.Store
		checks    []func() error
		optional  bool
		stopping  bool
		wantReady int
		wantBody  string
	}{
		{"checks pass", st, []func() error{fine, fine}, false, false, http.StatusOK, "ready"},
		{"one check fails", st, []func() error{fine, saturated}, false, false, http.StatusServiceUnavailable, "connection limit reached"},
		{"fails, every route fails open", failingPing{st}, []func() error{saturated}, true, false, http.StatusServiceUnavailable, "connection limit reached"},
		{"fails and stopping", st, []func() error{saturated}, false, true, http.StatusServiceUnavailable, "shutting down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, tt.store, func(o *admin.Options) {
				o.ReadyChecks = tt.checks
				o.StoreOptional = func() bool { return tt.optional }
			})
			if tt.stopping {
				h.SetStopping()
			}
			rec := serve(t, h, http.MethodGet, "/readyz", "", nil)
			if rec.Code != tt.wantReady || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("/readyz = %d %q, want %d containing %q", rec.Code, rec.Body, tt.wantReady, tt.wantBody)
			}
		})
	}
}

// TestProblems: the admin API's problem types are stable names, each with
// one status and title; a name the proxy answers with too means the same
// there (same status and title).
func TestProblems(t *testing.T) {
	proxyProblems := map[string]struct {
		status int
		title  string
	}{}
	for _, p := range proxy.Problems() {
		proxyProblems[p.Name] = struct {
			status int
			title  string
		}{p.Status, p.Title}
	}
	kebab := regexp.MustCompile(`^[a-z]+(-[a-z]+)*$`)
	seen := map[string]bool{}
	for _, p := range admin.Problems() {
		if seen[p.Name] {
			t.Errorf("problem %q is listed twice", p.Name)
		}
		seen[p.Name] = true
		if !kebab.MatchString(p.Name) || p.Title == "" || p.Status < 400 || p.Status > 599 {
			t.Errorf("problem %+v: want a lower-case hyphenated name, a title and an error status", p)
		}
		if q, ok := proxyProblems[p.Name]; ok && (q.status != p.Status || q.title != p.Title) {
			t.Errorf("problem %q is %d %q in the admin API but %d %q in the proxy", p.Name, p.Status, p.Title, q.status, q.title)
		}
	}
}

// reconcileErr is a Reconciler whose every lookup fails with err.
type reconcileErr struct{ err error }

func (r reconcileErr) Reconcile(context.Context, string) (reconcile.Outcome, error) {
	return reconcile.Outcome{}, r.err
}

// TestReconcileErrors: each error of a reconcile request is its own
// problem, carrying the key's state.
func TestReconcileErrors(t *testing.T) {
	st := openStore(t)
	seed(t, st, store.Key("charges", "", "k"), seedCompleted)
	const target = "/v1/keys/charges/k/reconcile"
	tests := []struct {
		name       string
		reconciler admin.Reconciler
		want       int
		wantType   string
		wantState  string
	}{
		{"no reconciler", nil, http.StatusNotFound, "reconcile-unavailable", ""},
		{"route without reconcile", reconcileErr{reconcile.ErrNoLookup}, http.StatusBadRequest, "no-reconcile-lookup", "completed"},
		{"not in doubt", reconcileErr{fmt.Errorf("reconcile: %w", store.ErrNotInDoubt)}, http.StatusConflict, "key-not-in-doubt", "completed"},
		{"lookup running", reconcileErr{store.ErrLookupBusy}, http.StatusConflict, "lookup-running", "completed"},
		{"store failed", reconcileErr{errors.New("connection refused")}, http.StatusServiceUnavailable, "store-unavailable", "completed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, st, func(o *admin.Options) { o.Reconciler = tt.reconciler })
			p := checkProblem(t, serve(t, h, http.MethodPost, target, bearer, nil), target, tt.want, tt.wantType)
			if p.State != tt.wantState {
				t.Errorf("state = %q, want %q", p.State, tt.wantState)
			}
		})
	}
}

// TestUnmatchedRequests: a path the admin API does not serve is a
// not-found problem, a method it does not serve there a
// method-not-allowed problem with Allow; ServeMux's redirect to a cleaned
// path stays a redirect.
func TestUnmatchedRequests(t *testing.T) {
	h := newHandler(t, openStore(t), nil)
	tests := []struct {
		name, method, target string
		want                 int
		wantType, wantAllow  string
	}{
		{"unknown path", http.MethodGet, "/nope", http.StatusNotFound, "not-found", ""},
		{"key API without a route", http.MethodGet, "/v1/keys/", http.StatusNotFound, "not-found", ""},
		{"POST on /livez", http.MethodPost, "/livez", http.StatusMethodNotAllowed, "method-not-allowed", "GET, HEAD"},
		{"PUT on a key", http.MethodPut, "/v1/keys/charges/k", http.StatusMethodNotAllowed, "method-not-allowed", "DELETE, GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(t, h, tt.method, tt.target, bearer, nil)
			checkProblem(t, rec, tt.target, tt.want, tt.wantType)
			if got := rec.Header().Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tt.wantAllow)
			}
		})
	}
	rec := serve(t, h, http.MethodGet, "/x/../nope", "", nil)
	if rec.Code != http.StatusTemporaryRedirect || rec.Header().Get("Location") != "/nope" {
		t.Errorf("GET /x/../nope = %d, Location %q; want 307 to /nope", rec.Code, rec.Header().Get("Location"))
	}
}

// TestReadyzReadsTheWriteProbe: once the store's write probe has a
// verdict, /readyz answers it without asking the store (a store that
// answers pings but refuses writes is not ready; one whose ping would
// fail is not asked); StoreOptional and ReadyChecks keep their meaning;
// before the first probe, the store is pinged.
func TestReadyzReadsTheWriteProbe(t *testing.T) {
	st := openStore(t)
	writes := store.NewWriteProbe(st, store.ProbeOptions{})
	if err := writes.Probe(context.Background()); err != nil {
		t.Fatalf("probe of an open store: %v", err)
	}
	closed := openStore(t)
	closed.Close()
	refuses := store.NewWriteProbe(closed, store.ProbeOptions{})
	if err := refuses.Probe(context.Background()); err == nil {
		t.Fatal("probe of a closed store succeeded")
	}
	notYet := store.NewWriteProbe(st, store.ProbeOptions{})
	busy := errors.New("connection limit reached")
	tests := []struct {
		name      string
		store     admin.Store
		probe     admin.Prober
		optional  bool
		check     error
		wantReady int
		wantBody  string
	}{
		{"writes", failingPing{st}, writes, false, nil, http.StatusOK, "ready"},
		{"writes fail", st, refuses, false, nil, http.StatusServiceUnavailable, "store unavailable: "},
		{"writes fail, every route fails open", st, refuses, true, nil, http.StatusOK, "every route fails open"},
		{"writes fail, a ready check fails first", st, refuses, false, busy, http.StatusServiceUnavailable, busy.Error()},
		{"writes, a ready check fails", st, writes, true, busy, http.StatusServiceUnavailable, busy.Error()},
		{"no verdict yet: the store is pinged", failingPing{st}, notYet, false, nil, http.StatusServiceUnavailable, "disk on fire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, tt.store, func(o *admin.Options) {
				o.StoreProbe = tt.probe
				o.StoreOptional = func() bool { return tt.optional }
				o.ReadyChecks = []func() error{func() error { return nil }, func() error { return tt.check }}
			})
			rec := serve(t, h, http.MethodGet, "/readyz", "", nil)
			if rec.Code != tt.wantReady || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("/readyz = %d %q, want %d containing %q", rec.Code, rec.Body, tt.wantReady, tt.wantBody)
			}
		})
	}
}

// sendKeyAPI sends method to the key API's path /v1/keys/ + path, as
// given (escaped or not), with the token, through the real server srv and
// its client; it returns the status and the body.
func sendKeyAPI(t *testing.T, srv *httptest.Server, method, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+"/v1/keys/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", bearer)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// reconcileSeen is a reconciler that answers applied and remembers the
// store keys it was asked about.
type reconcileSeen struct {
	mu   sync.Mutex
	keys []string
}

func (r *reconcileSeen) Reconcile(_ context.Context, storeKey string) (reconcile.Outcome, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, storeKey)
	return reconcile.Outcome{Result: reconcile.ResultApplied, LookupStatus: http.StatusOK}, nil
}

// TestKeyWithSlashesThroughEveryAct: a key holding '/' is read, reconciled
// and released through the key API, with its slashes as sent or escaped
// (as `idemproxy keys` sends them), always the same key; a POST to a key's
// path that is not a reconcile is a 405.
func TestKeyWithSlashesThroughEveryAct(t *testing.T) {
	st := openStore(t)
	seen := &reconcileSeen{}
	srv := httptest.NewServer(newHandler(t, st, func(o *admin.Options) { o.Reconciler = seen }))
	defer srv.Close()
	do := func(method, path string) (int, []byte) { return sendKeyAPI(t, srv, method, "charges/"+path) }
	for _, tc := range []struct{ key, path string }{
		{"orders/2024/4711", "orders/2024/4711"},
		{"orders/2024/4712", "orders%2F2024%2F4712"},
		{"a/reconcile", "a/reconcile"}, // a key that ends as the endpoint does
		{"reconcile", "reconcile"},
	} {
		sk := store.Key("charges", "", tc.key)
		seed(t, st, sk, seedInDoubt)
		code, body := do(http.MethodGet, tc.path)
		var got keyView
		if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil || got.Key != tc.key {
			t.Errorf("GET %s = %d %s, want 200 with key %q", tc.path, code, body, tc.key)
		}
		seen.mu.Lock()
		seen.keys = nil
		seen.mu.Unlock()
		if code, body := do(http.MethodPost, tc.path+"/reconcile"); code != http.StatusOK {
			t.Errorf("POST %s/reconcile = %d %s, want 200", tc.path, code, body)
		}
		seen.mu.Lock()
		if !slices.Equal(seen.keys, []string{sk}) {
			t.Errorf("POST %s/reconcile reconciled %q, want the key %q", tc.path, seen.keys, tc.key)
		}
		seen.mu.Unlock()
		if code, body := do(http.MethodDelete, tc.path); code != http.StatusOK {
			t.Errorf("DELETE %s = %d %s, want 200", tc.path, code, body)
		}
		if rec, err := st.Get(t.Context(), sk); err != nil || rec != nil {
			t.Errorf("after DELETE %s: record %+v, %v; want none", tc.path, rec, err)
		}
	}
	for _, path := range []string{"orders/2024/4711", "a%2Freconcile"} {
		if code, body := do(http.MethodPost, path); code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s = %d %s, want 405", path, code, body)
		}
	}
}

// TestReleaseWritesItsMarkFirst: a release writes the key's release mark
// (Options.MarkReleased) before it removes the record, so that a witness
// of the key on any replica reads it; a mark that cannot be written
// refuses the release with 503 and removes nothing.
func TestReleaseWritesItsMarkFirst(t *testing.T) {
	st := openStore(t)
	var marked []string
	var markErr error
	h := newHandler(t, st, func(o *admin.Options) {
		o.MarkReleased = func(ctx context.Context, sk string) error {
			if markErr != nil {
				return markErr
			}
			if rec, err := st.Get(ctx, sk); err != nil || rec == nil {
				t.Errorf("the mark of %s written after its record was removed (%v, %v)", sk, rec, err)
			}
			marked = append(marked, sk)
			return nil
		}
	})
	sk := store.Key("charges", "", "mark-1")
	seed(t, st, sk, seedCompleted)
	if rec := serve(t, h, http.MethodDelete, "/v1/keys/charges/mark-1", bearer, nil); rec.Code != http.StatusOK {
		t.Fatalf("DELETE = %d %s, want 200", rec.Code, rec.Body)
	}
	if len(marked) != 1 || marked[0] != sk {
		t.Errorf("marks written %q, want one for %s", marked, sk)
	}
	sk2 := store.Key("charges", "", "mark-2")
	seed(t, st, sk2, seedCompleted)
	markErr = errors.New("store down")
	if rec := serve(t, h, http.MethodDelete, "/v1/keys/charges/mark-2", bearer, nil); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("DELETE with the mark refused = %d %s, want 503", rec.Code, rec.Body)
	}
	if rec, err := st.Get(context.Background(), sk2); err != nil || rec == nil {
		t.Errorf("the release without a mark removed the record: %v, %v", rec, err)
	}
}
