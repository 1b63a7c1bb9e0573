package admin_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// The tests of a hostile review of the console (issue 30): each pins an
// attack, held or fixed.

// evil is a value that would run script or break out of an attribute if
// it were ever written into a page unescaped.
const evil = `"'><script>alert(1)</script><img src=x onerror=alert(2)>`

// holdsRawMarkup reports the first piece of evil found unescaped in page.
func holdsRawMarkup(page string) string {
	for _, bad := range []string{"<script", "<img", `"'>`} {
		if strings.Contains(page, bad) {
			return bad
		}
	}
	return ""
}

// reconcileSays is a Reconciler whose every lookup ends in error, saying
// msg (as the upstream's answer or a transport error would).
type reconcileSays struct{ msg string }

func (r reconcileSays) Reconcile(context.Context, string) (reconcile.Outcome, error) {
	return reconcile.Outcome{Result: reconcile.ResultError, LookupStatus: 500, Error: r.msg}, nil
}

// TestConsoleEscapesEveryField: everything a page shows that comes from a
// client, the upstream, the store or the request's query is text:
// stored header and trailer names and values, the fingerprint, the
// reconcile lookup's error, the filters and cursor of the list, a route
// named in an error.
func TestConsoleEscapesEveryField(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileSays{evil} })
	ctx := context.Background()
	sk := store.Key("charges", "", "fields")
	if rec, err := e.st.Reserve(ctx, sk, store.Reservation{Token: "tok" + evil, Fingerprint: "fp" + evil, Lease: lease, TTL: ttl}); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v", rec, err)
	}
	if err := e.st.Commit(ctx, sk, "tok"+evil, store.Response{Status: 200,
		Header:  http.Header{"X-A" + evil: {evil}},
		Trailer: http.Header{"X-T" + evil: {evil}},
		Body:    []byte(evil), BodyStored: true}, ttl); err != nil {
		t.Fatal(err)
	}
	doubt := store.Key("charges", "", "fields-doubt")
	seed(t, e.st, doubt, seedInDoubt)
	b := e.login("alice")
	doubtPage := b.keyPage("fields-doubt")
	q := url.QueryEscape(evil)
	pages := map[string]*http.Response{
		"key page":           b.do(http.MethodGet, "/ui/keys/charges/fields", nil).Result(),
		"reconcile error":    b.do(http.MethodPost, "/ui/reconcile", actForm(t, doubtPage, "INC-1")).Result(),
		"list filters":       b.do(http.MethodGet, "/ui/keys?route=charges&min_age="+q+"&key_hash="+q+"&cursor="+q, nil).Result(),
		"list cursor":        b.do(http.MethodGet, "/ui/keys?route=charges&cursor="+q, nil).Result(),
		"list unknown route": b.do(http.MethodGet, "/ui/keys?route="+q, nil).Result(),
		"key of no route":    b.do(http.MethodGet, "/ui/keys/"+url.PathEscape(evil)+"/k", nil).Result(),
		"bad scope hash":     b.do(http.MethodGet, "/ui/keys/refunds/k?scope_hash="+q, nil).Result(),
		"bulk back link":     b.do(http.MethodPost, "/ui/bulk-release", url.Values{"csrf": {field(t, doubtPage, "csrf")}, "route": {evil}, "min_age": {evil}, "cursor": {evil}}).Result(),
		"act on no route":    b.do(http.MethodPost, "/ui/release", url.Values{"csrf": {field(t, doubtPage, "csrf")}, "route": {evil}, "key": {evil}, "version": {"v"}, "reason": {"r"}}).Result(),
		"no such page":       b.do(http.MethodGet, "/ui/"+url.PathEscape(evil), nil).Result(),
		"failed login":       (&browser{e: e, remote: "192.0.2.66:1"}).do(http.MethodPost, "/ui/login", url.Values{"token": {"x"}, "operator": {evil}}).Result(),
	}
	bodies := map[string]string{}
	for name, resp := range pages {
		raw, _ := io.ReadAll(resp.Body)
		body := string(raw)
		if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("%s: Content-Type %q, want the console's HTML", name, ct)
		}
		if bad := holdsRawMarkup(body); bad != "" {
			t.Errorf("%s (status %d) holds %q unescaped:\n%s", name, resp.StatusCode, bad, body)
		}
		bodies[name] = body
	}
	// And each is shown, as text.
	for _, tc := range []struct{ page, tag, id, want string }{
		{"key page", "pre", "stored-headers", "X-A" + evil + ": " + evil + "\n"},
		{"key page", "pre", "stored-trailers", "X-T" + evil + ": " + evil + "\n"},
		{"key page", "pre", "stored-body", evil},
		{"key page", "dd", "fingerprint", "<code>fp" + evil + "</code>"},
		{"key page", "dd", "token", "<code>tok" + evil + "</code>"},
		{"reconcile error", "div", "result", "error: " + evil},
	} {
		if got, _ := element(bodies[tc.page], tc.tag, tc.id); !strings.Contains(html.UnescapeString(got), tc.want) {
			t.Errorf("%s: %s#%s = %q, want it to show %q", tc.page, tc.tag, tc.id, got, tc.want)
		}
	}
}

