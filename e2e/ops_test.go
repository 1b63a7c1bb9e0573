package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/app/cli"
	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
	"github.com/idemproxy/idemproxy/proxy"
)

// metricValue finds one sample line of a scrape ("name{labels} value").
func metricValue(scrape, series string) (string, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// TestMetricsScrape: outcomes of real traffic show up on /metrics with the
// documented names, next to the Go, process and build series.
func TestMetricsScrape(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	charge(p, "ORD-M1")
	charge(p, "ORD-M1")
	do("GET", p.url("/orders/ORD-M1/charges"), "")
	do("GET", p.adminURL("/readyz"), "") // the admin side's store use is measured too
	r := do("GET", p.adminURL("/metrics"), "")
	if r.status != 200 {
		t.Fatalf("/metrics = %d", r.status)
	}
	for series, want := range map[string]string{
		`idemproxy_requests_total{outcome="committed",route="charges"}`:                 "1",
		`idemproxy_requests_total{outcome="replayed",route="charges"}`:                  "1",
		`idemproxy_requests_total{outcome="passthrough",route=""}`:                      "1",
		`idemproxy_requests_total{outcome="in_doubt",route="charges"}`:                  "0",
		`idemproxy_requests_in_flight{route="charges"}`:                                 "0",
		`idemproxy_config_last_reload_successful`:                                       "1",
		`idemproxy_upstream_request_duration_seconds_count{code="201",route="charges"}`: "1",
	} {
		if got, ok := metricValue(r.body, series); !ok || got != want {
			t.Errorf("%s = %q (found %v), want %s", series, got, ok, want)
		}
	}
	for _, prefix := range []string{"idemproxy_build_info{", "go_goroutines ", "process_resident_memory_bytes ",
		"idemproxy_badger_lsm_size_bytes ", `idemproxy_store_operation_duration_seconds_count{operation="reserve",store="badger"}`,
		`idemproxy_store_operation_duration_seconds_count{operation="ping",store="badger"}`} {
		if !strings.Contains(r.body, "\n"+prefix) {
			t.Errorf("/metrics has no %s series", prefix)
		}
	}
	if strings.Contains(r.body, "ORD-M1") {
		t.Errorf("a key appears in the metrics")
	}
}

// TestReload: SIGHUP and POST /-/reload apply a good file; a bad file keeps
// the running configuration and is reported.
func TestReload(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	data := filepath.Join(dir, "data")
	writeConfig(t, path, up.URL, data, "", chargesRoute)
	const token = "reload-token-for-the-test"
	p := startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)
	auth := []string{"Authorization", "Bearer " + token}
	if r := do("POST", p.adminURL("/-/reload"), ""); r.status != 401 || problemType(r) != "unauthorized" {
		t.Errorf("reload without the token = %d %q, want 401 unauthorized", r.status, r.body)
	}
	reloadGauge := func() string {
		v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "idemproxy_config_last_reload_successful")
		return v
	}

	// A good file with a second route, by SIGHUP.
	writeConfig(t, path, up.URL, data, "", chargesRoute+`
  - name: order-charges
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
`)
	p.signal(syscall.SIGHUP)
	eventually(t, "the new route is served", func() bool {
		return problemType(do("POST", p.url("/orders/O-1/charges"), `{"amount": 1}`)) == "missing-key"
	})

	// A bad file, by POST: 400, the running configuration stays.
	os.WriteFile(path, []byte("listen: [\n"), 0o600)
	r := do("POST", p.adminURL("/-/reload"), "", auth...)
	if r.status != 400 || problemType(r) != "reload-failed" || !strings.Contains(r.body, "running configuration is kept") {
		t.Errorf("bad reload = %d %q, want 400 reload-failed and the running configuration kept", r.status, r.body)
	}
	if got := reloadGauge(); got != "0" {
		t.Errorf("reload_successful after a bad reload = %s, want 0", got)
	}
	if r := do("POST", p.url("/orders/O-1/charges"), `{"amount": 1}`); problemType(r) != "missing-key" {
		t.Errorf("after a bad reload the route is gone: %d %s", r.status, r.body)
	}
	// A file that changes what needs a restart is refused too.
	writeConfig(t, path, up.URL, filepath.Join(dir, "other-data"), "", chargesRoute)
	if r := do("POST", p.adminURL("/-/reload"), "", auth...); r.status != 400 || !strings.Contains(r.body, "store") {
		t.Errorf("store change = %d %q, want 400 naming the store", r.status, r.body)
	}
	// Back to a good file, by POST.
	writeConfig(t, path, up.URL, data, "", chargesRoute)
	if r := do("POST", p.adminURL("/-/reload"), "", auth...); r.status != 200 {
		t.Errorf("good reload = %d %s", r.status, r.body)
	}
	if got := reloadGauge(); got != "1" {
		t.Errorf("reload_successful = %s, want 1", got)
	}
	if r := do("POST", p.url("/orders/O-1/charges"), `{"amount": 1}`); r.status != 201 {
		t.Errorf("removed route still protected: %d %s", r.status, r.body)
	}
	if l := p.log.logLines("configuration reload failed; the running configuration is kept"); len(l) != 2 {
		t.Errorf("failed reloads logged %d times, want 2", len(l))
	}
	// order-charges never stored a key, so removing it is no keyspace's
	// loss: no keyspace is held.
	if l := p.log.logLines("keyspace held: its keys would be made anew while the store holds live keys made before; the route answers 503 keyspace-held until an operator decides"); len(l) != 0 {
		t.Errorf("removing a route without keys held a keyspace: %v", l)
	}
}

