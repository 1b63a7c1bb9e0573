package admin_test

import (
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
)

// keyPage loads the key page of an unscoped key of charges.
func (b *browser) keyPage(key string) string {
	b.e.t.Helper()
	rec := b.do(http.MethodGet, "/ui/keys/charges/"+url.PathEscape(key), nil)
	if rec.Code != http.StatusOK {
		b.e.t.Fatalf("key page of %q = %d; body %s", key, rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// actForm is the form of an act on key as the key page holds it.
func actForm(t *testing.T, page, reason string) url.Values {
	t.Helper()
	return url.Values{"csrf": {field(t, page, "csrf")}, "route": {field(t, page, "route")}, "key": {field(t, page, "key")},
		"scope_hash": {field(t, page, "scope_hash")}, "version": {field(t, page, "version")}, "reason": {reason}}
}

// TestConsoleHeaders: every console answer has the security headers, and
// every page no-store; no page holds a script or an inline style.
func TestConsoleHeaders(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	seed(t, e.st, store.Key("charges", "", "hdr-doubt"), seedInDoubt)
	seed(t, e.st, store.Key("charges", "", "hdr-done"), seedCompleted)
	b := e.login("alice")
	page := b.keyPage("hdr-doubt")
	anon := &browser{e: e, remote: "192.0.2.99:1"}
	tests := []struct {
		name  string
		do    func() *http.Response
		cache string
	}{
		{"login page", func() *http.Response { return anon.do(http.MethodGet, "/ui/login", nil).Result() }, "no-store"},
		{"failed login", func() *http.Response {
			return anon.do(http.MethodPost, "/ui/login", url.Values{"token": {"x"}, "operator": {"a"}}).Result()
		}, "no-store"},
		{"redirect to login", func() *http.Response { return anon.do(http.MethodGet, "/ui/", nil).Result() }, "no-store"},
		{"overview", func() *http.Response { return b.do(http.MethodGet, "/ui/", nil).Result() }, "no-store"},
		{"in-doubt list", func() *http.Response { return b.do(http.MethodGet, "/ui/keys?route=charges", nil).Result() }, "no-store"},
		{"key page", func() *http.Response { return b.do(http.MethodGet, "/ui/keys/charges/hdr-done", nil).Result() }, "no-store"},
		{"no such page", func() *http.Response { return b.do(http.MethodGet, "/ui/nowhere", nil).Result() }, "no-store"},
		{"CSRF refused", func() *http.Response {
			return b.do(http.MethodPost, "/ui/release", url.Values{"csrf": {"bad"}}).Result()
		}, "no-store"},
		{"reconcile", func() *http.Response {
			return b.do(http.MethodPost, "/ui/reconcile", actForm(t, page, "INC-1")).Result()
		}, "no-store"},
		{"style sheet", func() *http.Response { return b.do(http.MethodGet, "/ui/static/console.css", nil).Result() }, "public, max-age=3600"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := tc.do()
			want := map[string]string{
				"Content-Security-Policy": wantCSP,
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"Cache-Control":           tc.cache,
			}
			for k, v := range want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q (status %d)", k, got, v, resp.StatusCode)
				}
			}
			raw, _ := io.ReadAll(resp.Body)
			body := string(raw)
			for _, bad := range []string{"<script", "style=", "javascript:", testToken} {
				if strings.Contains(body, bad) {
					t.Errorf("the answer holds %q", bad)
				}
			}
		})
	}
}

