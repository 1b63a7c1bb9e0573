package admin_test

import (
	"bytes"
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// commit puts a completed record with resp under sk.
func commit(t *testing.T, st *badger.Store, sk string, resp store.Response) {
	t.Helper()
	ctx := context.Background()
	if rec, err := st.Reserve(ctx, sk, store.Reservation{Token: ownerToken, Fingerprint: "fp", Lease: lease, TTL: ttl}); err != nil || rec != nil {
		t.Fatalf("Reserve(%q) = %v, %v", sk, rec, err)
	}
	if err := st.Commit(ctx, sk, ownerToken, resp, ttl); err != nil {
		t.Fatal(err)
	}
}

// storedBody returns pre#stored-body's text and whether it is a hex dump,
// and the note above it.
func storedBody(t *testing.T, page string) (text string, hex bool, note string) {
	t.Helper()
	m := regexp.MustCompile(`(?s)<pre id="stored-body"( class="hex")?>(.*?)</pre>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no pre#stored-body in the page:\n%s", page)
	}
	n, _ := element(page, "p", "stored-body-note")
	return html.UnescapeString(m[2]), m[1] != "", html.UnescapeString(n)
}

// TestConsoleEscapesWhatItShows: a key, a stored body, a stored header
// and an operator's name holding HTML and script are shown as text.
func TestConsoleEscapesWhatItShows(t *testing.T) {
	const evil = `<script>alert(1)</script><img src=x onerror=alert(2)>`
	e := newConsoleEnv(t, nil)
	done, doubt := store.Key("charges", "", evil), store.Key("charges", "", evil+"-doubt")
	commit(t, e.st, done, store.Response{Status: 200, Header: http.Header{"X-Evil": {evil}}, Body: []byte("<html><body>" + evil + "</body></html>"), BodyStored: true})
	seed(t, e.st, doubt, seedInDoubt)
	b := e.login(`<b onmouseover=alert(3)>mallory</b>`)
	pages := map[string]string{
		"key page":  b.keyPage(evil),
		"list":      b.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String(),
		"overview":  b.do(http.MethodGet, "/ui/", nil).Body.String(),
		"not found": b.do(http.MethodGet, "/ui/keys/"+url.PathEscape(evil)+"/x", nil).Body.String(),
	}
	for name, page := range pages {
		for _, bad := range []string{"<script", "<img", "<b onmouseover", "<html><body>"} {
			if strings.Contains(page, bad) {
				t.Errorf("%s holds %q unescaped", name, bad)
			}
		}
	}
	if !strings.Contains(pages["key page"], "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the key page does not show the key as text")
	}
	if text, hex, _ := storedBody(t, pages["key page"]); hex || text != "<html><body>"+evil+"</body></html>" {
		t.Errorf("stored body = %q (hex %v), want the HTML as text", text, hex)
	}
	if h, _ := element(pages["key page"], "pre", "stored-headers"); html.UnescapeString(h) != "X-Evil: "+evil+"\n" {
		t.Errorf("stored headers = %q, want the header as text", h)
	}
	if !strings.Contains(pages["list"], "&lt;script&gt;alert(1)&lt;/script&gt;") || !strings.Contains(pages["list"], `data-key-hash="`+store.KeyHash(doubt)+`"`) {
		t.Errorf("the list does not show the key in doubt as text")
	}
	// The list's link opens the key's page.
	m := regexp.MustCompile(`<a class="key-link" href="([^"]+)"`).FindStringSubmatch(pages["list"])
	if m == nil {
		t.Fatalf("no a.key-link in the list")
	}
	if rec := b.do(http.MethodGet, html.UnescapeString(m[1]), nil); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `id="state" class="state-in_doubt"`) {
		t.Errorf("GET %s = %d, want the in-doubt key's page", m[1], rec.Code)
	}
}