// TestAdminReleaseAfterIncident is the article's reprocessing after an
// incident: a key in doubt is inspected and released by an operator, and
// the order can then be charged.
func TestAdminReleaseAfterIncident(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := charge(p, "ORD-I1", "X-Stub-Fault", "fail-before-charge"); r.status != 500 {
		t.Fatalf("failed charge = %d", r.status)
	}
	// The upstream said 500; under reserve-then-commit the retry replays it.
	if r := charge(p, "ORD-I1"); r.status != 500 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %s, want the stored 500", r.status, r.body)
	}
	key := p.adminURL("/v1/keys/charges/ORD-I1")
	if r := do("GET", key, ""); r.status != 401 {
		t.Errorf("no token = %d, want 401", r.status)
	}
	if r := do("GET", key, "", "Authorization", "Bearer wrong"); r.status != 401 {
		t.Errorf("wrong token = %d, want 401", r.status)
	}
	r := do("GET", key, "", "Authorization", "Bearer s3cret")
	if r.status != 200 || !strings.Contains(r.body, `"state": "completed"`) || !strings.Contains(r.body, `"stored_status": 500`) {
		t.Errorf("inspect = %d %s", r.status, r.body)
	}
	r = do("DELETE", key+"?reason=INC-42", "", "Authorization", "Bearer s3cret", "X-Operator", "alice")
	if r.status != 200 || !strings.Contains(r.body, `"released": true`) {
		t.Errorf("release = %d %s", r.status, r.body)
	}
	if r := charge(p, "ORD-I1"); r.status != 201 {
		t.Errorf("charge after release = %d %s, want 201", r.status, r.body)
	}
	if got := chargeCount(t, up.URL, "ORD-I1"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	l := p.log.logLines("key released by an operator")
	if len(l) != 1 || l[0]["operator"] != "alice" || l[0]["reason"] != "INC-42" || l[0]["previous_state"] != "completed" {
		t.Errorf("audit log = %v", l)
	}
	if strings.Contains(p.log.String(), "ORD-I1") {
		t.Errorf("the raw key appears in the log")
	}
}

// TestAdminKeyAPIDisabledWithoutToken: no token, no key API; never open.
func TestAdminKeyAPIDisabledWithoutToken(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN=")
	for _, m := range []string{"GET", "DELETE"} {
		r := do(m, p.adminURL("/v1/keys/charges/X"), "", "Authorization", "Bearer ")
		if r.status != 403 || problemType(r) != "admin-api-disabled" || !strings.Contains(r.body, "IDEMPROXY_ADMIN_TOKEN") {
			t.Errorf("%s without a configured token = %d %s, want 403 admin-api-disabled naming IDEMPROXY_ADMIN_TOKEN", m, r.status, r.body)
		}
	}
}

// TestRedisTLSCAFile: a CA bundle without a certificate is refused when the
// store opens, naming the field.
func TestRedisTLSCAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, []byte("not a certificate"), 0o600)
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), "http://127.0.0.1:9", "unused", "", chargesRoute)
	b, _ := os.ReadFile(cfg)
	y := strings.Replace(string(b), "  badger:\n    dir: unused\n",
		"  redis:\n    addrs: [127.0.0.1:1]\n    tls: true\n    tls_ca_file: "+ca+"\n", 1)
	os.WriteFile(cfg, []byte(y), 0o600)
	var out strings.Builder
	code := cli.Run(t.Context(), []string{"-config", cfg}, &out, &out, func(string) string { return "" })
	if code != 1 || !strings.Contains(out.String(), "tls_ca_file: no PEM certificate") {
		t.Errorf("exit %d, output %q; want 1 naming tls_ca_file", code, out.String())
	}
}

// TestREADMEListsEveryProblem keeps the table of problem types in
// docs/http-api.md in step with the problems the proxy can answer with.
func TestREADMEListsEveryProblem(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(httpAPIDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range proxy.Problems() {
		row := fmt.Sprintf("| %d | `%s` |", p.Status, p.Name)
		if !strings.Contains(string(b), row) {
			t.Errorf("docs/http-api.md's problem table has no row %q", row)
		}
	}
}

// TestREADMEListsEveryAdminProblem keeps the table of docs/http-api.md's Admin API section of
// problems in step with those the admin API can answer with: a row for
// each, and none for a problem it does not have.
func TestREADMEListsEveryAdminProblem(t *testing.T) {
	t.Parallel()
	section := doctest.Section(t, httpAPIDoc, "## Admin API")
	want := map[string]bool{}
	for _, p := range admin.Problems() {
		row := fmt.Sprintf("| %d | `%s` |", p.Status, p.Name)
		want[row] = true
		if !strings.Contains(section, row) {
			t.Errorf("the Admin API section's problem table has no row %q", row)
		}
	}
	for _, row := range regexp.MustCompile("(?m)^\\| [0-9]{3} \\| `[a-z-]+` \\|").FindAllString(section, -1) {
		if !want[row] {
			t.Errorf("the Admin API section's problem table has a row %q for a problem the admin API does not answer with", row)
		}
	}
}