// TestConsoleCSRF: a POST without the session's CSRF token (missing,
// wrong, another session's) is refused 403 with a page saying so, and
// nothing is done.
func TestConsoleCSRF(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	sk := store.Key("charges", "", "csrf-key")
	seed(t, e.st, sk, seedInDoubt)
	before := admin.Version(e.record(sk))
	alice, bob := e.login("alice"), e.login("bob")
	page := alice.keyPage("csrf-key")
	bobsCSRF := field(t, bob.keyPage("csrf-key"), "csrf")
	if bobsCSRF == field(t, page, "csrf") {
		t.Fatalf("two sessions share the CSRF token %s", bobsCSRF)
	}
	list := alice.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String()
	sel := fields(list, "sel")
	if len(sel) != 1 {
		t.Fatalf("the in-doubt list selects %d keys, want 1:\n%s", len(sel), list)
	}
	forms := map[string]url.Values{
		"/ui/release":      actForm(t, page, "INC-7"),
		"/ui/reconcile":    actForm(t, page, "INC-7"),
		"/ui/bulk-release": {"route": {"charges"}, "sel": sel, "reason": {"INC-7"}, "confirm": {"release 1 keys"}},
		"/ui/logout":       {},
	}
	for target, form := range forms {
		for _, tc := range []struct {
			name string
			csrf []string
		}{
			{"missing", nil},
			{"empty", []string{""}},
			{"wrong", []string{strings.Repeat("0", 64)}},
			{"another session's", []string{bobsCSRF}},
		} {
			t.Run(target+" "+tc.name, func(t *testing.T) {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				f["csrf"] = tc.csrf
				rec := alice.do(http.MethodPost, target, f)
				if rec.Code != http.StatusForbidden {
					t.Errorf("POST %s = %d, want 403; body %s", target, rec.Code, rec.Body)
				}
				if msg, ok := element(rec.Body.String(), "div", "error"); !ok || !strings.Contains(msg, "CSRF") || !strings.Contains(msg, "nothing was done") {
					t.Errorf("div#error = %q, want it to name the CSRF token and say nothing was done", msg)
				}
				rec2 := e.record(sk)
				if rec2 == nil || admin.Version(rec2) != before {
					t.Errorf("after a refused POST %s the record is %+v, want it unchanged", target, rec2)
				}
				if got := alice.do(http.MethodGet, "/ui/", nil).Code; got != http.StatusOK {
					t.Errorf("the session after a refused POST %s: GET /ui/ = %d, want 200", target, got)
				}
			})
		}
	}
	if lines := e.auditLines(); len(lines) != 0 {
		t.Errorf("audit lines after refused POSTs: %v", lines)
	}

	// Without a session, an act is refused too.
	anon := &browser{e: e, remote: "192.0.2.50:1"}
	if rec := anon.do(http.MethodPost, "/ui/release", actForm(t, page, "INC-7")); rec.Code != http.StatusForbidden {
		t.Errorf("release without a session = %d, want 403", rec.Code)
	}
	// A POST from another site is refused before anything is read.
	req := actForm(t, page, "INC-7")
	rec := alice.doHeader(http.MethodPost, "/ui/release", req, http.Header{"Sec-Fetch-Site": {"cross-site"}})
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "cross-origin") {
		t.Errorf("cross-site release = %d %s, want 403 cross-origin", rec.Code, rec.Body)
	}
	if r := e.record(sk); r == nil || admin.Version(r) != before {
		t.Errorf("after refused POSTs the record is %+v, want it unchanged", r)
	}
}

// TestConsoleActRefusals: an act without a reason, or on a key that
// changed since its page was loaded, is refused with nothing done.
func TestConsoleActRefusals(t *testing.T) {
	for _, target := range []string{"/ui/release", "/ui/reconcile"} {
		t.Run(target, func(t *testing.T) {
			e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
			sk := store.Key("charges", "", "refuse-key")
			seed(t, e.st, sk, seedInDoubt)
			b := e.login("alice")
			page := b.keyPage("refuse-key")

			for _, reason := range []string{"", "   "} {
				rec := b.do(http.MethodPost, target, actForm(t, page, reason))
				class, text := result(rec.Body.String())
				if rec.Code != http.StatusBadRequest || class != "error" || !strings.Contains(text, "a reason is required") {
					t.Errorf("reason %q: %d, div#result %s %q; want 400, error, a reason is required", reason, rec.Code, class, text)
				}
			}
			noVersion := actForm(t, page, "INC-1")
			noVersion.Del("version")
			if rec := b.do(http.MethodPost, target, noVersion); rec.Code != http.StatusBadRequest {
				t.Errorf("without a version: %d, want 400", rec.Code)
			}

			// The key changes: released and reserved again by a retry.
			if err := e.st.Release(t.Context(), sk, ownerToken); err != nil {
				t.Fatal(err)
			}
			res := store.Reservation{Token: "retry-token", Fingerprint: "fp-again", Lease: lease, TTL: ttl}
			if r, err := e.st.Reserve(t.Context(), sk, res); err != nil || r != nil {
				t.Fatalf("Reserve again = %v, %v", r, err)
			}
			if err := e.st.MarkInDoubt(t.Context(), sk, res.Token, ttl); err != nil {
				t.Fatal(err)
			}
			now := admin.Version(e.record(sk))
			rec := b.do(http.MethodPost, target, actForm(t, page, "INC-1"))
			class, text := result(rec.Body.String())
			if rec.Code != http.StatusPreconditionFailed || class != "error" || !strings.Contains(text, "this key changed since you loaded the page: look again") {
				t.Errorf("stale version: %d, div#result %s %q; want 412, error, this key changed since you loaded the page", rec.Code, class, text)
			}
			if r := e.record(sk); r == nil || admin.Version(r) != now {
				t.Errorf("after refused acts the record is %+v, want the new reservation unchanged", r)
			}
			if lines := e.auditLines(); len(lines) != 0 {
				t.Errorf("audit lines of refused acts: %v", lines)
			}
			// The page shown with the refusal is the key as it is now:
			// acting from it works.
			fresh := rec.Body.String()
			if got := field(t, fresh, "version"); got != now {
				t.Errorf("the refusal's page shows version %s, want the record's %s", got, now)
			}
			ok := b.do(http.MethodPost, target, actForm(t, fresh, "INC-1"))
			if class, text := result(ok.Body.String()); ok.Code != http.StatusOK || class != "ok" {
				t.Errorf("act from the fresh page: %d, div#result %s %q; want 200 ok", ok.Code, class, text)
			}
		})
	}
}