// TestConsoleShowsStoredBodies: a stored body is shown as text when it is
// UTF-8 without control characters, else as a hex dump; its first 64 KiB.
func TestConsoleShowsStoredBodies(t *testing.T) {
	const shown = 64 << 10
	long := strings.Repeat("a", shown+36_864)
	cut := strings.Repeat("a", shown-1) + "é" + strings.Repeat("b", 10) // é straddles the cut
	tests := []struct {
		name     string
		body     []byte
		stored   bool
		wantText string // "" when wantHex
		wantHex  []string
		wantNote string
	}{
		{name: "text", body: []byte("charged\n\tch_1\r\n"), stored: true, wantText: "charged\n\tch_1\r\n", wantNote: "15 bytes, text"},
		{name: "JSON", body: []byte(`{"a":"ü"}`), stored: true, wantText: `{"a":"ü"}`, wantNote: "bytes, text"},
		{name: "binary", body: []byte{0x00, 0x01, 0xfe, 0xff, 'A'}, stored: true, wantHex: []string{"00 01 fe ff 41", "|....A|"}, wantNote: "binary"},
		{name: "control bytes", body: []byte("red \x1b[31mtext"), stored: true, wantHex: []string{"1b 5b 33 31"}, wantNote: "binary"},
		{name: "not UTF-8", body: []byte("caf\xe9"), stored: true, wantHex: []string{"63 61 66 e9"}, wantNote: "binary"},
		{name: "long text", body: []byte(long), stored: true, wantText: long[:shown], wantNote: "the first 65,536 bytes are shown, 36,864 more bytes are not"},
		{name: "a character cut", body: []byte(cut), stored: true, wantText: cut[:shown-1], wantNote: "the first 65,535 bytes are shown, 12 more bytes are not"},
		{name: "long binary", body: bytes.Repeat([]byte{0}, shown+100), stored: true, wantHex: []string{"00000000  00 00"}, wantNote: "binary (not UTF-8 text, or holding control characters): shown as a hex dump; the first 65,536 bytes are shown, 100 more bytes are not"},
		{name: "empty", body: nil, stored: true, wantText: "", wantNote: "empty"},
		{name: "not stored", stored: false, wantText: "", wantNote: "the body was not stored"},
	}
	e := newConsoleEnv(t, nil)
	b := e.login("alice")
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "body-" + strconv.Itoa(i)
			commit(t, e.st, store.Key("charges", "", key), store.Response{Status: 200, Body: tc.body, BodyStored: tc.stored})
			text, hex, note := storedBody(t, b.keyPage(key))
			if !strings.Contains(note, tc.wantNote) {
				t.Errorf("note = %q, want it to say %q", note, tc.wantNote)
			}
			if tc.wantHex != nil {
				if !hex {
					t.Fatalf("body shown as text %q, want a hex dump", text[:min(len(text), 80)])
				}
				for _, w := range tc.wantHex {
					if !strings.Contains(text, w) {
						t.Errorf("hex dump %q does not hold %q", text[:min(len(text), 200)], w)
					}
				}
				if lines := strings.Count(text, "\n"); lines > shown/16 {
					t.Errorf("hex dump of %d lines, want at most %d (64 KiB)", lines, shown/16)
				}
				return
			}
			if hex || text != tc.wantText {
				t.Errorf("body = %q… (%d bytes, hex %v), want the text %q… (%d bytes)", text[:min(len(text), 40)], len(text), hex,
					tc.wantText[:min(len(tc.wantText), 40)], len(tc.wantText))
			}
		})
	}
}

