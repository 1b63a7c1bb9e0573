package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/browsertest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// The console's tests drive the real binary's /ui/ in a real headless
// Chromium (internal/testenv/browsertest), as an operator does: log in,
// follow the overview's count of keys in doubt to the list and to a key,
// decide with a reason, and check what the decision did through the key
// API and the audit lines on the proxy's stderr.

// consoleToken is the admin token of the console's tests.
const consoleToken = "console-s3cret"

// consoleBrowserLife bounds one test's browser: the console's tests take a
// few seconds each.
const consoleBrowserLife = 90 * time.Second

// scriptBody is what the notes route's upstream answers: a stored body
// with markup and a script, which the key page must show as text. Run, the
// script would change the page's title and set a global.
const scriptBody = `<script>document.title="pwned";window.pwned=1</script><u id="injected">underlined</u>`

// htmlKey is a key with markup, which the key page must show as text.
const htmlKey = `<u id="injected-key">k</u>`

// consoleRoutes: charges, on the stub, with a reconcile lookup whose grace
// is long enough that only an operator looks it up during a test; notes, on
// the test's own upstream, which answers markup.
const consoleRoutes = `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 2s
    lease: 3s
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 1h, interval: 1h}
  - name: notes
    match: POST /notes
    key: {header: Idempotency-Key}
    upstream_timeout: 2s
`

// consoleEnv is a proxy with its console, its upstream and a browser.
type consoleEnv struct {
	t  *testing.T
	p  *proc
	up *httptest.Server
	b  *browsertest.Browser
}

// startConsole starts the upstream (the real stub, and POST /notes
// answering scriptBody as HTML), the proxy with the admin token, and a
// browser.
func startConsole(t *testing.T) *consoleEnv {
	t.Helper()
	charges := stub.New(slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notes", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, scriptBody)
	})
	mux.Handle("/", charges)
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", consoleRoutes)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+consoleToken)
	return &consoleEnv{t: t, p: p, up: up, b: browsertest.New(t, consoleBrowserLife)}
}

// inDoubt charges each order through the proxy with the stub's
// drop-after-charge fault: the stub charges, then drops the connection
// without an answer, and the proxy leaves the key in doubt (502).
func (e *consoleEnv) inDoubt(orders ...string) {
	e.t.Helper()
	for _, order := range orders {
		r := charge(e.p, order, "X-Stub-Fault", "drop-after-charge")
		if r.status != http.StatusBadGateway || problemType(r) != "upstream-reset" {
			e.t.Fatalf("charge %s with drop-after-charge = %d %s %v, want 502 upstream-reset", order, r.status, r.body, r.err)
		}
		if got := e.state("charges", order); got != "in_doubt" {
			e.t.Fatalf("%s after the dropped answer is %q, want in_doubt", order, got)
		}
	}
}

// login logs in as operator through the login page, with the admin token
// and the operator's name, as a person types them.
func (e *consoleEnv) login(operator string) {
	e.t.Helper()
	b := e.b
	b.Navigate(e.p.adminURL("/ui/login"))
	b.Fill("form#login input[name=token]", consoleToken)
	b.Fill("form#login input[name=operator]", operator)
	b.Click("button#login-submit")
	if !b.Has("form#logout") {
		e.t.Fatalf("after logging in as %s, at %s, there is no form#logout", operator, b.URL())
	}
}

// key is what the key API shows of a record (GET /v1/keys/{route}/{key}).
type key struct {
	State        string `json:"state"`
	Token        string `json:"token"`
	StoredStatus int    `json:"stored_status"`
	Reconciled   bool   `json:"reconciled"`
}

// record reads a key through the key API with the bearer token; nil when
// there is no record (404).
func (e *consoleEnv) record(route, k string) *key {
	e.t.Helper()
	r := do("GET", e.p.adminURL("/v1/keys/"+route+"/"+url.PathEscape(k)), "", "Authorization", "Bearer "+consoleToken)
	switch r.status {
	case http.StatusNotFound:
		return nil
	case http.StatusOK:
	default:
		e.t.Fatalf("GET /v1/keys/%s/%s = %d %s %v", route, k, r.status, r.body, r.err)
	}
	var rec key
	if err := json.Unmarshal([]byte(r.body), &rec); err != nil {
		e.t.Fatalf("GET /v1/keys/%s/%s: %v in %s", route, k, err, r.body)
	}
	return &rec
}