// TestConsoleLoginIsProtected: a login form posted from another site is
// refused (a victim logged into the attacker's session), a session ID the
// browser brought before the login is never the one it gets, and an
// unknown session cookie opens nothing and creates no session.
func TestConsoleLoginIsProtected(t *testing.T) {
	e := newConsoleEnv(t, nil)
	anon := &browser{e: e, remote: "192.0.2.30:1"}
	form := url.Values{"token": {testToken}, "operator": {"mallory"}}
	for _, h := range []http.Header{
		{"Sec-Fetch-Site": {"cross-site"}},
		{"Sec-Fetch-Site": {"same-site"}}, // another port of this host
		{"Origin": {"http://attacker.example"}},
	} {
		if rec := anon.doHeader(http.MethodPost, "/ui/login", form, h); rec.Code != http.StatusForbidden || sessionCookieOf(rec) != nil {
			t.Errorf("login with %v = %d, cookie %v; want 403 and none", h, rec.Code, sessionCookieOf(rec))
		}
	}
	planted := strings.Repeat("ab", 32)
	fixed := &browser{e: e, remote: "192.0.2.31:1", session: planted}
	if rec := fixed.do(http.MethodGet, "/ui/", nil); rec.Code != http.StatusSeeOther {
		t.Errorf("GET /ui/ with an unknown session ID = %d, want 303 to the login", rec.Code)
	}
	rec := fixed.do(http.MethodPost, "/ui/login", form)
	c := sessionCookieOf(rec)
	if rec.Code != http.StatusSeeOther || c == nil || c.Value == planted {
		t.Fatalf("login with a planted cookie = %d, cookie %v; want 303 and a new ID", rec.Code, c)
	}
	fixed.session = planted
	if rec := fixed.do(http.MethodGet, "/ui/", nil); rec.Code != http.StatusSeeOther {
		t.Errorf("the planted ID after the login opens /ui/: %d, want 303 to the login", rec.Code)
	}
}

// TestConsoleBulkReleaseRevalidatesTheSelection: the selected keys are
// posted by the browser: each is placed again (the route exists, the
// scope is the route's), must name a version, and a key in flight is
// never released by a bulk release; a refused selection releases nothing.
func TestConsoleBulkReleaseRevalidatesTheSelection(t *testing.T) {
	e := newConsoleEnv(t, nil)
	doubt, flying := store.Key("charges", "", "sel-doubt"), store.Key("charges", "", "sel-flying")
	seed(t, e.st, doubt, seedInDoubt)
	seed(t, e.st, flying, seedInFlight)
	b := e.login("alice")
	csrf := field(t, b.keyPage("sel-doubt"), "csrf")
	good := url.Values{"s": {"-"}, "k": {"sel-doubt"}, "v": {admin.Version(e.record(doubt))}}.Encode()
	tests := []struct {
		name  string
		route string
		sel   []string
		want  string
	}{
		{"an unknown route", "nowhere", []string{good}, "no route named"},
		{"a scope hash on an unscoped route", "charges", []string{good, url.Values{"s": {strings.Repeat("0", 32)}, "k": {"sel-doubt"}, "v": {"x"}}.Encode()}, "is not scoped"},
		{"no scope hash on a scoped route", "refunds", []string{good}, "is scoped"},
		{"no version", "charges", []string{good, url.Values{"s": {"-"}, "k": {"sel-flying"}}.Encode()}, "which version"},
		{"not a selection", "charges", []string{good, "%zz"}, "not one this console listed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.do(http.MethodPost, "/ui/bulk-release", url.Values{"csrf": {csrf}, "route": {tc.route}, "sel": tc.sel,
				"reason": {"INC-2"}, "confirm": {"release " + string(rune('0'+len(tc.sel))) + " keys"}})
			class, text := result(rec.Body.String())
			if rec.Code < 400 || class != "error" || !strings.Contains(text, tc.want) || !strings.Contains(text, "nothing was done") {
				t.Errorf("%d, div#result %s %q; want a refusal saying %q, nothing was done", rec.Code, class, text, tc.want)
			}
			if e.record(doubt) == nil || e.record(flying) == nil {
				t.Fatalf("a refused bulk release released a key")
			}
		})
	}
	sel := url.Values{"s": {"-"}, "k": {"sel-flying"}, "v": {admin.Version(e.record(flying))}}.Encode()
	rec := b.do(http.MethodPost, "/ui/bulk-release", url.Values{"csrf": {csrf}, "route": {"charges"}, "sel": {sel}, "reason": {"INC-2"}, "confirm": {"release 1 key"}, "force": {"true"}})
	if class, text := result(rec.Body.String()); class != "error" || !strings.Contains(text, "released 0 of 1") || e.record(flying) == nil {
		t.Errorf("bulk release of a key in flight: div#result %s %q, record %v; want it refused and kept", class, text, e.record(flying))
	}
}

