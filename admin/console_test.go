package admin_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// namedRoutes are the test routes, listing their names as the program's
// do (admin.RouteNamer).
type namedRoutes map[string]string

func (r namedRoutes) RouteScope(name string) (string, bool) {
	h, ok := r[name]
	return h, ok
}

func (r namedRoutes) RouteNames() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// wantCSP is the console's Content-Security-Policy.
const wantCSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// consoleEnv is a console on a real Badger store, its audit log, and the
// metrics registry.
type consoleEnv struct {
	t    *testing.T
	st   *badger.Store
	h    *admin.Handler
	logs *bytes.Buffer
	reg  *prometheus.Registry
}

func newConsoleEnv(t *testing.T, change func(*admin.Options)) *consoleEnv {
	t.Helper()
	return newConsoleEnvOn(t, openStore(t), change)
}

// newConsoleEnvOn is newConsoleEnv on st.
func newConsoleEnvOn(t *testing.T, st *badger.Store, change func(*admin.Options)) *consoleEnv {
	t.Helper()
	e := &consoleEnv{t: t, st: st, logs: &bytes.Buffer{}, reg: prometheus.NewRegistry()}
	e.h = newHandler(t, e.st, func(o *admin.Options) {
		o.Routes = namedRoutes{"charges": "", "refunds": "X-Tenant"}
		o.Logger = slog.New(slog.NewJSONHandler(e.logs, nil))
		o.Registerer = e.reg
		if change != nil {
			change(o)
		}
	})
	return e
}

// browser is one operator's browser: its address and session cookie.
type browser struct {
	e       *consoleEnv
	remote  string
	session string
	tls     bool
	// noFollow: an act's redirect to its outcome is answered as it is,
	// not followed.
	noFollow bool
}

// do sends a request; a non-nil form is its urlencoded body.
func (b *browser) do(method, target string, form url.Values) *httptest.ResponseRecorder {
	b.e.t.Helper()
	return b.doHeader(method, target, form, nil)
}