// state is the key's state through the key API, "" for no record.
func (e *consoleEnv) state(route, k string) string {
	e.t.Helper()
	if rec := e.record(route, k); rec != nil {
		return rec.State
	}
	return ""
}

// keyPage is the console's address of a key's page.
func (e *consoleEnv) keyPage(route, k string) string {
	return e.p.adminURL("/ui/keys/" + route + "/" + url.PathEscape(k))
}

// audit returns the audit lines msg about key hash h.
func (e *consoleEnv) audit(msg, h string) []map[string]any {
	var out []map[string]any
	for _, l := range e.p.log.logLines(msg) {
		if l["key_hash"] == h {
			out = append(out, l)
		}
	}
	return out
}

// keyHashOf returns the key hash of order on charges, once the access log
// line of its in-doubt request, which an operator starts from, shows it.
func (e *consoleEnv) keyHashOf(order string) string {
	e.t.Helper()
	h := store.KeyHash(store.Key("charges", "", order))
	eventually(e.t, "the access log line of "+order+"'s in-doubt request", func() bool {
		for _, l := range e.p.log.logLines("request") {
			if l["outcome"] == "in_doubt" && l["key_hash"] == h {
				return true
			}
		}
		return false
	})
	return h
}

// checkAudit checks the one audit line msg of key hash h: by operator,
// for reason, from the console, with want's further attributes.
func (e *consoleEnv) checkAudit(msg, h, operator, reason string, want map[string]any) {
	e.t.Helper()
	lines := e.audit(msg, h)
	if len(lines) != 1 {
		e.t.Fatalf("audit lines %q of key hash %s = %v, want one", msg, h, lines)
	}
	l := lines[0]
	wantAll := map[string]any{"operator": operator, "reason": reason, "via": "console", "key_hash": h, "level": "WARN"}
	for k, v := range want {
		wantAll[k] = v
	}
	for k, v := range wantAll {
		if l[k] != v {
			e.t.Errorf("audit line %q: %s = %v, want %v\n%v", msg, k, l[k], v, l)
		}
	}
	if ua, _ := l["user_agent"].(string); !strings.Contains(ua, "Chrome") {
		e.t.Errorf("audit line %q: user_agent = %q, want the browser's", msg, ua)
	}
}

// TestConsoleLogin: the console asks for the token and a name before any
// page; a wrong token is refused on the login page; the right one opens a
// session kept in an HTTP-only, same-site cookie (never in the address,
// never readable by a script); logging out ends it.
func TestConsoleLogin(t *testing.T) {
	t.Parallel()
	e := startConsole(t)
	b := e.b

	b.Navigate(e.p.adminURL("/ui/"))
	if !b.Has("form#login") || b.Has("form#logout") {
		t.Fatalf("GET /ui/ without a session, at %s: want the login form and no session", b.URL())
	}

	b.Navigate(e.p.adminURL("/ui/login"))
	b.Fill("form#login input[name=token]", "wrong-token")
	b.Fill("form#login input[name=operator]", "alice")
	if status := b.Click("button#login-submit"); status != http.StatusUnauthorized {
		t.Errorf("login with a wrong token = %d, want 401", status)
	}
	if b.Has("form#logout") || !b.Has("form#login") || !b.Has("div#error") {
		t.Errorf("after a wrong token, at %s: want the login form again with div#error, and no session", b.URL())
	}
	for _, c := range b.Cookies() {
		if c.Name == "idemproxy_console" && c.Value != "" {
			t.Errorf("a wrong token set the session cookie %+v", c)
		}
	}

	e.login("alice")
	if u := b.URL(); strings.Contains(u, consoleToken) {
		t.Errorf("the address after logging in holds the token: %s", u)
	}
	if !b.Has("table#routes") {
		t.Errorf("after logging in, at %s: no table#routes (the overview)", b.URL())
	}
	var session *browsertest.Cookie
	for _, c := range b.Cookies() {
		if c.Name == "idemproxy_console" {
			session = &c
		}
	}
	switch {
	case session == nil:
		t.Errorf("no session cookie after logging in: %+v", b.Cookies())
	case !session.HTTPOnly || session.SameSite != "Strict" || strings.Contains(session.Value, consoleToken):
		t.Errorf("session cookie = %+v, want HTTP-only, SameSite=Strict, without the token", *session)
	}
	if got := browsertest.Eval[string](b, "document.cookie"); got != "" {
		t.Errorf("document.cookie = %q, want nothing a script can read", got)
	}
	if got := b.Count("input[name=csrf]"); got == 0 {
		t.Errorf("the overview has no csrf field (its logout form needs one)")
	}

	b.Click("form#logout button")
	if !b.Has("form#login") {
		t.Errorf("after logging out, at %s: want the login form", b.URL())
	}
	b.Navigate(e.p.adminURL("/ui/"))
	if b.Has("form#logout") || !b.Has("form#login") {
		t.Errorf("GET /ui/ after logging out, at %s: want the login form, the session over", b.URL())
	}
}