// TestConsoleReasonIsBounded: an act's reason, written to the audit log
// once per key (a bulk release of 1,000 keys writes it 1,000 times), is
// at most 1,000 bytes, of printable characters, with no bidirectional
// control that would show an audit line other than it is; the operator's
// name neither.
func TestConsoleReasonIsBounded(t *testing.T) {
	tests := []struct {
		name, reason, want string
	}{
		{"1,001 bytes", strings.Repeat("r", 1001), "longer than 1,000 bytes"},
		{"a new line", "INC-1\nlevel=INFO msg=\"nothing happened\"", "control character"},
		{"a right-to-left override", "INC-1 \u202eok", "control character"},
		{"not UTF-8", "INC-1 caf\xe9", "not UTF-8 text"},
	}
	for _, target := range []string{"/ui/release", "/ui/reconcile", "/ui/bulk-release"} {
		for _, tc := range tests {
			t.Run(target+" "+tc.name, func(t *testing.T) {
				e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
				sk := store.Key("charges", "", "reason-key")
				seed(t, e.st, sk, seedInDoubt)
				b := e.login("alice")
				form := actForm(t, b.keyPage("reason-key"), tc.reason)
				if target == "/ui/bulk-release" {
					list := b.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String()
					form = url.Values{"csrf": {field(t, list, "csrf")}, "route": {"charges"}, "sel": fields(list, "sel"), "reason": {tc.reason}, "confirm": {"release 1 key"}}
				}
				rec := b.do(http.MethodPost, target, form)
				class, text := result(rec.Body.String())
				if rec.Code != http.StatusBadRequest || class != "error" || !strings.Contains(text, tc.want) || !strings.Contains(text, "nothing was done") {
					t.Errorf("%d, div#result %s %q; want 400, error, %q, nothing was done", rec.Code, class, text, tc.want)
				}
				if r := e.record(sk); r == nil || r.State != store.StateInDoubt {
					t.Errorf("after a refused act the record is %+v, want it in doubt", r)
				}
				if lines := e.auditLines(); len(lines) != 0 {
					t.Errorf("audit lines of a refused act: %v", lines)
				}
			})
		}
	}
	t.Run("1,000 bytes", func(t *testing.T) {
		e := newConsoleEnv(t, nil)
		seed(t, e.st, store.Key("charges", "", "reason-key"), seedInDoubt)
		b := e.login("alice")
		reason := strings.Repeat("é", 500)
		if rec := b.do(http.MethodPost, "/ui/release", actForm(t, b.keyPage("reason-key"), reason)); rec.Code != http.StatusOK {
			t.Errorf("release with a reason of 1,000 bytes = %d, want 200", rec.Code)
		}
		if lines := e.auditLines(); len(lines) != 1 || lines[0]["reason"] != reason {
			t.Errorf("audit lines %v, want one with the reason", lines)
		}
	})
	t.Run("an operator with a right-to-left override", func(t *testing.T) {
		e := newConsoleEnv(t, nil)
		rec := (&browser{e: e, remote: "192.0.2.41:1"}).do(http.MethodPost, "/ui/login", url.Values{"token": {testToken}, "operator": {"eve\u202eecila"}})
		if msg, _ := element(rec.Body.String(), "div", "error"); rec.Code != http.StatusBadRequest || !strings.Contains(msg, "control character") || sessionCookieOf(rec) != nil {
			t.Errorf("login = %d, div#error %q, cookie %v; want 400, control character, none", rec.Code, msg, sessionCookieOf(rec))
		}
	})
}