// TestConsoleScopedKey: a scoped route's key page is reached by the raw
// scope or by the scope hash a listing shows, and acts on that scope's key.
func TestConsoleScopedKey(t *testing.T) {
	e := newConsoleEnv(t, nil)
	sk := store.Key("refunds", "tenant-7", "R-1")
	seed(t, e.st, sk, seedInDoubt)
	b := e.login("alice")
	scopeHash := strings.Split(sk, "/")[1]
	tests := []struct {
		target string
		status int
	}{
		{"/ui/keys/refunds/R-1?scope=tenant-7", http.StatusOK},
		{"/ui/keys/refunds/R-1?scope_hash=" + scopeHash, http.StatusOK},
		{"/ui/keys/refunds/R-1", http.StatusBadRequest},
		{"/ui/keys/refunds/R-1?scope_hash=zz", http.StatusBadRequest},
		{"/ui/keys/charges/R-1?scope=tenant-7", http.StatusBadRequest},
		{"/ui/keys/nope/R-1", http.StatusNotFound},
	}
	for _, tc := range tests {
		rec := b.do(http.MethodGet, tc.target, nil)
		if rec.Code != tc.status {
			t.Errorf("GET %s = %d, want %d", tc.target, rec.Code, tc.status)
		}
		if tc.status != http.StatusOK {
			if _, ok := element(rec.Body.String(), "div", "error"); !ok {
				t.Errorf("GET %s: no div#error", tc.target)
			}
		}
	}
	list := b.do(http.MethodGet, "/ui/keys?route=refunds", nil).Body.String()
	if !strings.Contains(list, "scope_hash="+scopeHash) {
		t.Errorf("the list's link does not carry the scope hash %s", scopeHash)
	}
	page := b.do(http.MethodGet, "/ui/keys/refunds/R-1?scope=tenant-7", nil).Body.String()
	rec := b.do(http.MethodPost, "/ui/release", actForm(t, page, "INC-3"))
	if class, text := result(rec.Body.String()); class != "ok" {
		t.Errorf("release of a scoped key: %d %s %q", rec.Code, class, text)
	}
	if e.record(sk) != nil {
		t.Errorf("the scoped key is still there")
	}
}