// TestConsoleInDoubtToDecision is the promise: from the in-doubt
// alert to a recorded decision in two clicks and a reason. Two charges
// whose answers the stub dropped after charging are in doubt; the operator
// opens the overview, sees the count, clicks the route's keys in doubt (1),
// clicks the key (2), types a reason and presses Enter: the reconcile
// lookup asks the stub, the key is completed with the lookup's answer, and
// the audit line says who, why and how. The other key is released with a
// reason through its page's button.
func TestConsoleInDoubtToDecision(t *testing.T) {
	t.Parallel()
	e := startConsole(t)
	b := e.b
	e.inDoubt("ORD-A", "ORD-B")
	hashA, hashB := e.keyHashOf("ORD-A"), e.keyHashOf("ORD-B")
	e.login("alice")

	// The alert names the route; the operator opens the console.
	b.Navigate(e.p.adminURL("/ui/"))
	row := `table#routes tr[data-route="charges"] `
	if got := strings.TrimSpace(b.Text(row + "td.count-in_doubt")); got != "2" {
		t.Errorf("overview: charges in doubt = %q, want 2", got)
	}
	if got := strings.TrimSpace(b.Text(row + "td.oldest-in-doubt")); got == "" || got == "-" {
		t.Errorf("overview: oldest in doubt = %q, want the oldest key's age", got)
	}
	before := b.Clicks()
	b.Click(row + "a.in-doubt-link")
	for _, h := range []string{hashA, hashB} {
		if !b.Has(fmt.Sprintf(`table#keys tr[data-key-hash=%q]`, h)) {
			t.Fatalf("the in-doubt list, at %s, has no row for key hash %s", b.URL(), h)
		}
	}
	b.Click(fmt.Sprintf(`table#keys tr[data-key-hash=%q] a.key-link`, hashA))
	if got := strings.TrimSpace(b.Text("dl#record dd#state")); got != "in_doubt" {
		t.Errorf("key page of ORD-A: state = %q, want in_doubt", got)
	}
	// No empty boxes of a stored answer: why there is none.
	if b.Has("pre#stored-body") || b.Has("pre#stored-headers") || !strings.Contains(b.Text("p#no-answer"), "its answer was lost") {
		t.Errorf("key page of ORD-A in doubt: stored-body %v, stored-headers %v, p#no-answer %q; want no boxes, and why there is no answer",
			b.Has("pre#stored-body"), b.Has("pre#stored-headers"), b.Text("p#no-answer"))
	}
	// The reason, and Enter to submit it: no third click.
	b.Press("form#reconcile input[name=reason]", "INC-7 stub charged it\n")
	if got := b.Clicks() - before; got != 2 {
		t.Errorf("clicks from the overview to the decision = %d, want 2", got)
	}
	if !b.Has("div#result.ok") {
		t.Fatalf("reconcile of ORD-A, at %s: no div#result.ok", b.URL())
	}
	result := b.Text("div#result")
	for _, want := range []string{"applied", "200"} {
		if !strings.Contains(result, want) {
			t.Errorf("reconcile result %q does not say %q (the lookup's answer)", result, want)
		}
	}
	if rec := e.record("charges", "ORD-A"); rec == nil || rec.State != "completed" || !rec.Reconciled || rec.StoredStatus != http.StatusCreated {
		t.Errorf("ORD-A after the console's reconcile = %+v, want completed, reconciled, stored 201 (reconcile.applied_status)", rec)
	}
	e.checkAudit("key reconciled by an operator", hashA, "alice", "INC-7 stub charged it", map[string]any{"route": "charges", "result": "applied"})
	// Post/redirect/get: the result is the key page, got; reloading it
	// shows the key as it is and submits nothing again.
	if u := b.URL(); !strings.Contains(u, "/ui/keys/charges/ORD-A?done=") {
		t.Errorf("after the reconcile the browser is at %s, want the key page (a GET), not the form's POST", u)
	}
	if status := b.Navigate(b.URL()); status != http.StatusOK || b.Has("div#result") || strings.TrimSpace(b.Text("dd#state")) != "completed" {
		t.Errorf("the result page reloaded = %d, div#result %v, state %q; want 200, the outcome shown once, completed",
			status, b.Has("div#result"), b.Text("dd#state"))
	}
	if got := len(e.audit("key reconciled by an operator", hashA)); got != 1 {
		t.Errorf("audit lines of ORD-A's reconcile after a reload = %d, want 1: the reload repeated the act", got)
	}
	replay := charge(e.p, "ORD-A")
	if replay.status != http.StatusCreated || replay.header.Get("Idempotent-Reconciled") != "true" || !strings.Contains(replay.body, `"orderId":"ORD-A"`) {
		t.Errorf("retry of ORD-A = %d %v %s, want the lookup's charge replayed with the route's 201", replay.status, replay.header, replay.body)
	}

	// The other key: released, with a reason, by its page's button.
	b.Navigate(e.p.adminURL("/ui/keys?route=charges"))
	b.Click(fmt.Sprintf(`table#keys tr[data-key-hash=%q] a.key-link`, hashB))
	if b.Has("form#release input[name=force]") {
		t.Errorf("the release form of an in-doubt key offers force (only a key in flight needs it)")
	}
	b.Fill("form#release input[name=reason]", "INC-8 refunded by hand")
	b.Click("button#release-submit")
	if !b.Has("div#result.ok") {
		t.Fatalf("release of ORD-B, at %s: no div#result.ok", b.URL())
	}
	if status := b.Navigate(b.URL()); status != http.StatusNotFound || b.Has("div#result") || !b.Has("p#no-record") {
		t.Errorf("the release's result page reloaded = %d, div#result %v; want 404 no-record, the outcome shown once", status, b.Has("div#result"))
	}
	if got := e.state("charges", "ORD-B"); got != "" {
		t.Errorf("ORD-B after the console's release is %q, want no record", got)
	}
	e.checkAudit("key released by an operator", hashB, "alice", "INC-8 refunded by hand",
		map[string]any{"route": "charges", "previous_state": "in_doubt"})
	for order, want := range map[string]int{"ORD-A": 1, "ORD-B": 1} {
		if got := chargeCount(t, e.up.URL, order); got != want {
			t.Errorf("charges of %s = %d, want %d", order, got, want)
		}
	}
}