// TestConsoleDotKeysAreReachable: a key "." or ".." (printable, so a
// valid key) is linked from the list to its own page: a browser removes
// dot segments from a path, so its link must not hold it as one.
func TestConsoleDotKeysAreReachable(t *testing.T) {
	e := newConsoleEnv(t, nil)
	for _, k := range []string{".", "..", "...", "a/..", "../a"} {
		seed(t, e.st, store.Key("charges", "", k), seedInDoubt)
	}
	seed(t, e.st, store.Key("refunds", "tenant-1", ".."), seedInDoubt)
	b := e.login("alice")
	for _, route := range []string{"charges", "refunds"} {
		list := b.do(http.MethodGet, "/ui/keys?route="+route, nil).Body.String()
		links := regexp.MustCompile(`<a class="key-link" href="([^"]+)">([^<]*)</a>`).FindAllStringSubmatch(list, -1)
		if len(links) == 0 {
			t.Fatalf("no key link in the list of %s:\n%s", route, list)
		}
		base, _ := url.Parse("http://admin.example/ui/keys?route=" + route)
		for _, l := range links {
			key := html.UnescapeString(l[2])
			ref, err := url.Parse(html.UnescapeString(l[1]))
			if err != nil {
				t.Fatalf("link %q: %v", l[1], err)
			}
			// As a browser follows it: dot segments removed.
			u := base.ResolveReference(ref)
			rec := b.do(http.MethodGet, u.RequestURI(), nil)
			where, _ := element(rec.Body.String(), "p", "")
			m := regexp.MustCompile(`key <code>([^<]*)</code>`).FindStringSubmatch(rec.Body.String())
			if rec.Code != http.StatusOK || m == nil || html.UnescapeString(m[1]) != key {
				t.Errorf("%s key %q: link %s followed to %s = %d, page of key %v; want 200, the key's page %s", route, key, l[1], u.RequestURI(), rec.Code, m, where)
			}
		}
	}
}

// TestConsoleHeadersOnRedirects: the redirects the admin listener's
// router answers for a console path it cleans (/ui, a doubled slash, a dot
// segment) carry the console's headers, as every console answer does.
func TestConsoleHeadersOnRedirects(t *testing.T) {
	e := newConsoleEnv(t, nil)
	b := e.login("alice")
	anon := &browser{e: e, remote: "192.0.2.40:1"}
	for _, target := range []string{"/ui", "/ui//keys", "/ui/keys/../", "/ui/./", "/ui/keys/charges/.."} {
		for who, br := range map[string]*browser{"logged in": b, "anonymous": anon} {
			rec := br.do(http.MethodGet, target, nil)
			if rec.Code < 300 || rec.Code > 399 {
				t.Fatalf("%s GET %s = %d, want a redirect", who, target, rec.Code)
			}
			for k, v := range map[string]string{"Content-Security-Policy": wantCSP, "X-Frame-Options": "DENY",
				"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s GET %s (%d to %s): %s = %q, want %q", who, target, rec.Code, rec.Header().Get("Location"), k, got, v)
				}
			}
		}
	}
}