// doHeader is do with more headers.
func (b *browser) doHeader(method, target string, form url.Values, header http.Header) *httptest.ResponseRecorder {
	b.e.t.Helper()
	var req *http.Request
	if form != nil {
		req = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	req.RemoteAddr = b.remote
	req.Header.Set("User-Agent", "console-test")
	if b.tls {
		req.TLS = &tls.ConnectionState{}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if b.session != "" {
		req.AddCookie(&http.Cookie{Name: "idemproxy_console", Value: b.session})
	}
	rec := httptest.NewRecorder()
	b.e.h.ServeHTTP(rec, req)
	if loc := rec.Header().Get("Location"); method == http.MethodPost && rec.Code == http.StatusSeeOther && actPaths[target] && !b.noFollow {
		// Post/redirect/get: an act answers a redirect to the page of its
		// outcome, which a browser follows.
		return b.doHeader(http.MethodGet, loc, nil, nil)
	}
	return rec
}

// actPaths are the console's acts, which redirect to their outcome.
var actPaths = map[string]bool{"/ui/reconcile": true, "/ui/release": true, "/ui/bulk-release": true}

// login logs operator in from a fresh address and returns the browser.
func (e *consoleEnv) login(operator string) *browser {
	e.t.Helper()
	b := &browser{e: e, remote: "192.0.2.10:40000"}
	rec := b.do(http.MethodPost, "/ui/login", url.Values{"token": {testToken}, "operator": {operator}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/ui/" {
		e.t.Fatalf("login = %d, Location %q; want 303 to /ui/; body %s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	c := sessionCookieOf(rec)
	if c == nil {
		e.t.Fatalf("login set no session cookie: %v", rec.Header()["Set-Cookie"])
	}
	b.session = c.Value
	return b
}

// sessionCookieOf is the session cookie an answer sets, nil for none.
func sessionCookieOf(rec *httptest.ResponseRecorder) *http.Cookie {
	for _, c := range rec.Result().Cookies() {
		if c.Name == "idemproxy_console" {
			return c
		}
	}
	return nil
}

// field returns the value of the first input named name in page.
func field(t *testing.T, page, name string) string {
	t.Helper()
	m := regexp.MustCompile(`name="` + regexp.QuoteMeta(name) + `"[^>]*value="([^"]*)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no input named %s in the page:\n%s", name, page)
	}
	return html.UnescapeString(m[1])
}

// fields returns the values of every input named name in page.
func fields(page, name string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`name="`+regexp.QuoteMeta(name)+`"[^>]*value="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

// element returns the text of the element with id in page, "" and false
// when there is none.
func element(page, tag, id string) (string, bool) {
	m := regexp.MustCompile(`(?s)<` + tag + ` id="` + regexp.QuoteMeta(id) + `"[^>]*>(.*?)</` + tag + `>`).FindStringSubmatch(page)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// result returns the class and text of div#result.
func result(page string) (class, text string) {
	m := regexp.MustCompile(`(?s)<div id="result" class="(ok|error)">(.*?)</div>`).FindStringSubmatch(page)
	if m == nil {
		return "", ""
	}
	return m[1], html.UnescapeString(m[2])
}

// record reads the record under sk.
func (e *consoleEnv) record(sk string) *store.Record {
	e.t.Helper()
	rec, err := e.st.Get(context.Background(), sk)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec
}

// auditLines are the audit log's lines of acts (release, reconcile),
// decoded.
func (e *consoleEnv) auditLines() []map[string]any {
	e.t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			e.t.Fatalf("log line %q: %v", l, err)
		}
		if msg, _ := m["msg"].(string); strings.HasPrefix(msg, "key ") {
			out = append(out, m)
		}
	}
	return out
}

func TestConsoleDisabledWithoutAToken(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Token = "" })
	b := &browser{e: e, remote: "192.0.2.1:1"}
	for _, tc := range []struct{ method, target string }{
		{http.MethodGet, "/ui/"},
		{http.MethodGet, "/ui/login"},
		{http.MethodPost, "/ui/login"},
		{http.MethodGet, "/ui/keys?route=charges"},
		{http.MethodGet, "/ui/static/console.css"},
		{http.MethodPost, "/ui/release"},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			var form url.Values
			if tc.method == http.MethodPost {
				form = url.Values{"token": {""}, "operator": {"mallory"}}
			}
			rec := b.do(tc.method, tc.target, form)
			checkProblem(t, rec, tc.target, http.StatusForbidden, "admin-api-disabled")
			if c := sessionCookieOf(rec); c != nil {
				t.Errorf("a disabled console set a session cookie %v", c)
			}
		})
	}
}

func TestConsoleLogin(t *testing.T) {
	tests := []struct {
		name            string
		token, operator string
		tls             bool
		wantStatus      int
		wantError       string // in div#error
	}{
		{name: "right token", token: testToken, operator: "alice", wantStatus: http.StatusSeeOther},
		{name: "right token over TLS", token: testToken, operator: "alice", tls: true, wantStatus: http.StatusSeeOther},
		{name: "wrong token", token: "wrong", operator: "alice", wantStatus: http.StatusUnauthorized, wantError: "wrong token"},
		{name: "no token", token: "", operator: "alice", wantStatus: http.StatusUnauthorized, wantError: "wrong token"},
		{name: "the token with a suffix", token: testToken + "x", operator: "alice", wantStatus: http.StatusUnauthorized, wantError: "wrong token"},
		{name: "no operator", token: testToken, operator: "  ", wantStatus: http.StatusBadRequest, wantError: "your name is required"},
		{name: "an operator with a control character", token: testToken, operator: "al\x1bice", wantStatus: http.StatusBadRequest, wantError: "control character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newConsoleEnv(t, nil)
			b := &browser{e: e, remote: "192.0.2.20:1234", tls: tc.tls}
			rec := b.do(http.MethodPost, "/ui/login", url.Values{"token": {tc.token}, "operator": {tc.operator}})
			if rec.Code != tc.wantStatus {
				t.Fatalf("POST /ui/login = %d, want %d; body %s", rec.Code, tc.wantStatus, rec.Body)
			}
			page := rec.Body.String()
			if strings.Contains(page, testToken) || strings.Contains(rec.Header().Get("Location"), testToken) {
				t.Errorf("the answer holds the token:\n%s", page)
			}
			c := sessionCookieOf(rec)
			if tc.wantStatus != http.StatusSeeOther {
				if c != nil {
					t.Errorf("a refused login set a session cookie %v", c)
				}
				if msg, ok := element(page, "div", "error"); !ok || !strings.Contains(msg, tc.wantError) {
					t.Errorf("div#error = %q (found %v), want it to say %q", msg, ok, tc.wantError)
				}
				if _, ok := element(page, "form", "login"); !ok {
					t.Errorf("a refused login does not show form#login again")
				}
				wantFailures := 0.0
				if tc.wantStatus == http.StatusUnauthorized {
					wantFailures = 1
				}
				if got := counter(t, e.reg, "idemproxy_admin_auth_failures_total"); got != wantFailures {
					t.Errorf("idemproxy_admin_auth_failures_total = %v, want %v", got, wantFailures)
				}
				return
			}
			if c == nil {
				t.Fatalf("no session cookie: %v", rec.Header()["Set-Cookie"])
			}
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(c.Value) {
				t.Errorf("session ID %q, want 32 random bytes in hex", c.Value)
			}
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui/" || c.Secure != tc.tls {
				t.Errorf("cookie HttpOnly %v, SameSite %v, Path %q, Secure %v; want true, Strict, /ui/, %v", c.HttpOnly, c.SameSite, c.Path, c.Secure, tc.tls)
			}
			b.session = c.Value
			over := b.do(http.MethodGet, "/ui/", nil)
			if over.Code != http.StatusOK {
				t.Fatalf("GET /ui/ with the session = %d; body %s", over.Code, over.Body)
			}
			if !strings.Contains(over.Body.String(), "operator: "+tc.operator) {
				t.Errorf("the overview does not name the operator %q", tc.operator)
			}
			if _, ok := element(over.Body.String(), "form", "logout"); !ok {
				t.Errorf("the overview has no form#logout")
			}

			// Logging out ends the session, on the server: the cookie no
			// longer opens a page.
			out := b.do(http.MethodPost, "/ui/logout", url.Values{"csrf": {field(t, over.Body.String(), "csrf")}})
			if out.Code != http.StatusSeeOther || out.Header().Get("Location") != "/ui/login" {
				t.Fatalf("logout = %d %q, want 303 to /ui/login", out.Code, out.Header().Get("Location"))
			}
			if c := sessionCookieOf(out); c == nil || c.MaxAge >= 0 {
				t.Errorf("logout cookie %v, want it removed", c)
			}
			if again := b.do(http.MethodGet, "/ui/", nil); again.Code != http.StatusSeeOther || again.Header().Get("Location") != "/ui/login" {
				t.Errorf("GET /ui/ after logout = %d %q, want 303 to /ui/login", again.Code, again.Header().Get("Location"))
			}
		})
	}
}