// TestConsoleRefusals: what the console must not do. A key with markup,
// and a stored body with markup and a script, are shown as text, and
// nothing of them runs; an action
// whose CSRF token was changed in the page is refused and the key stays in
// doubt, unaudited; an action on a key that changed since its page was
// loaded (released through the API, and charged again by a retry) is
// refused with the reason in div#result.error, the new answer kept.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	e := startConsole(t)
	b := e.b
	for _, k := range []string{"note-1", htmlKey} {
		if r := do("POST", e.p.url("/notes"), `{"text": "hi"}`, "Idempotency-Key", k); r.status != http.StatusOK || r.body != scriptBody {
			t.Fatalf("POST /notes with key %q = %d %q, want 200 and the markup", k, r.status, r.body)
		}
	}
	e.inDoubt("ORD-X", "ORD-Y", "ORD-Z")
	e.login("bob")

	t.Run("a key with markup is text", func(t *testing.T) {
		b.Navigate(e.keyPage("notes", htmlKey))
		if got := b.Count("#injected-key"); got != 0 {
			t.Errorf("the key's markup made %d elements, want none", got)
		}
		if got := b.Text("h1"); !strings.Contains(got, htmlKey) {
			t.Errorf("h1 = %q, want the key %q as text", got, htmlKey)
		}
	})

	t.Run("a stored script is text", func(t *testing.T) {
		b.Navigate(e.keyPage("notes", "note-1"))
		if got := strings.TrimSpace(b.Text("dd#state")); got != "completed" {
			t.Errorf("state = %q, want completed", got)
		}
		if got := b.Text("pre#stored-body"); !strings.Contains(got, scriptBody) {
			t.Errorf("pre#stored-body text = %q, want it to hold %q as text", got, scriptBody)
		}
		if got := b.Text("pre#stored-headers"); !strings.Contains(got, "text/html") {
			t.Errorf("pre#stored-headers = %q, want the stored Content-Type", got)
		}
		for _, tt := range []struct{ what, expr, want string }{
			{"script elements", `String(document.querySelectorAll("script").length)`, "0"},
			{"the stored element", `String(document.querySelectorAll("#injected").length)`, "0"},
			{"the script's global", `typeof window.pwned`, "undefined"},
			{"the script's title", `String(document.title === "pwned")`, "false"},
		} {
			if got := browsertest.Eval[string](b, tt.expr); got != tt.want {
				t.Errorf("%s: %s = %q, want %q", tt.what, tt.expr, got, tt.want)
			}
		}
	})

	t.Run("a wrong CSRF token", func(t *testing.T) {
		before := e.record("charges", "ORD-X")
		b.Navigate(e.keyPage("charges", "ORD-X"))
		b.SetValue("form#release input[name=csrf]", "forged-"+strings.Repeat("0", 16))
		b.Fill("form#release input[name=reason]", "forged")
		status := b.Click("button#release-submit")
		if status != http.StatusForbidden {
			t.Errorf("release with a wrong CSRF token = %d, want 403", status)
		}
		if !b.Has("div#error") || !strings.Contains(b.Text("div#error"), "CSRF") {
			t.Errorf("release with a wrong CSRF token, at %s: no div#error naming the CSRF token", b.URL())
		}
		if b.Has("div#result.ok") {
			t.Errorf("release with a wrong CSRF token says it succeeded: %s", b.Text("div#result"))
		}
		after := e.record("charges", "ORD-X")
		if after == nil || after.State != "in_doubt" || after.Token != before.Token {
			t.Errorf("ORD-X after a forged release = %+v, want unchanged %+v", after, before)
		}
		if l := e.p.log.logLines("key released by an operator"); len(l) != 0 {
			t.Errorf("a forged release was audited as done: %v", l)
		}
	})

	t.Run("a key that changed since its page was loaded", func(t *testing.T) {
		for _, tt := range []struct {
			name, order string
			meanwhile   func()
			wantState   string
			wantMsg     string
		}{
			{"released through the API", "ORD-Y", func() { e.apiRelease("ORD-Y") }, "", "no record for this key"},
			{"released through the API and charged again", "ORD-Z", func() {
				e.apiRelease("ORD-Z")
				if r := charge(e.p, "ORD-Z"); r.status != http.StatusCreated {
					t.Fatalf("retry of ORD-Z after its release = %d %s, want 201", r.status, r.body)
				}
			}, "completed", "this key changed since you loaded the page"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				b.Navigate(e.keyPage("charges", tt.order))
				if got := strings.TrimSpace(b.Text("dd#state")); got != "in_doubt" {
					t.Fatalf("state on the page = %q, want in_doubt", got)
				}
				tt.meanwhile()
				b.Fill("form#release input[name=reason]", "stale page")
				b.Click("button#release-submit")
				if !b.Has("div#result.error") {
					t.Fatalf("release from a stale page, at %s: no div#result.error", b.URL())
				}
				if got := b.Text("div#result.error"); !strings.Contains(got, tt.wantMsg) {
					t.Errorf("div#result.error = %q, want it to say %q", got, tt.wantMsg)
				}
				if got := e.state("charges", tt.order); got != tt.wantState {
					t.Errorf("%s after the refused release is %q, want %q", tt.order, got, tt.wantState)
				}
				hash := e.keyHashOf(tt.order)
				if l := e.audit("key released by an operator", hash); len(l) != 1 || l[0]["via"] != "api" {
					t.Errorf("release audit lines of %s = %v, want only the API's", tt.order, l)
				}
			})
		}
	})
}

