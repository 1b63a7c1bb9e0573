package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// The routes of the keyspace tests: charges as it was, renamed, renamed
// with its keyspace kept, with its key from a header, scoped, and a route
// of its own beside them.
const (
	renamedRoute = `
  - name: charges-v2
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 10s
    lease: 15s
`
	keptRoute = renamedRoute + `    keyspace: charges
`
	headerKeyRoute = `
  - name: charges-v2
    keyspace: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: 10s
    lease: 15s
`
	scopedRoute = keptRoute + `    scope: {header: X-Api-Key}
`
	orderChargesRoute = `
  - name: order-charges
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
`
)

// reloadBy asks p for a reload through the admin API with token.
func reloadBy(p *proc, token string) result {
	return do("POST", p.adminURL("/-/reload"), "", "Authorization", "Bearer "+token)
}

// wantReplayed fails t unless every order is replayed by p and was
// charged once.
func wantReplayed(t *testing.T, what, stubURL string, p *proc, orders ...string) {
	t.Helper()
	for _, o := range orders {
		if r := charge(p, o); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: retry of %s = %d %s (replayed %q), want the stored 201 replayed", what, o, r.status, r.body, r.header.Get("Idempotent-Replayed"))
		}
		if got := chargeCount(t, stubURL, o); got != 1 {
			t.Errorf("%s: %s charged %d times, want 1", what, o, got)
		}
	}
}

