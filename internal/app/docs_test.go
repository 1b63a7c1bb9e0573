package app

import (
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/canary"
	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/prometheus/client_golang/prometheus"
)

// These tests keep the docs in step with what the program registers and
// what a reload applies; the tests of the built binary are in e2e/.

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// The pages the tests below keep in step with the code.
const (
	operationsDoc    = "docs/operations.md"
	configurationDoc = "docs/configuration.md"
)

// metricLabels records the name and variable labels of every metric
// registered through it.
type metricLabels struct {
	prometheus.Registerer
	labels map[string][]string
}

func (m *metricLabels) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if n := descRE.FindStringSubmatch(d.String()); n != nil {
			var ls []string
			if n[2] != "" {
				ls = strings.Split(n[2], ",")
			}
			m.labels[n[1]] = ls
		}
	}
	return m.Registerer.Register(c)
}

func (m *metricLabels) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := m.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics returns the name and variable labels of every metric
// the binary registers: the app's, the proxy's and every store backend's.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	rec := &metricLabels{Registerer: prometheus.NewRegistry(), labels: map[string][]string{}}
	(&app{}).registerMetrics(rec)
	proxy.NewMetrics(rec)
	st, err := badger.OpenGuarded(badger.Options{Dir: t.TempDir()}, badger.GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, b := range backends { // every store's own, by name: their values need the store
		if b.metrics != nil {
			b.metrics(rec, nil)
		}
	}
	admission.RegisterMetrics(rec, admission.NewLimiter(nil, 1, 0, nil))
	admission.RegisterAdminMetrics(rec, admission.NewAdminLimiter(nil, 1, 0))
	store.RegisterProbeMetrics(rec, store.NewWriteProbe(st, store.ProbeOptions{}))
	admin.NewHandler(admin.Options{Store: st, Registerer: rec})
	registerEpochMetrics(rec, epoch.New(epoch.Options{Store: st, Interval: time.Second}))
	registerStoreRisk(rec, nil)
	settle.RegisterMetrics(rec, nil)
	registerLossMetrics(rec, canary.New(canary.Options{Store: st, Interval: time.Second}), witness.New(witness.Options{Window: time.Minute}))
	return rec.labels
}

// TestREADMEMetricsTableListsEveryMetric: every idemproxy metric the binary
// registers has a row in the Metrics table of docs/operations.md that names each of its
// labels, and every row names a registered metric.
func TestREADMEMetricsTableListsEveryMetric(t *testing.T) {
	registered := registeredMetrics(t)

	rows := map[string]string{} // metric → its table row
	for _, line := range strings.Split(doctest.Section(t, operationsDoc, "## Metrics"), "\n") {
		if !strings.HasPrefix(line, "| `idemproxy_") {
			continue
		}
		cells := strings.Split(line, "|")
		for _, n := range regexp.MustCompile("`(idemproxy_[a-z0-9_]+)`").FindAllStringSubmatch(cells[1], -1) {
			rows[n[1]] = line
		}
	}
	for name, labels := range registered {
		if !strings.HasPrefix(name, "idemproxy_") {
			continue
		}
		row, ok := rows[name]
		if !ok {
			t.Errorf("the Metrics table of docs/operations.md has no row for %s", name)
			continue
		}
		for _, l := range labels {
			if !strings.Contains(row, "`"+l+"`") {
				t.Errorf("the Metrics table's row for %s does not name its label %s", name, l)
			}
		}
	}
	for name := range rows {
		if _, ok := registered[name]; !ok {
			t.Errorf("the Metrics table of docs/operations.md lists %s, which the binary does not register", name)
		}
	}
}

// TestREADMEMetricsTableListsEveryLabelValue: every value the outcome,
// would and result labels can take is in its metric's row.
func TestREADMEMetricsTableListsEveryLabelValue(t *testing.T) {
	sec := doctest.Section(t, operationsDoc, "## Metrics")
	row := func(metric string) string {
		for _, line := range strings.Split(sec, "\n") {
			if strings.HasPrefix(line, "| `"+metric+"`") {
				return line
			}
		}
		t.Fatalf("the Metrics table of docs/operations.md has no row for %s", metric)
		return ""
	}
	check := func(metric string, values []string) {
		r := row(metric)
		for _, v := range values {
			if !strings.Contains(r, "`"+v+"`") {
				t.Errorf("the Metrics table's row for %s does not list the value %q", metric, v)
			}
		}
	}
	labels := func(os []proxy.Outcome) (out []string) {
		for _, o := range os {
			out = append(out, string(o))
		}
		return out
	}
	check("idemproxy_requests_total", labels(proxy.Outcomes))
	check("idemproxy_observed_total", labels(proxy.Woulds))
	check("idemproxy_reconciliations_total", reconcile.Results)
}