// TestConsoleOverview: each route's keys by state and the age of its
// oldest key in doubt, linking to its list.
func TestConsoleOverview(t *testing.T) {
	e := newConsoleEnv(t, nil)
	for i, st := range []string{seedInDoubt, seedInDoubt, seedLapsed, seedCompleted, seedInFlight, seedNoBody} {
		seed(t, e.st, store.Key("charges", "", "ov-"+strconv.Itoa(i)), st)
	}
	seed(t, e.st, store.Key("refunds", "t1", "ov-r"), seedCompleted)
	b := e.login("alice")
	page := b.do(http.MethodGet, "/ui/", nil).Body.String()
	tests := []struct {
		route                        string
		inDoubt, inFlight, completed string
		oldestNone                   bool
	}{
		{"charges", "3", "1", "2", false},
		{"refunds", "0", "0", "1", true},
	}
	for _, tc := range tests {
		row := regexp.MustCompile(`(?s)<tr data-route="` + tc.route + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(page)
		if row == nil {
			t.Fatalf("no tr[data-route=%s] in the overview:\n%s", tc.route, page)
		}
		cell := func(class string) string {
			m := regexp.MustCompile(`<td class="` + class + `">([^<]*)</td>`).FindStringSubmatch(row[1])
			if m == nil {
				t.Fatalf("route %s: no td.%s", tc.route, class)
			}
			return m[1]
		}
		if got := [3]string{cell("count-in_doubt"), cell("count-in_flight"), cell("count-completed")}; got != [3]string{tc.inDoubt, tc.inFlight, tc.completed} {
			t.Errorf("route %s: in doubt, in flight, completed = %v, want %v", tc.route, got, [3]string{tc.inDoubt, tc.inFlight, tc.completed})
		}
		if oldest := cell("oldest-in-doubt"); (oldest == "none") != tc.oldestNone {
			t.Errorf("route %s: oldest in doubt %q", tc.route, oldest)
		}
		if !strings.Contains(row[1], `<a class="in-doubt-link" href="/ui/keys?route=`+tc.route+`"`) {
			t.Errorf("route %s: no a.in-doubt-link to its list", tc.route)
		}
	}
}

// TestConsoleOverviewIsBounded: a route with more keys than the overview
// reads says its counts are at least those.
func TestConsoleOverviewIsBounded(t *testing.T) {
	e := newConsoleEnv(t, nil)
	ctx := context.Background()
	const n = 10_001
	errc := make(chan error, n)
	sem := make(chan struct{}, 64)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := e.st.Reserve(ctx, store.Key("charges", "", "many-"+strconv.Itoa(i)), store.Reservation{Token: "t", Lease: lease, TTL: ttl})
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	page := e.login("alice").do(http.MethodGet, "/ui/", nil).Body.String()
	row := regexp.MustCompile(`(?s)<tr data-route="charges" class="capped">(.*?)</tr>`).FindStringSubmatch(page)
	if row == nil {
		t.Fatalf("the charges row is not marked capped:\n%s", page)
	}
	if !strings.Contains(html.UnescapeString(row[1]), `<td class="count-in_flight">10,000+</td>`) {
		t.Errorf("charges row %s, want in flight 10,000+", row[1])
	}
	if !strings.Contains(page, "at most 10,000") {
		t.Errorf("the overview does not say it reads at most 10,000 keys a route")
	}
}

// TestConsoleList: the in-doubt list, filtered by key hash and age, paged
// through the key API's listing.
func TestConsoleList(t *testing.T) {
	e := newConsoleEnv(t, nil)
	for i := range 105 {
		seed(t, e.st, store.Key("charges", "", "ls-"+strconv.Itoa(i)), seedInDoubt)
	}
	seed(t, e.st, store.Key("charges", "", "ls-done"), seedCompleted)
	b := e.login("alice")
	rows := func(page string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`<tr data-key-hash="([0-9a-f]+)">`).FindAllStringSubmatch(page, -1) {
			out = append(out, m[1])
		}
		return out
	}
	target := store.KeyHash(store.Key("charges", "", "ls-42"))
	tests := []struct {
		name     string
		query    string
		status   int
		wantRows int
		wantNext bool
		wantErr  string
	}{
		{name: "first page", query: "route=charges", status: 200, wantRows: 100, wantNext: true},
		{name: "the default route", query: "", status: 200, wantRows: 100, wantNext: true},
		{name: "a key hash", query: "route=charges&key_hash=" + target, status: 200, wantRows: 1},
		{name: "the key hash of a completed key", query: "route=charges&key_hash=" + store.KeyHash(store.Key("charges", "", "ls-done")), status: 200, wantRows: 0},
		{name: "older than an hour", query: "route=charges&min_age=1h", status: 200, wantRows: 0, wantNext: true},
		{name: "older than 2 days", query: "route=charges&min_age=2d", status: 200, wantRows: 0, wantNext: true},
		{name: "a bad age", query: "route=charges&min_age=soon", status: 400, wantErr: "min_age"},
		// 106752 days is past time.Duration's 292 years: it would wrap to
		// a negative age, and list every key as older than it.
		{name: "an age past the largest duration", query: "route=charges&min_age=106752d", status: 400, wantErr: "min_age"},
		{name: "a number of hours past the largest duration", query: "route=charges&min_age=2562048h", status: 400, wantErr: "min_age"},
		{name: "a bad key hash", query: "route=charges&key_hash=XYZ", status: 400, wantErr: "12 lower-case hex digits"},
		{name: "an unknown route", query: "route=nope", status: 404, wantErr: "no route named"},
		{name: "a bad cursor", query: "route=charges&cursor=garbage", status: 400, wantErr: "cursor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.do(http.MethodGet, "/ui/keys?"+tc.query, nil)
			page := rec.Body.String()
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tc.status, page)
			}
			if _, ok := element(page, "form", "filter"); !ok {
				t.Errorf("no form#filter")
			}
			if tc.wantErr != "" {
				if msg, _ := element(page, "div", "error"); !strings.Contains(msg, tc.wantErr) {
					t.Errorf("div#error = %q, want it to say %q", msg, tc.wantErr)
				}
				return
			}
			got := rows(page)
			if len(got) != tc.wantRows {
				t.Errorf("%d rows, want %d", len(got), tc.wantRows)
			}
			if tc.name == "a key hash" && (len(got) != 1 || got[0] != target) {
				t.Errorf("rows %v, want the key of hash %s", got, target)
			}
			next := regexp.MustCompile(`<a id="next-page" href="([^"]+)"`).FindStringSubmatch(page)
			if (next != nil) != tc.wantNext {
				t.Fatalf("a#next-page %v, want %v", next, tc.wantNext)
			}
			if next == nil {
				return
			}
			rest := b.do(http.MethodGet, html.UnescapeString(next[1]), nil)
			if tc.query == "route=charges" {
				if r := rows(rest.Body.String()); len(r) != 5 {
					t.Errorf("the next page has %d rows, want 5", len(r))
				}
			}
		})
	}
}