// apiRelease releases a key of charges through the key API, as another
// operator with curl would.
func (e *consoleEnv) apiRelease(order string) {
	e.t.Helper()
	r := do("DELETE", e.p.adminURL("/v1/keys/charges/"+order+"?reason=meanwhile"), "",
		"Authorization", "Bearer "+consoleToken, "X-Operator", "carol")
	if r.status != http.StatusOK && r.status != http.StatusNoContent {
		e.t.Fatalf("DELETE /v1/keys/charges/%s = %d %s", order, r.status, r.body)
	}
}

// TestConsoleBulkRelease: the list filtered by a key hash from a log line
// holds that key only; the whole route's list is released at once, but
// only with the typed confirmation naming how many keys, and each release
// is audited.
func TestConsoleBulkRelease(t *testing.T) {
	t.Parallel()
	e := startConsole(t)
	b := e.b
	orders := []string{"ORD-1", "ORD-2", "ORD-3"}
	e.inDoubt(orders...)
	hash := e.keyHashOf("ORD-2")
	e.login("dana")

	b.Navigate(e.p.adminURL("/ui/keys?route=charges"))
	b.Fill("form#filter input[name=key_hash]", hash)
	b.Click("button#filter-submit")
	if got := b.Count("table#keys tr[data-key-hash]"); got != 1 || !b.Has(fmt.Sprintf(`tr[data-key-hash=%q]`, hash)) {
		t.Errorf("the list filtered by key hash %s has %d rows, want that key's only", hash, got)
	}
	if got := strings.TrimSpace(b.Text("table#keys a.key-link")); got != "ORD-2" {
		t.Errorf("the key of hash %s = %q, want ORD-2", hash, got)
	}

	b.Navigate(e.p.adminURL("/ui/keys?route=charges&min_age=1h"))
	if got := b.Count("table#keys tr[data-key-hash]"); got != 0 {
		t.Errorf("keys in doubt older than 1h: %d rows, want none", got)
	}

	b.Navigate(e.p.adminURL("/ui/keys?route=charges"))
	if got := b.Count("table#keys tr[data-key-hash]"); got != len(orders) {
		t.Fatalf("the list of charges has %d rows, want %d", got, len(orders))
	}
	// Nothing is selected for a bulk release until the operator ticks it.
	if got := b.Count("table#keys input[name=sel]:checked"); got != 0 {
		t.Errorf("keys ticked for the bulk release when the list opens = %d, want none", got)
	}
	tickAll := func() {
		for _, o := range orders {
			b.Tick(fmt.Sprintf(`table#keys tr[data-key-hash=%q] input[name=sel]`, store.KeyHash(store.Key("charges", "", o))))
		}
		if got := b.Count("table#keys input[name=sel]:checked"); got != len(orders) {
			t.Fatalf("keys ticked = %d, want %d", got, len(orders))
		}
	}
	tickAll()
	b.Fill("form#bulk-release input[name=reason]", "INC-9 upstream rolled back")
	b.Fill("form#bulk-release input[name=confirm]", "release 2 keys")
	if status := b.Click("button#bulk-release-submit"); status != http.StatusBadRequest {
		t.Errorf("bulk release with a wrong count = %d, want 400", status)
	}
	if !b.Has("div#result.error") || !strings.Contains(b.Text("div#result.error"), `"release 3 keys"`) {
		t.Errorf("bulk release with a wrong count, at %s: no div#result.error saying what to type", b.URL())
	}
	for _, o := range orders {
		if got := e.state("charges", o); got != "in_doubt" {
			t.Errorf("%s after a refused bulk release is %q, want in_doubt", o, got)
		}
	}

	b.Navigate(e.p.adminURL("/ui/keys?route=charges"))
	tickAll()
	b.Fill("form#bulk-release input[name=reason]", "INC-9 upstream rolled back")
	b.Fill("form#bulk-release input[name=confirm]", fmt.Sprintf("release %d keys", len(orders)))
	b.Click("button#bulk-release-submit")
	if !b.Has("div#result.ok") {
		t.Fatalf("bulk release, at %s: no div#result.ok", b.URL())
	}
	if got := b.Count("table#bulk-results tr.ok[data-key-hash]"); got != len(orders) {
		t.Errorf("bulk release results: %d keys released, want %d", got, len(orders))
	}
	// Post/redirect/get: reloading the outcome releases nothing again.
	if status := b.Navigate(b.URL()); status != http.StatusNotFound || b.Has("table#bulk-results") {
		t.Errorf("the bulk release's outcome reloaded = %d, results shown %v; want 404, the outcome shown once", status, b.Has("table#bulk-results"))
	}
	for _, o := range orders {
		if got := e.state("charges", o); got != "" {
			t.Errorf("%s after the bulk release is %q, want no record", o, got)
		}
	}
	lines := e.p.log.logLines("key released by an operator")
	if len(lines) != len(orders) {
		t.Errorf("audit lines of the bulk release = %d, want %d", len(lines), len(orders))
	}
	for _, l := range lines {
		if l["operator"] != "dana" || l["reason"] != "INC-9 upstream rolled back" || l["via"] != "console" {
			t.Errorf("bulk release audit line = %v, want dana, the reason, via console", l)
		}
	}
}

