package admin_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/testenv/otlptest"
	"github.com/idemproxy/idemproxy/store"
)

// TestOperatorActsAreTraced: with tracing on, a release through the key
// API and one through the console each get a server span naming the
// route and the operator (the console's: its session's); the console's
// pages, which only read, and the probes are not traced.
func TestOperatorActsAreTraced(t *testing.T) {
	r := otlptest.NewHTTP(t)
	tr := r.Tracing(t)
	e := newConsoleEnv(t, func(o *admin.Options) { o.Tracing = tr })
	seed(t, e.st, store.Key("charges", "", "tr-api"), seedInDoubt)
	seed(t, e.st, store.Key("charges", "", "tr-ui"), seedInDoubt)

	if rec := serve(t, e.h, http.MethodDelete, "/v1/keys/charges/tr-api?reason=x", bearer, http.Header{"X-Operator": {"erin"}}); rec.Code != http.StatusOK {
		t.Fatalf("API release = %d %s", rec.Code, rec.Body)
	}
	b := e.login("frank")
	page := b.keyPage("tr-ui")
	if rec := b.do(http.MethodPost, "/ui/release", actForm(t, page, "y")); rec.Code != http.StatusOK {
		t.Fatalf("console release = %d %s", rec.Code, rec.Body)
	}
	serve(t, e.h, http.MethodGet, "/readyz", "", nil)
	if err := tr.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := r.WaitFor(t, 10*time.Second, "two admin spans", func(s []otlptest.Span) bool { return len(s) >= 2 })
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	// A console act answers 303 to the page of its outcome (post/redirect/get).
	for name, want := range map[string]struct{ operator, status string }{
		"DELETE /v1/keys/{route}/{key...}": {"erin", "200"}, "POST /ui/release": {"frank", "303"}} {
		s, ok := byName[name]
		if !ok {
			t.Errorf("no span %q among %v", name, spans)
			continue
		}
		if s.Attr("idemproxy.operator") != want.operator || s.Attr("http.response.status_code") != want.status {
			t.Errorf("%s: operator %q, status %q; want %q, %s", name, s.Attr("idemproxy.operator"), s.Attr("http.response.status_code"), want.operator, want.status)
		}
	}
	if len(spans) != 2 {
		t.Errorf("%d spans, want the two acts only (no page, no probe): %v", len(spans), spans)
	}
}

// TestAdminSpansLeaveTheKeyOut: the key API's spans give the key in their
// path as the route's placeholder, never as sent: the audit log names a
// key only by its hash, and so do the traces (docs/observability.md).
func TestAdminSpansLeaveTheKeyOut(t *testing.T) {
	const key = "ORD-SECRET-4111/1"
	r := otlptest.NewHTTP(t)
	tr := r.Tracing(t)
	st := openStore(t)
	seed(t, st, store.Key("charges", "", key), seedInDoubt)
	h := newHandler(t, st, func(o *admin.Options) { o.Tracing = tr })
	for _, c := range []struct {
		method, target, wantName, wantPath string
	}{
		{"GET", "/v1/keys/charges/" + key, "GET /v1/keys/{route}/{key...}", "/v1/keys/charges/{key}"},
		{"POST", "/v1/keys/charges/ORD-SECRET-4111/reconcile", "POST /v1/keys/{route}/{key}/reconcile", "/v1/keys/charges/{key}/reconcile"},
		{"DELETE", "/v1/keys/charges/" + key, "DELETE /v1/keys/{route}/{key...}", "/v1/keys/charges/{key}"},
		{"GET", "/v1/keys/charges", "GET /v1/keys/{route}", "/v1/keys/charges"},
	} {
		serve(t, h, c.method, c.target, bearer, http.Header{"X-Operator": {"alice"}})
		spans := r.WaitFor(t, 10*time.Second, c.wantName+" span", func(s []otlptest.Span) bool {
			return len(otlptest.Find(s, otlptest.Named(c.wantName))) > 0
		})
		if got := otlptest.Find(spans, otlptest.Named(c.wantName))[0].Attr("url.path"); got != c.wantPath {
			t.Errorf("%s %s: span url.path = %q, want %q", c.method, c.target, got, c.wantPath)
		}
	}
	for _, s := range r.Spans() {
		for k, v := range s.Attrs {
			if strings.Contains(fmt.Sprint(v), "SECRET") {
				t.Errorf("span %q: attribute %s = %q holds the key", s.Name, k, v)
			}
		}
	}
}

// TestConsoleActSpanNamesTheSession: a console act's span names the
// session's operator, as its audit line does, whatever X-Operator the
// request carries (a console request is not the key API's: that header
// names no one there).
func TestConsoleActSpanNamesTheSession(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"no X-Operator", nil},
		{"another name in X-Operator", http.Header{"X-Operator": {"mallory"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := otlptest.NewHTTP(t)
			tr := r.Tracing(t)
			e := newConsoleEnv(t, func(o *admin.Options) { o.Tracing = tr })
			seed(t, e.st, store.Key("charges", "", "tr-op"), seedInDoubt)
			b := e.login("frank")
			page := b.keyPage("tr-op")
			if rec := b.doHeader(http.MethodPost, "/ui/release", actForm(t, page, "y"), tc.header); rec.Code != http.StatusOK {
				t.Fatalf("console release = %d %s", rec.Code, rec.Body)
			}
			if err := tr.Shutdown(t.Context()); err != nil {
				t.Fatal(err)
			}
			spans := r.WaitFor(t, 10*time.Second, "the release's span", func(s []otlptest.Span) bool {
				return len(otlptest.Find(s, otlptest.Named("POST /ui/release"))) > 0
			})
			if got := otlptest.Find(spans, otlptest.Named("POST /ui/release"))[0].Attr("idemproxy.operator"); got != "frank" {
				t.Errorf("span's idemproxy.operator = %q, want the session's, %q", got, "frank")
			}
		})
	}
}