// TestREADMEReloadNamesWhatARestartNeeds: each server setting,
// memory_limit and upstream_tls is named in the Reload paragraph of docs/configuration.md, among those a
// restart applies exactly when a reload that changes it is refused.
func TestREADMEReloadNamesWhatARestartNeeds(t *testing.T) {
	sec := strings.Join(strings.Fields(doctest.Section(t, configurationDoc, "## Reload")), " ")
	restart, applied, ok := strings.Cut(sec, "(a restart applies those)")
	if !ok {
		t.Fatal(`the Reload paragraph of docs/configuration.md no longer says "(a restart applies those)"`)
	}
	restart = restart[strings.LastIndex(restart, "changes"):]
	applied, _, _ = strings.Cut(applied, "are applied by a")
	base, err := config.Parse([]byte("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\n" +
		"routes: [{name: charges, match: POST /charges, key: {json: orderId}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	st := reflect.TypeFor[config.Server]()
	fields := []string{"memory_limit", "upstream_tls"}
	const notServer = 2
	for i := range st.NumField() {
		fields = append(fields, st.Field(i).Tag.Get("yaml"))
	}
	for i, name := range fields {
		changed := *base
		switch i {
		case 0:
			changed.MemoryLimit = 1 << 30
		case 1:
			changed.UpstreamTLS.ServerName = "pay.internal"
		default:
			f := reflect.ValueOf(&changed.Server).Elem().Field(i - notServer)
			f.SetInt(f.Int() + 1)
		}
		needs := needsRestart(base, &changed) != nil
		named := func(text string) bool {
			return strings.Contains(text, "`"+name+"`") || strings.Contains(text, "`server."+name+"`")
		}
		inRestart, inApplied := named(restart), named(applied)
		switch {
		case needs && !inRestart:
			t.Errorf("a reload that changes %s is refused, but docs/configuration.md's Reload paragraph does not list it among what a restart applies", name)
		case !needs && !inApplied:
			t.Errorf("a reload applies %s, but docs/configuration.md's Reload paragraph does not list it among what a reload applies", name)
		}
	}
}

// setField changes the field at path (a row of the table in
// docs/configuration.md: server.body_timeout, routes[].key.json) in v to
// another value of its type, allocating what is nil on the way.
func setField(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	name, rest, more := strings.Cut(path, ".")
	name, slice := strings.CutSuffix(name, "[]")
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	var f reflect.Value
	for i := range v.NumField() {
		if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ","); tag == name {
			f = v.Field(i)
		}
	}
	if !f.IsValid() {
		t.Fatalf("%s: no field %q", path, name)
	}
	if slice {
		f = f.Index(0)
	}
	if more {
		setField(t, f, rest)
		return
	}
	for f.Kind() == reflect.Pointer {
		if f.IsNil() {
			f.Set(reflect.New(f.Type().Elem()))
		}
		f = f.Elem()
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Bool:
		f.SetBool(!f.Bool())
	case reflect.Int, reflect.Int64:
		f.SetInt(f.Int() + 1)
	case reflect.Slice:
		f.Set(reflect.Append(f, reflect.Zero(f.Type().Elem())))
	default:
		t.Fatalf("%s: cannot change a %s", path, f.Kind())
	}
}

// TestConfigurationTableSaysWhatAReloadApplies: the column "applied by" of
// the table in docs/configuration.md says "restart" for exactly the fields
// whose change makes a reload refuse the file.
func TestConfigurationTableSaysWhatAReloadApplies(t *testing.T) {
	sec := doctest.Section(t, configurationDoc, "## Every field")
	const src = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\n" +
		"routes: [{name: charges, match: POST /charges, key: {json: orderId}}]\n"
	rows := 0
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		path := strings.Trim(strings.TrimSpace(cells[0]), "`")
		applied := strings.TrimSpace(cells[len(cells)-1])
		base, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		changed, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		setField(t, reflect.ValueOf(changed).Elem(), path)
		needs := needsRestart(base, changed) != nil
		switch says := strings.HasPrefix(applied, "restart"); {
		case needs && !says:
			t.Errorf("%s: a reload that changes %s is refused, but the table says %q", configurationDoc, path, applied)
		case !needs && says:
			t.Errorf("%s: a reload applies %s, but the table says %q", configurationDoc, path, applied)
		}
	}
	if rows == 0 {
		t.Fatalf("%s: no rows in the table of every field", configurationDoc)
	}
}

// TestDashboardAndAlertsNameExportedMetrics keeps the Grafana dashboard and
// the alert rules from drifting away from the metrics the binary exports.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	registered := registeredMetrics(t)
	exported := map[string]bool{}
	for n := range registered {
		exported[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			exported[n+suffix] = true
		}
	}
	files := []string{"deploy/grafana/idemproxy-dashboard.json", "deploy/prometheus/idemproxy-alerts.yaml"}
	used := regexp.MustCompile(`\bidemproxy_[a-z0-9_]+`)
	for _, f := range files {
		b, err := os.ReadFile(doctest.Path(t, f))
		if err != nil {
			t.Fatal(err)
		}
		names := used.FindAllString(string(b), -1)
		if len(names) == 0 {
			t.Errorf("%s names no idemproxy metric", f)
		}
		var unknown []string
		for _, n := range names {
			if !exported[n] {
				unknown = append(unknown, n)
			}
		}
		sort.Strings(unknown)
		if len(unknown) > 0 {
			t.Errorf("%s names metrics the binary does not export: %v", f, unknown)
		}
	}
	// And the other way: every exported idemproxy metric is on the dashboard.
	dash, _ := os.ReadFile(doctest.Path(t, files[0]))
	for n := range registered {
		if strings.HasPrefix(n, "idemproxy_") && !strings.Contains(string(dash), n) {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}