// TestConsoleScreenshots takes the docs' pictures of the console: the login
// page, the overview, the in-doubt list, a key page with a reason typed, and
// the page with the reconcile's result, as PNG files of the whole page at
// the browser's viewport width. With
// IDEMPROXY_SCREENSHOTS=docs/images they replace the docs' own
// (docs/images/console-*.png); without it they go to a temporary
// directory, and the test checks that each is a picture of the page.
func TestConsoleScreenshots(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("IDEMPROXY_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	e := startConsole(t)
	b := e.b
	e.inDoubt("ORD-4001", "ORD-4002", "ORD-4003")
	if r := charge(e.p, "ORD-4004"); r.status != http.StatusCreated {
		t.Fatalf("charge ORD-4004 = %d %s", r.status, r.body)
	}
	do("POST", e.p.url("/notes"), `{"text": "hi"}`, "Idempotency-Key", "note-1")
	hash := e.keyHashOf("ORD-4001")

	shots := []struct {
		name string
		show func()
	}{
		{"login", func() {
			b.Navigate(e.p.adminURL("/ui/login"))
			b.Fill("form#login input[name=operator]", "alice")
		}},
		{"overview", func() {
			e.login("alice")
			b.Navigate(e.p.adminURL("/ui/"))
		}},
		{"in-doubt", func() {
			b.Click(`table#routes tr[data-route="charges"] a.in-doubt-link`)
		}},
		{"key", func() {
			b.Click(fmt.Sprintf(`table#keys tr[data-key-hash=%q] a.key-link`, hash))
			b.Fill("form#reconcile input[name=reason]", "INC-4001: the stub's statement shows the charge")
		}},
		{"result", func() {
			b.Click("button#reconcile-submit")
			if !b.Has("div#result.ok") {
				t.Fatalf("reconcile, at %s: no div#result.ok", b.URL())
			}
		}},
	}
	for _, s := range shots {
		s.show()
		path := filepath.Join(dir, "console-"+s.name+".png")
		b.Screenshot(path)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if w := img.Bounds().Dx(); w != browsertest.ViewportWidth {
			t.Errorf("%s is %d pixels wide, want %d", path, w, browsertest.ViewportWidth)
		}
	}
}
