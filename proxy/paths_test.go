package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync/atomic"
	"testing"
)

// An upstream that routes on the decoded path (gorilla/mux default,
// Go's pre-1.22 ServeMux, nginx location matching) and treats a trailing
// slash as the same endpoint (Express non-strict routing).
func decodedPathUpstream(t *testing.T, endpoint string, n *atomic.Int32) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && path.Clean(r.URL.Path) == endpoint {
			n.Add(1)
		}
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)
	return up.URL
}

func rawPost(t *testing.T, e *proxytest.Env, rawPath, key string) int {
	req, _ := http.NewRequest("POST", e.Server.URL+"/", strings.NewReader(`{}`))
	req.URL.Opaque = rawPath // sent byte for byte
	req.Header.Set("Idempotency-Key", key)
	resp, err := e.Server.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestEncodedSlashIsProtected: "/v1%2Fcharges" is /v1/charges to upstreams
// that route on the decoded path; it must not pass through unprotected.
func TestEncodedSlashIsProtected(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	e := &proxytest.Env{T: t}
	e.Start(decodedPathUpstream(t, "/v1/charges", &n), `
  - name: charges
    match: POST /v1/charges
    key: {header: Idempotency-Key}
`)
	rawPost(t, e, "/v1%2Fcharges", "k1")
	rawPost(t, e, "/v1%2Fcharges", "k1")
	if n.Load() != 1 {
		t.Errorf("/v1%%2Fcharges with one key charged %d times", n.Load())
	}
}

// TestTrailingSlashPatternIsProtected: a pattern that ends in a slash
// protects the same path without it, and unclean variants of it.
func TestTrailingSlashPatternIsProtected(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/charges", "/charges//", "/charges/."} {
		var n atomic.Int32
		e := &proxytest.Env{T: t}
		e.Start(decodedPathUpstream(t, "/charges", &n), `
  - name: charges
    match: POST /charges/{$}
    key: {header: Idempotency-Key}
`)
		rawPost(t, e, p, "k1")
		rawPost(t, e, p, "k1")
		if n.Load() != 1 {
			t.Errorf("%s with one key charged %d times", p, n.Load())
		}
	}
}

// TestEscapedSlashInWildcardWithTrailingSlashIsProtected: to an upstream
// that routes on the escaped path and treats a trailing slash as the same
// endpoint (Express: "/orders/A%2FB/charges/" is order A/B's charges),
// the retry with a trailing slash is the same charge. Matched only in its
// decoded form (/orders/A/B/charges, which no route matches), it passed
// through unprotected and was charged a second time.
func TestEscapedSlashInWildcardWithTrailingSlashIsProtected(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && strings.TrimSuffix(r.URL.EscapedPath(), "/") == "/orders/A%2FB/charges" {
			n.Add(1)
		}
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: order-charges
    match: POST /orders/{id}/charges
    key: {path: id}
`)
	for _, p := range []string{"/orders/A%2FB/charges", "/orders/A%2FB/charges/"} {
		if status := rawPost(t, e, p, ""); status != 201 {
			t.Errorf("%s: %d, want 201", p, status)
		}
	}
	if n.Load() != 1 {
		t.Errorf("order A/B charged %d times, want once", n.Load())
	}
	if got := e.State("order-charges", "", "A/B"); got != "completed" {
		t.Errorf("key A/B is %q, want completed", got)
	}
}

// TestQueryKeyGoCannotParseIsNotForwardedUnprotected: "?id=50%off" holds
// a bad escape, which Go's url.ParseQuery leaves out, but PHP and
// Express read it as id "50%off". With on_missing_key: forward, the proxy
// took the key for missing and forwarded every delivery unprotected: the
// order was charged twice. The key is invalid (400), as a repeated
// parameter is.
func TestQueryKeyGoCannotParseIsNotForwardedUnprotected(t *testing.T) {
	t.Parallel()
	for _, query := range []string{"id=50%off", "id=A;B", "x=1;id=A", "id=A&id=50%off"} {
		var n atomic.Int32
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.WriteHeader(201)
		}))
		e := &proxytest.Env{T: t}
		e.Start(up.URL, `
  - name: charges
    match: POST /charges
    key: {query: id}
    on_missing_key: forward
`)
		for range 2 {
			proxytest.WantStatus(t, query, e.Do("POST", "/charges?"+query, `{}`), 400, "invalid-key")
		}
		if n.Load() != 0 {
			t.Errorf("%s: forwarded %d times, want none", query, n.Load())
		}
		up.Close()
	}
}