// TestConsoleNothingWithoutASession: no console path, however spelled
// (doubled slashes, dot segments, escaped slashes, another method), shows
// a key or acts without a session; only the style sheet is served.
func TestConsoleNothingWithoutASession(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	sk := store.Key("charges", "", "secret-order-4711")
	seed(t, e.st, sk, seedInDoubt)
	before := admin.Version(e.record(sk))
	anon := &browser{e: e, remote: "192.0.2.50:1"}
	act := url.Values{"route": {"charges"}, "key": {"secret-order-4711"}, "scope_hash": {"-"}, "version": {before}, "reason": {"r"},
		"sel": {url.Values{"s": {"-"}, "k": {"secret-order-4711"}, "v": {before}}.Encode()}, "confirm": {"release 1 key"}}
	for _, tc := range []struct{ method, target string }{
		{http.MethodGet, "/ui/"},
		{http.MethodGet, "/ui//"},
		{http.MethodGet, "/ui/keys?route=charges"},
		{http.MethodGet, "/ui//keys?route=charges"},
		{http.MethodGet, "/ui/./keys?route=charges"},
		{http.MethodGet, "/ui/static/../keys?route=charges"},
		{http.MethodGet, "/ui/keys/charges/secret-order-4711"},
		{http.MethodGet, "/ui/keys%2Fcharges%2Fsecret-order-4711"},
		{http.MethodGet, "/ui/keys/charges/x%2F..%2Fsecret-order-4711"},
		{http.MethodGet, "/ui/static/..%2Fkeys?route=charges"},
		{http.MethodGet, "/ui/static/%2e%2e/keys?route=charges"},
		{http.MethodHead, "/ui/keys/charges/secret-order-4711"},
		{http.MethodPost, "/ui/release"},
		{http.MethodPost, "/ui//release"},
		{http.MethodPost, "/ui/reconcile"},
		{http.MethodPost, "/ui/bulk-release"},
		{http.MethodPost, "/ui/static/../release"},
		{http.MethodPut, "/ui/release"},
		{http.MethodDelete, "/ui/keys/charges/secret-order-4711"},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			var form url.Values
			if tc.method != http.MethodGet && tc.method != http.MethodHead {
				form = act
			}
			rec := anon.do(tc.method, tc.target, form)
			if rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "secret-order-4711") {
				t.Errorf("%s %s without a session = %d, body %s; want no page and no key", tc.method, tc.target, rec.Code, rec.Body)
			}
			if r := e.record(sk); r == nil || admin.Version(r) != before {
				t.Fatalf("after %s %s without a session the record is %+v, want it unchanged", tc.method, tc.target, r)
			}
		})
	}
	if lines := e.auditLines(); len(lines) != 0 {
		t.Errorf("audit lines without a session: %v", lines)
	}
}

// TestConsoleLoginReturnsToThePage: a page asked for without a session
// (the alert's link to a route's keys in doubt) leads through the login
// back to itself; a next that is not a console page (another host, a
// scheme, "//host", a backslash) sends the operator to the overview, never
// elsewhere.
func TestConsoleLoginReturnsToThePage(t *testing.T) {
	e := newConsoleEnv(t, nil)
	anon := &browser{e: e, remote: "192.0.2.30:40000"}
	rec := anon.do(http.MethodGet, "/ui/keys?route=charges", nil)
	if got, want := rec.Header().Get("Location"), "/ui/login?next="+url.QueryEscape("/ui/keys?route=charges"); rec.Code != http.StatusSeeOther || got != want {
		t.Fatalf("GET /ui/keys?route=charges without a session = %d %q, want 303 %q", rec.Code, got, want)
	}
	page := anon.do(http.MethodGet, rec.Header().Get("Location"), nil).Body.String()
	if got := field(t, page, "next"); got != "/ui/keys?route=charges" {
		t.Fatalf("login form's next = %q, want the page asked for", got)
	}
	for _, tc := range []struct{ next, want string }{
		{"/ui/keys?route=charges", "/ui/keys?route=charges"},
		{"https://evil.example/ui/", "/ui/"},
		{"//evil.example/ui/", "/ui/"},
		{"/\\evil.example/ui/", "/ui/"},
		{"/ui/\\..\\x", "/ui/"},
		{"/v1/keys/charges", "/ui/"},
		// A dot segment leaves /ui/ once the redirect, or the browser,
		// removes it, escaped or not.
		{"/ui/../v1/keys/charges", "/ui/"},
		{"/ui/%2e%2e/v1/keys/charges", "/ui/"},
		{"/ui/.%2E/metrics", "/ui/"},
		{"/ui/keys/charges/a%2F..%2Fb", "/ui/keys/charges/a%2F..%2Fb"},
		{"javascript:alert(1)//ui/", "/ui/"},
		{"", "/ui/"},
	} {
		b := &browser{e: e, remote: "192.0.2.31:40000"}
		rec := b.do(http.MethodPost, "/ui/login", url.Values{"token": {testToken}, "operator": {"gina"}, "next": {tc.next}})
		if got := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || got != tc.want {
			t.Errorf("login with next %q = %d %q, want 303 %q", tc.next, rec.Code, got, tc.want)
		}
	}
}