// TestKeyspaceRenameByReload: a reload that renames a route whose keys
// are live is refused (400, reload gauge 0, one ERROR line naming the
// route, the keyspace, the live keys and the fix) and the old route still
// replays; the rename with keyspace: charges is accepted and replays every
// old key; a changed key recipe (a header instead of the body, a scope
// added) is refused too, until an operator drops the keyspace with
// idemproxy keys drop-keyspace (audited), after which the reload is
// accepted.
func TestKeyspaceRenameByReload(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	path, data := filepath.Join(dir, "c.yaml"), filepath.Join(dir, "data")
	writeConfig(t, path, up.URL, data, "", chargesRoute)
	const token = "keyspace-token-for-the-test"
	p := startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)
	orders := []string{"ORD-KR1", "ORD-KR2", "ORD-KR3"}
	for _, o := range orders {
		if r := charge(p, o); r.status != 201 {
			t.Fatalf("charge %s = %d %s", o, r.status, r.body)
		}
	}

	writeConfig(t, path, up.URL, data, "", renamedRoute)
	// The running proxy holds the Badger directory: -check cannot look.
	if out, errOut, code := runBin(t, nil, "-config", path, "-check"); code != 0 || !strings.Contains(out, "ok (1 routes)") ||
		!strings.Contains(errOut, "warning: the routes' keyspaces were not checked against the store's registry") {
		t.Errorf("-check while the proxy holds the store = exit %d %q %q, want 0, ok and a warning that it could not check", code, out, errOut)
	}
	r := reloadBy(p, token)
	if r.status != 400 || problemType(r) != "reload-failed" || !strings.Contains(r.body, "keyspace charges") {
		t.Errorf("reload renaming charges = %d %s, want 400 reload-failed naming keyspace charges", r.status, r.body)
	}
	if got := scrapeValue(t, p, "idemproxy_config_last_reload_successful"); got != 0 {
		t.Errorf("idemproxy_config_last_reload_successful = %v after the refused rename, want 0", got)
	}
	lines := p.log.logLines("configuration reload failed; the running configuration is kept")
	if len(lines) != 1 {
		t.Fatalf("%d reload failures logged, want 1:\n%s", len(lines), p.log)
	}
	msg, _ := lines[0]["err"].(string)
	for _, want := range []string{"route charges-v2", "keyspace charges (routes charges) has live keys", "keyspace: charges on route charges-v2",
		"idemproxy keys drop-keyspace charges -reason"} {
		if lines[0]["level"] != "ERROR" || !strings.Contains(msg, want) {
			t.Errorf("the reload's ERROR line %v does not say %q", lines[0], want)
		}
	}
	wantReplayed(t, "after the refused rename", up.URL, p, orders...)

	writeConfig(t, path, up.URL, data, "", keptRoute)
	if r := reloadBy(p, token); r.status != 200 {
		t.Fatalf("reload renaming with keyspace: charges = %d %s, want 200", r.status, r.body)
	}
	if got := scrapeValue(t, p, "idemproxy_config_last_reload_successful"); got != 1 {
		t.Errorf("idemproxy_config_last_reload_successful = %v, want 1", got)
	}
	wantReplayed(t, "renamed with the keyspace kept", up.URL, p, orders...)

	for _, tc := range []struct{ name, routes, recorded string }{
		{"key from a header", headerKeyRoute, `header Idempotency-Key; scope none; normalize none\", but keyspace charges has live keys made by \"json orderId; scope none; normalize none`},
		{"scope added", scopedRoute, `json orderId; scope header X-Api-Key; normalize none\", but keyspace charges has live keys made by \"json orderId; scope none; normalize none`},
	} {
		writeConfig(t, path, up.URL, data, "", tc.routes)
		if r := reloadBy(p, token); r.status != 400 || !strings.Contains(r.body, tc.recorded) {
			t.Errorf("reload with the %s = %d %s, want 400 saying %s", tc.name, r.status, r.body, tc.recorded)
		}
		wantReplayed(t, "after the refused "+tc.name, up.URL, p, orders...)
	}

	env := []string{"IDEMPROXY_ADMIN_TOKEN=" + token, "IDEMPROXY_ADMIN_URL=" + p.admin, "USER=alice"}
	if _, errOut, code := runBin(t, env, "keys", "drop-keyspace", "charges"); code != 2 || !strings.Contains(errOut, "-reason") {
		t.Errorf("drop-keyspace without -reason = exit %d %q, want 2 asking for it", code, errOut)
	}
	if out, errOut, code := runBin(t, env, "keys", "drop-keyspace", "no-such", "-reason", "INC-9"); code != 1 || !strings.Contains(errOut, "No keyspace of this name in the store's registry (404)") {
		t.Errorf("drop-keyspace of an unknown keyspace = exit %d %q %q, want 1 and the unknown-keyspace problem", code, out, errOut)
	}
	out, errOut, code := runBin(t, env, "keys", "drop-keyspace", "charges", "-reason", "INC-9: keys by header from now on")
	if code != 0 || !strings.Contains(out, "dropped") {
		t.Fatalf("drop-keyspace = exit %d %q %q", code, out, errOut)
	}
	audit := p.log.logLines("keyspace dropped by an operator: its keys are no longer claimed, so retries of the requests they answered will be forwarded again")
	if len(audit) != 1 || audit[0]["keyspace"] != "charges" || audit[0]["operator"] != "alice" || audit[0]["reason"] != "INC-9: keys by header from now on" {
		t.Errorf("the drop's audit line = %v", audit)
	}
	writeConfig(t, path, up.URL, data, "", headerKeyRoute)
	if r := reloadBy(p, token); r.status != 200 {
		t.Fatalf("reload with the key from a header after the drop = %d %s, want 200", r.status, r.body)
	}
	if r := charge(p, "ORD-KR4", "Idempotency-Key", "ORD-KR4"); r.status != 201 || r.header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("ORD-KR4 by header after the drop = %d %s, want 201 forwarded", r.status, r.body)
	}
	if r := charge(p, "ORD-KR4", "Idempotency-Key", "ORD-KR4"); r.header.Get("Idempotent-Replayed") != "true" || chargeCount(t, up.URL, "ORD-KR4") != 1 {
		t.Errorf("retry of ORD-KR4 = %d %s, want it replayed: the new recipe protects", r.status, r.body)
	}
}