// TestConsoleReleaseInFlight: the force checkbox is shown only for a key
// in flight, and a release of one without it is refused.
func TestConsoleReleaseInFlight(t *testing.T) {
	e := newConsoleEnv(t, nil)
	seed(t, e.st, store.Key("charges", "", "flying"), seedInFlight)
	seed(t, e.st, store.Key("charges", "", "doubt"), seedInDoubt)
	b := e.login("alice")
	if page := b.keyPage("doubt"); strings.Contains(page, `name="force"`) {
		t.Errorf("the page of a key in doubt offers force")
	}
	page := b.keyPage("flying")
	if !strings.Contains(page, `name="force"`) {
		t.Fatalf("the page of a key in flight does not offer force:\n%s", page)
	}
	if _, ok := element(page, "form", "reconcile"); ok {
		t.Errorf("the page of a key in flight offers reconcile (no reconciler, and not in doubt)")
	}
	rec := b.do(http.MethodPost, "/ui/release", actForm(t, page, "stuck"))
	if class, text := result(rec.Body.String()); rec.Code != http.StatusConflict || class != "error" || !strings.Contains(text, "in flight") {
		t.Errorf("release in flight without force: %d, div#result %s %q; want 409, error, in flight", rec.Code, class, text)
	}
	if e.record(store.Key("charges", "", "flying")) == nil {
		t.Fatal("the key in flight was released without force")
	}
	f := actForm(t, page, "stuck")
	f.Set("force", "true")
	rec = b.do(http.MethodPost, "/ui/release", f)
	if class, text := result(rec.Body.String()); rec.Code != http.StatusOK || class != "ok" || !strings.Contains(text, "was in_flight") {
		t.Errorf("release in flight with force: %d, div#result %s %q; want 200, ok", rec.Code, class, text)
	}
	if r := e.record(store.Key("charges", "", "flying")); r != nil {
		t.Errorf("after a forced release the record is %+v, want none", r)
	}
	if !strings.Contains(rec.Body.String(), `id="no-record"`) {
		t.Errorf("the page after a release does not say there is no record")
	}
}