// TestConsoleLoginThrottlingIsTheAPIs: the console's login and the key
// API share one limiter of failed authentications per address: failures
// on either get the other refused 429 too, a correct token included.
func TestConsoleLoginThrottlingIsTheAPIs(t *testing.T) {
	loginFail := func(b *browser) int {
		return b.do(http.MethodPost, "/ui/login", url.Values{"token": {"wrong"}, "operator": {"mallory"}}).Code
	}
	apiFail := func(b *browser) int {
		return serveFrom(b.e.h, b.remote, http.MethodGet, "/v1/keys/charges/k", "Bearer wrong").Code
	}
	tests := []struct {
		name string
		fail func(*browser) int
	}{
		{"failed logins", loginFail},
		{"failed API requests", apiFail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newConsoleEnv(t, nil)
			b := &browser{e: e, remote: "203.0.113.9:5555"}
			for i := range 5 {
				if got := tc.fail(b); got != http.StatusUnauthorized {
					t.Fatalf("failure %d = %d, want 401", i+1, got)
				}
			}
			login := b.do(http.MethodPost, "/ui/login", url.Values{"token": {testToken}, "operator": {"alice"}})
			if login.Code != http.StatusTooManyRequests || login.Header().Get("Retry-After") == "" || sessionCookieOf(login) != nil {
				t.Errorf("login with the right token after 5 failures = %d, Retry-After %q, cookie %v; want 429, a Retry-After, no cookie",
					login.Code, login.Header().Get("Retry-After"), sessionCookieOf(login))
			}
			if msg, _ := element(login.Body.String(), "div", "error"); !strings.Contains(msg, "too many failed authentications") {
				t.Errorf("div#error = %q, want it to say too many failed authentications", msg)
			}
			if got := serveFrom(e.h, b.remote, http.MethodGet, "/v1/keys/charges/k", bearer).Code; got != http.StatusTooManyRequests {
				t.Errorf("API with the right token after 5 failures = %d, want 429", got)
			}
			if got := counter(t, e.reg, "idemproxy_admin_auth_failures_total"); got != 5 {
				t.Errorf("idemproxy_admin_auth_failures_total = %v, want 5", got)
			}
			if got := counter(t, e.reg, "idemproxy_admin_auth_throttled_total"); got != 2 {
				t.Errorf("idemproxy_admin_auth_throttled_total = %v, want 2", got)
			}
			// Another address logs in.
			other := &browser{e: e, remote: "198.51.100.1:1"}
			if got := other.do(http.MethodPost, "/ui/login", url.Values{"token": {testToken}, "operator": {"alice"}}).Code; got != http.StatusSeeOther {
				t.Errorf("login from another address = %d, want 303", got)
			}
		})
	}
}