// TestKeyspaceRenameByRestart, on Redis: a restart on a configuration
// that renamed charges holds the renamed route (503 keyspace-held, /readyz
// 503 naming it) while other routes serve, and -check reports it; a
// reload with keyspace: charges clears it without a restart, and every old
// key replays.
func TestKeyspaceRenameByRestart(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	writeRedisConfig(t, path, up.URL, []string{rd.Addr()}, chargesRoute+orderChargesRoute)
	const token = "keyspace-restart-token"
	p := startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)
	orders := []string{"ORD-KS1", "ORD-KS2"}
	for _, o := range orders {
		if r := charge(p, o); r.status != 201 {
			t.Fatalf("charge %s = %d %s", o, r.status, r.body)
		}
	}
	p.signal(syscall.SIGTERM)
	p.wait()

	writeRedisConfig(t, path, up.URL, []string{rd.Addr()}, renamedRoute+orderChargesRoute)
	if _, errOut, code := runBin(t, nil, "-config", path, "-check"); code != 1 || !strings.Contains(errOut, "keyspace held: route charges-v2 would start keyspace charges-v2 anew") {
		t.Errorf("-check of the renamed configuration = exit %d %q, want 1 and the held route", code, errOut)
	}
	p = startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)
	r := charge(p, "ORD-KS1")
	if r.status != 503 || problemType(r) != "keyspace-held" || !strings.Contains(r.body, `"route":"charges-v2"`) || !strings.Contains(r.body, "keyspace charges (routes charges) has live keys") {
		t.Errorf("ORD-KS1 on the renamed route = %d %s, want 503 keyspace-held naming the route and the reason", r.status, r.body)
	}
	if got := chargeCount(t, up.URL, "ORD-KS1"); got != 1 {
		t.Errorf("ORD-KS1 charged %d times, want 1", got)
	}
	if rz := do("GET", p.adminURL("/readyz"), ""); rz.status != 503 || !strings.Contains(rz.body, "keyspace-held") || !strings.Contains(rz.body, "charges-v2") {
		t.Errorf("/readyz = %d %q, want 503 naming keyspace-held and the route", rz.status, rz.body)
	}
	if r := do("POST", p.url("/orders/ORD-KS9/charges"), `{"amount": 1}`); r.status != 201 {
		t.Errorf("the other route = %d %s, want it served", r.status, r.body)
	}
	held := p.log.logLines("keyspace held: its keys would be made anew while the store holds live keys made before; the route answers 503 keyspace-held until an operator decides")
	if len(held) != 1 || held[0]["level"] != "ERROR" || held[0]["route"] != "charges-v2" || held[0]["keyspace"] != "charges-v2" {
		t.Errorf("the start's ERROR lines = %v, want one for charges-v2", held)
	}

	writeRedisConfig(t, path, up.URL, []string{rd.Addr()}, keptRoute+orderChargesRoute)
	if r := reloadBy(p, token); r.status != 200 {
		t.Fatalf("reload with keyspace: charges = %d %s, want 200", r.status, r.body)
	}
	wantReplayed(t, "after the reload that kept the keyspace", up.URL, p, orders...)
	if out, errOut, code := runBin(t, nil, "-config", path, "-check"); code != 0 || errOut != "" || !strings.Contains(out, "ok (2 routes)") {
		t.Errorf("-check of the fixed configuration = exit %d %q %q, want 0 and ok", code, out, errOut)
	}
	if rz := do("GET", p.adminURL("/readyz"), ""); rz.status != 200 {
		t.Errorf("/readyz = %d %q after the fix, want 200", rz.status, rz.body)
	}
}

// TestKeyspaceDropClearsAHeldRoute, on PostgreSQL: a route held at start
// (renamed) serves once an operator drops the old keyspace, without a
// restart or a reload, and its keyspace is then recorded: a second rename
// is held again.
func TestKeyspaceDropClearsAHeldRoute(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	writePostgresConfig(t, path, up.URL, chargesRoute)
	p := startPostgresProxy(t, path, pg)
	if r := charge(p, "ORD-KD1"); r.status != 201 {
		t.Fatalf("charge = %d %s", r.status, r.body)
	}
	p.signal(syscall.SIGTERM)
	p.wait()

	writePostgresConfig(t, path, up.URL, renamedRoute)
	p = startPostgresProxy(t, path, pg)
	if r := charge(p, "ORD-KD1"); problemType(r) != "keyspace-held" {
		t.Fatalf("ORD-KD1 on the renamed route = %d %s, want 503 keyspace-held", r.status, r.body)
	}
	env := []string{"IDEMPROXY_ADMIN_TOKEN=s3cret", "IDEMPROXY_ADMIN_URL=" + p.admin}
	if out, errOut, code := runBin(t, env, "keys", "drop-keyspace", "charges", "-reason", "INC-11 renamed on purpose"); code != 0 {
		t.Fatalf("drop-keyspace = exit %d %q %q", code, out, errOut)
	}
	eventually(t, "the renamed route serves after the drop", func() bool {
		return charge(p, "ORD-KD2").status == 201
	})
	if rz := do("GET", p.adminURL("/readyz"), ""); rz.status != 200 {
		t.Errorf("/readyz = %d %q after the drop, want 200", rz.status, rz.body)
	}
	p.signal(syscall.SIGTERM)
	p.wait()

	writePostgresConfig(t, path, up.URL, strings.ReplaceAll(renamedRoute, "charges-v2", "charges-v3"))
	p = startPostgresProxy(t, path, pg)
	if r := charge(p, "ORD-KD2"); problemType(r) != "keyspace-held" {
		t.Errorf("ORD-KD2 after a second rename = %d %s, want 503 keyspace-held (charges-v2 was recorded once it served)", r.status, r.body)
	}
}