// TestConsoleAuditLinesAreTheAPIs: a release and a reconcile from the
// console write the audit line the key API writes, with the session's
// operator, the reason, and via console.
func TestConsoleAuditLinesAreTheAPIs(t *testing.T) {
	for _, tc := range []struct {
		name, method, suffix, target string
	}{
		{"release", http.MethodDelete, "", "/ui/release"},
		{"reconcile", http.MethodPost, "/reconcile", "/ui/reconcile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
			api, ui := store.Key("charges", "", "by-api"), store.Key("charges", "", "by-console")
			seed(t, e.st, api, seedInDoubt)
			seed(t, e.st, ui, seedInDoubt)
			b := e.login("carol@example.com")
			page := b.keyPage("by-console")

			rec := serve(t, e.h, tc.method, "/v1/keys/charges/by-api"+tc.suffix+"?reason="+url.QueryEscape("INC-9 checked"), bearer,
				http.Header{"X-Operator": {"carol@example.com"}})
			if rec.Code != http.StatusOK {
				t.Fatalf("API %s = %d %s", tc.name, rec.Code, rec.Body)
			}
			if rec := b.do(http.MethodPost, tc.target, actForm(t, page, "INC-9 checked")); rec.Code != http.StatusOK {
				t.Fatalf("console %s = %d %s", tc.name, rec.Code, rec.Body)
			}
			lines := e.auditLines()
			if len(lines) != 2 {
				t.Fatalf("audit lines = %v, want 2", lines)
			}
			fromAPI, fromUI := lines[0], lines[1]
			if keysOf(fromAPI) != keysOf(fromUI) {
				t.Errorf("audit line attributes: API %s, console %s; want the same", keysOf(fromAPI), keysOf(fromUI))
			}
			for k, want := range map[string]string{"operator": "carol@example.com", "reason": "INC-9 checked", "via": "console",
				"key_hash": store.KeyHash(ui), "route": "charges", "user_agent": "console-test", "msg": fromAPI["msg"].(string)} {
				if got, _ := fromUI[k].(string); got != want {
					t.Errorf("console audit %s = %q, want %q", k, got, want)
				}
			}
			if got, _ := fromAPI["via"].(string); got != "api" {
				t.Errorf("API audit via = %q, want api", got)
			}
		})
	}
}

// keysOf lists a log line's attribute names but the time's.
func keysOf(m map[string]any) string {
	var ks []string
	for k := range m {
		if k != "time" && k != "at" {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// TestConsoleActsRedirectToTheirOutcome: an act answers 303 to the page of
// its outcome (post/redirect/get), which shows the outcome once: reloading
// that page shows the key as it is and does nothing again. The in-doubt
// list ticks no key for a bulk release, and a key without an answer says
// why instead of showing empty boxes.
func TestConsoleActsRedirectToTheirOutcome(t *testing.T) {
	e := newConsoleEnv(t, nil)
	sk := store.Key("charges", "", "prg-1")
	seed(t, e.st, sk, seedInDoubt)
	b := e.login("alice")
	list := b.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String()
	if !strings.Contains(list, `name="sel"`) || strings.Contains(list, "checked") {
		t.Errorf("the in-doubt list ticks keys for a bulk release by default:\n%s", list)
	}
	page := b.keyPage("prg-1")
	if _, ok := element(page, "pre", "stored-body"); ok || !strings.Contains(page, `<p id="no-answer" class="note">No answer is stored, and none will come`) {
		t.Errorf("the in-doubt key's page shows stored-answer boxes, or not why there is no answer:\n%s", page)
	}

	b.noFollow = true
	rec := b.do(http.MethodPost, "/ui/release", actForm(t, page, "INC-1 not charged"))
	loc := rec.Header().Get("Location")
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/keys/charges/prg-1?done=") {
		t.Fatalf("release = %d, Location %q; want 303 to the key page with its outcome", rec.Code, loc)
	}
	if e.record(sk) != nil {
		t.Errorf("the release did not release the key")
	}
	shown := b.do(http.MethodGet, loc, nil)
	if class, text := result(shown.Body.String()); shown.Code != http.StatusOK || class != "ok" || !strings.Contains(text, "released") {
		t.Errorf("the outcome's page = %d, div#result %s %q; want 200, ok, released", shown.Code, class, text)
	}
	again := b.do(http.MethodGet, loc, nil)
	if class, _ := result(again.Body.String()); again.Code != http.StatusNotFound || class != "" {
		t.Errorf("the outcome's page reloaded = %d, div#result %q; want the key as it is (404, no record) and no outcome", again.Code, class)
	}
	if n := len(e.auditLines()); n != 1 {
		t.Errorf("audit lines = %d, want 1", n)
	}
	// Another session cannot see the outcome.
	seed(t, e.st, store.Key("charges", "", "prg-2"), seedInDoubt)
	rec = b.do(http.MethodPost, "/ui/release", actForm(t, b.keyPage("prg-2"), "INC-2"))
	other := e.login("mallory")
	if class, _ := result(other.do(http.MethodGet, rec.Header().Get("Location"), nil).Body.String()); class != "" {
		t.Errorf("another session sees this session's outcome (div#result %q)", class)
	}
}