// TestConsoleBulkRelease: the keys selected on a page of the list are
// released each through the single release, once the operator typed the
// confirmation; a key that changed since the page was loaded is not.
func TestConsoleBulkRelease(t *testing.T) {
	e := newConsoleEnv(t, nil)
	var keys []string
	for i := range 4 {
		sk := store.Key("charges", "", "bulk-"+strconv.Itoa(i))
		seed(t, e.st, sk, seedInDoubt)
		keys = append(keys, sk)
	}
	b := e.login("dave")
	list := b.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String()
	for _, id := range []string{`<form id="bulk-release"`, `id="bulk-release-submit"`, `name="confirm"`} {
		if !strings.Contains(list, id) {
			t.Fatalf("the list has no %s", id)
		}
	}
	sel := fields(list, "sel")
	if len(sel) != 4 {
		t.Fatalf("%d keys selectable, want 4", len(sel))
	}
	sel = sel[:3] // the operator leaves one out
	form := func(reason, confirm string) url.Values {
		return url.Values{"csrf": {field(t, list, "csrf")}, "route": {"charges"}, "sel": sel, "reason": {reason}, "confirm": {confirm}}
	}
	for _, tc := range []struct {
		name, reason, confirm, wantMsg string
	}{
		{"no confirmation", "INC-5", "", `type "release 3 keys"`},
		{"the wrong number", "INC-5", "release 4 keys", `type "release 3 keys"`},
		{"other words", "INC-5", "yes", `type "release 3 keys"`},
		{"no reason", "", "release 3 keys", "a reason is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.do(http.MethodPost, "/ui/bulk-release", form(tc.reason, tc.confirm))
			class, text := result(rec.Body.String())
			if rec.Code != http.StatusBadRequest || class != "error" || !strings.Contains(text, tc.wantMsg) || !strings.Contains(text, "nothing was done") {
				t.Errorf("%d, div#result %s %q; want 400, error, %q, nothing was done", rec.Code, class, text, tc.wantMsg)
			}
			for _, sk := range keys {
				if r := e.record(sk); r == nil || r.State != store.StateInDoubt {
					t.Fatalf("after a refused bulk release %s is %+v, want in doubt", sk, r)
				}
			}
		})
	}

	// One selected key changes after the page was loaded: released and
	// reserved again by a retry, whose request may be at the upstream.
	changed := keys[2]
	if err := e.st.Release(t.Context(), changed, ownerToken); err != nil {
		t.Fatal(err)
	}
	if r, err := e.st.Reserve(t.Context(), changed, store.Reservation{Token: "retry", Lease: lease, TTL: ttl}); err != nil || r != nil {
		t.Fatalf("Reserve again = %v, %v", r, err)
	}
	rec := b.do(http.MethodPost, "/ui/bulk-release", form("INC-5 not charged", " release  3 keys "))
	page := rec.Body.String()
	class, text := result(page)
	if rec.Code != http.StatusOK || class != "error" || !strings.Contains(text, "released 2 of 3 keys") {
		t.Errorf("bulk release: %d, div#result %s %q; want 200, error (one refused), released 2 of 3", rec.Code, class, text)
	}
	for i, sk := range keys {
		r := e.record(sk)
		row := regexp.MustCompile(`(?s)<tr data-key-hash="` + store.KeyHash(sk) + `" class="(ok|error)">(.*?)</tr>`).FindStringSubmatch(page)
		switch i {
		case 0, 1:
			if r != nil || row == nil || row[1] != "ok" {
				t.Errorf("%s: record %+v, result row %v; want released, ok", sk, r, row)
			}
		case 2:
			if r == nil || r.State != store.StateInFlight || row == nil || row[1] != "error" || !strings.Contains(html.UnescapeString(row[2]), "this key changed since you loaded the page") {
				t.Errorf("%s: record %+v, result row %v; want the new reservation kept, refused as changed", sk, r, row)
			}
		case 3:
			if r == nil || r.State != store.StateInDoubt || row != nil {
				t.Errorf("%s (not selected): record %+v, result row %v; want it in doubt, not listed", sk, r, row)
			}
		}
	}
	lines := e.auditLines()
	if len(lines) != 2 {
		t.Fatalf("audit lines %v, want 2", lines)
	}
	for _, l := range lines {
		if l["operator"] != "dave" || l["reason"] != "INC-5 not charged" || l["via"] != "console" || l["msg"] != "key released by an operator" {
			t.Errorf("audit line %v, want a release by dave, via console, with the reason", l)
		}
	}
}

