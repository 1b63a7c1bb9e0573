package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// selector is one series selector of a PromQL expression:
// name{label="v", label=~"re", ...}.
type selector struct {
	text     string
	name     string
	matchers []matcher
}

type matcher struct {
	label, op, value string
}

var (
	selectorRE = regexp.MustCompile(`\b(idemproxy_[a-z0-9_]+)(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	sampleRE   = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+\S+$`)
)

// selectors finds the idemproxy series selectors in a PromQL expression (or
// in a dashboard's JSON: its quotes are escaped there).
func selectors(expr string) []selector {
	expr = strings.ReplaceAll(expr, `\"`, `"`)
	var out []selector
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		s := selector{text: m[0], name: m[1]}
		for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			s.matchers = append(s.matchers, matcher{lm[1], lm[2], lm[3]})
		}
		out = append(out, s)
	}
	return out
}

// matches reports whether a scraped series (its name and labels) is one
// the selector selects. Matchers on target labels (job, instance) are
// Prometheus', not the binary's, and Grafana variables match anything.
func (s selector) matches(name string, labels map[string]string) bool {
	// A histogram named without a suffix (in a panel's description) is
	// any of its series.
	if base, _ := strings.CutSuffix(name, "_count"); name != s.name && base != s.name {
		return false
	}
	for _, m := range s.matchers {
		if m.label == "job" || m.label == "instance" || strings.Contains(m.value, "$") {
			continue
		}
		v := labels[m.label]
		var ok bool
		switch m.op {
		case "=":
			ok = v == m.value
		case "!=":
			ok = v != m.value
		case "=~", "!~":
			ok = regexp.MustCompile("^(?:"+m.value+")$").MatchString(v) == (m.op == "=~")
		}
		if !ok {
			return false
		}
	}
	return true
}

// scrapedSeries parses a text-format scrape into series names and labels.
func scrapedSeries(t *testing.T, scrape string) []struct {
	name   string
	labels map[string]string
} {
	t.Helper()
	var out []struct {
		name   string
		labels map[string]string
	}
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unparsable scrape line %q", line)
		}
		labels := map[string]string{}
		for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			labels[lm[1]] = lm[3]
		}
		out = append(out, struct {
			name   string
			labels map[string]string
		}{m[1], labels})
	}
	return out
}

// TestHealthyProxyExportsEverySeriesTheAlertsAndDashboardUse: on a proxy
// that has served nothing yet, every series an alert rule or a dashboard
// panel selects exists (at zero), so that rate() and the alerts work from
// the start instead of seeing no data until the first error. The one
// exception is the upstream histogram, whose code label is only known
// once the upstream has answered. The PostgreSQL and Redis stores' own
// series are looked for on proxies that use them.
func TestHealthyProxyExportsEverySeriesTheAlertsAndDashboardUse(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	// One route of each kind the alerts and panels watch: enforcing,
	// reconciling, and observing.
	routes := chargesRoute + `
  - name: reconciled
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    reconcile: {lookup: "GET /orders/{key}/charge"}
  - name: observed
    match: POST /observed
    key: {json: orderId}
    mode: observe
`
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", routes))
	r := do("GET", p.adminURL("/metrics"), "")
	if r.status != 200 {
		t.Fatalf("/metrics = %d", r.status)
	}
	series := scrapedSeries(t, r.body)

	// The PostgreSQL store's own series are on a proxy that uses it.
	pg := pgtest.Start(t)
	pgCfg := writeConfig(t, filepath.Join(dir, "pg.yaml"), up.URL, "unused", "", chargesRoute)
	pgYAML, _ := os.ReadFile(pgCfg)
	pgYAML = []byte(strings.Replace(string(pgYAML), "  badger:\n    dir: unused\n", "  postgres:\n    dsn_env: IDEMPROXY_TEST_PG_DSN\n", 1))
	if err := os.WriteFile(pgCfg, pgYAML, 0o600); err != nil {
		t.Fatal(err)
	}
	pgProxy := startProxy(t, pgCfg, "IDEMPROXY_TEST_PG_DSN="+pg.DSN())
	pr := do("GET", pgProxy.adminURL("/metrics"), "")
	if pr.status != 200 {
		t.Fatalf("/metrics of the PostgreSQL proxy = %d", pr.status)
	}
	pgSeries := scrapedSeries(t, pr.body)

	// And the Redis store's on a proxy that uses Redis.
	rd := redistest.Start(t)
	rdProxy := startProxy(t, writeRedisConfig(t, filepath.Join(dir, "redis.yaml"), up.URL, []string{rd.Addr()}, chargesRoute))
	rr := do("GET", rdProxy.adminURL("/metrics"), "")
	if rr.status != 200 {
		t.Fatalf("/metrics of the Redis proxy = %d", rr.status)
	}
	redisSeries := scrapedSeries(t, rr.body)

	// The size gauges measure the data directory (Badger's own figures
	// are 0 with its metrics off); a new store already has its value log.
	var vlogFiles int64
	matches, _ := filepath.Glob(filepath.Join(dir, "data", "*.vlog"))
	for _, f := range matches {
		if fi, err := os.Stat(f); err == nil {
			vlogFiles += fi.Size()
		}
	}
	v, _ := metricValue(r.body, "idemproxy_badger_vlog_size_bytes")
	if got, err := strconv.ParseFloat(v, 64); err != nil || vlogFiles == 0 || got != float64(vlogFiles) {
		t.Errorf("idemproxy_badger_vlog_size_bytes = %s, want %d (the .vlog files)", v, vlogFiles)
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
			}
		}
	}
	b, err := os.ReadFile("deploy/prometheus/idemproxy-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	type use struct{ where, expr string }
	var uses []use
	for _, g := range rules.Groups {
		for _, rule := range g.Rules {
			uses = append(uses, use{"alert " + rule.Alert, rule.Expr})
		}
	}
	dash, err := os.ReadFile("deploy/grafana/idemproxy-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	uses = append(uses, use{"the dashboard", string(dash)})

	checked := 0
	for _, u := range uses {
		for _, s := range selectors(u.expr) {
			if strings.HasPrefix(s.name, "idemproxy_upstream_request_duration_seconds") {
				continue
			}
			scraped := series
			switch {
			case strings.HasPrefix(s.name, "idemproxy_postgres_"):
				scraped = pgSeries
			case strings.HasPrefix(s.name, "idemproxy_store_replica_wait_"):
				scraped = redisSeries
			}
			found := false
			for _, se := range scraped {
				if s.matches(se.name, se.labels) {
					found = true
					break
				}
			}
			checked++
			if !found {
				t.Errorf("%s selects %s: no such series on a healthy proxy", u.where, s.text)
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked only %d selectors: the parsing of the rules or the dashboard broke", checked)
	}
}