// reconcileRoutes is a route with a reconcile lookup at the stub.
const reconcileRoutes = `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 300ms
    lease: 500ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 1h, interval: 1h}
`

// TestConsoleReconcileAsksTheUpstream: reconcile from the console runs the
// route's lookup at the real upstream: a key in doubt whose charge the
// stub made (after a real delay fault) becomes completed with the
// lookup's answer; one the stub never saw is released.
func TestConsoleReconcileAsksTheUpstream(t *testing.T) {
	env := proxytest.New(t, reconcileRoutes)
	rc, err := reconcile.New(env.Proxy.ReconcileHost(), reconcile.Options{Store: env.Store})
	if err != nil {
		t.Fatal(err)
	}
	e := newConsoleEnvOn(t, env.Store, func(o *admin.Options) {
		o.Routes = namedRoutes{"charges": ""}
		o.Reconciler = rc
	})
	env.Fault("delay", 1, "1s")
	proxytest.WantStatus(t, "charge answered too late", env.Charge(`"RC-1"`, 5), http.StatusGatewayTimeout, "upstream-timeout")
	proxytest.Eventually(t, "the stub charged RC-1", func() bool { return env.Charges("RC-1") == 1 })
	if st := env.State("charges", "", "RC-1"); st != store.StateInDoubt {
		t.Fatalf("RC-1 is %q, want in_doubt", st)
	}
	seed(t, env.Store, store.Key("charges", "", "RC-2"), seedInDoubt)

	b := e.login("erin")
	tests := []struct {
		key, wantClass, wantText string
		wantState                store.State
	}{
		{"RC-1", "ok", "reconcile: applied", store.StateCompleted},
		{"RC-2", "ok", "reconcile: not_applied", ""},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			page := b.keyPage(tc.key)
			if _, ok := element(page, "form", "reconcile"); !ok {
				t.Fatalf("the page of a key in doubt has no form#reconcile")
			}
			rec := b.do(http.MethodPost, "/ui/reconcile", actForm(t, page, "INC-11 upstream checked"))
			class, text := result(rec.Body.String())
			if rec.Code != http.StatusOK || class != tc.wantClass || !strings.Contains(text, tc.wantText) {
				t.Errorf("reconcile: %d, div#result %s %q; want 200, %s, %q", rec.Code, class, text, tc.wantClass, tc.wantText)
			}
			if !strings.Contains(text, "lookup status: ") {
				t.Errorf("div#result %q does not show the lookup's status", text)
			}
			if st := env.State("charges", "", tc.key); st != tc.wantState {
				t.Errorf("state after reconcile %q, want %q", st, tc.wantState)
			}
		})
	}
	if status, _ := element(b.keyPage("RC-1"), "dd", "stored-status"); !strings.Contains(status, "from a reconcile lookup") {
		t.Errorf("dd#stored-status = %q, want it to say the answer came from a lookup", status)
	}
	if n := env.Charges("RC-1"); n != 1 {
		t.Errorf("RC-1 charged %d times, want 1", n)
	}
	for _, l := range e.auditLines() {
		if l["operator"] != "erin" || l["reason"] != "INC-11 upstream checked" || l["via"] != "console" {
			t.Errorf("audit line %v, want erin's, via console, with the reason", l)
		}
	}
	if n := len(e.auditLines()); n != 2 {
		t.Errorf("%d audit lines, want 2", n)
	}
}

// TestConsoleDOMContract: the ids and classes the browser tests find the
// pages' parts by.
func TestConsoleDOMContract(t *testing.T) {
	e := newConsoleEnv(t, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	seed(t, e.st, store.Key("charges", "", "dom-doubt"), seedInDoubt)
	seed(t, e.st, store.Key("charges", "", "dom-flying"), seedInFlight)
	anon := &browser{e: e, remote: "192.0.2.77:1"}
	b := e.login("alice")
	tests := []struct {
		name string
		page string
		want []string
	}{
		{"login", anon.do(http.MethodGet, "/ui/login", nil).Body.String(),
			[]string{`<form id="login"`, `name="token"`, `name="operator"`, `<button type="submit" id="login-submit"`}},
		{"overview", b.do(http.MethodGet, "/ui/", nil).Body.String(),
			[]string{`<form id="logout"`, `<table id="routes"`, `<tr data-route="charges"`, `<td class="count-in_doubt">`, `<td class="count-in_flight">`,
				`<td class="count-completed">`, `<td class="oldest-in-doubt">`, `<a class="in-doubt-link"`, `name="csrf"`}},
		{"list", b.do(http.MethodGet, "/ui/keys?route=charges", nil).Body.String(),
			[]string{`<form id="logout"`, `<form id="filter"`, `<select id="route" name="route"`, `name="min_age"`, `name="key_hash"`, `id="filter-submit"`,
				`<table id="keys"`, `<tr data-key-hash="` + store.KeyHash(store.Key("charges", "", "dom-doubt")) + `"`, `<a class="key-link"`,
				`<form id="bulk-release"`, `name="reason"`, `name="confirm"`, `id="bulk-release-submit"`}},
		{"key in doubt", b.keyPage("dom-doubt"),
			[]string{`<form id="logout"`, `<dl id="record"`, `<dd id="state"`, `<dd id="token"`, `<dd id="fingerprint"`, `<dd id="origin"`, `<dd id="stored-status"`,
				`<p id="no-answer"`, `<form id="reconcile"`, `id="reconcile-submit"`, `<form id="release"`, `id="release-submit"`,
				`name="reason"`, `name="version"`, `name="csrf"`}},
		{"key in flight", b.keyPage("dom-flying"), []string{`<form id="release"`, `name="force"`}},
		{"error", b.do(http.MethodGet, "/ui/nowhere", nil).Body.String(), []string{`<div id="error"`, `<form id="logout"`}},
		{"result", b.do(http.MethodPost, "/ui/release", actForm(t, b.keyPage("dom-doubt"), "")).Body.String(), []string{`<div id="result" class="error"`}},
	}
	for _, tc := range tests {
		for _, w := range tc.want {
			if !strings.Contains(tc.page, w) {
				t.Errorf("%s page: no %s", tc.name, w)
			}
		}
	}
	_ = time.Second
}

// TestConsoleKeyWithoutRecord: the page of a key without a record says so,
// 404, and offers no act.
func TestConsoleKeyWithoutRecord(t *testing.T) {
	e := newConsoleEnv(t, nil)
	rec := e.login("alice").do(http.MethodGet, "/ui/keys/charges/never-seen", nil)
	page := rec.Body.String()
	if rec.Code != http.StatusNotFound || !strings.Contains(page, `id="no-record"`) || strings.Contains(page, `<form id="release"`) {
		t.Errorf("GET the page of a key never seen = %d; want 404, no-record, no release form:\n%s", rec.Code, page)
	}
}
