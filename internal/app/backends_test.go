package app

import (
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestOpenPostgres opens the store of a store.postgres section with the DSN
// from the named variable: it answers Ping, is the PostgreSQL store (which
// reconciles), and its pool's metrics are exported. Without the variable
// it fails, naming the field.
func TestOpenPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	t.Setenv("IDEMPROXY_TEST_PG_DSN", srv.DSN())
	cfg, err := config.Parse([]byte(`listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes: [{name: charges, match: POST /charges, key: {json: orderId}}]
store: {postgres: {dsn_env: IDEMPROXY_TEST_PG_DSN, max_conns: 3, table: wired}}
`))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"IDEMPROXY_TEST_PG_DSN": srv.DSN()}
	a := &app{log: slog.New(slog.DiscardHandler), cfg: cfg, getenv: func(k string) string { return env[k] }}
	reg := prometheus.NewRegistry()
	st, name, err := a.openStore(reg)
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	defer st.Close()
	if name != "postgres" {
		t.Errorf("store name = %q; want postgres", name)
	}
	if _, ok := st.(*postgres.Store); !ok {
		t.Errorf("store = %T; want *postgres.Store", st)
	}
	if err := st.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if got := srv.MustExec(`SELECT count(*) FROM wired_schema`); got != "1" {
		t.Errorf("the configured table's version rows = %s; want 1", got)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var max float64 = -1
	for _, f := range families {
		if f.GetName() == "idemproxy_postgres_pool_max_conns" {
			max = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if max != 3 {
		t.Errorf("idemproxy_postgres_pool_max_conns = %v; want 3 (store.postgres.max_conns)", max)
	}

	delete(env, "IDEMPROXY_TEST_PG_DSN")
	if _, _, err := a.openStore(prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "store.postgres.dsn_env") {
		t.Errorf("openStore without the DSN variable = %v; want an error naming store.postgres.dsn_env", err)
	}
}

// TestBackendsAreDeclaredEverywhere: every store backend of the registry
// is a kind of store in config and every kind of config has a backend, and
// each is documented where an operator looks for it. A new backend that
// lacks one of these fails here, saying what to add.
func TestBackendsAreDeclaredEverywhere(t *testing.T) {
	var kinds []string
	for _, b := range backends {
		kinds = append(kinds, b.kind)
	}
	if got := config.StoreKinds(); !slices.Equal(kinds, got) {
		t.Errorf("the backends of internal/app/backends.go are %q, config's kinds of store are %q: "+
			"each backend needs its section in config.Store and its line in config's storeKinds (config/stores.go), in the same order", kinds, got)
	}

	reference := doctest.Section(t, configurationDoc, "## Reference")
	storeLine := regexp.MustCompile(`(?m)^store:.*$`).FindString(reference)
	everyField := doctest.Section(t, configurationDoc, "## Every field")
	opsRow := ""
	for _, line := range strings.Split(doctest.Section(t, operationsDoc, "## Metrics"), "\n") {
		if strings.HasPrefix(line, "| `idemproxy_store_operation_duration_seconds`") {
			opsRow = line
		}
	}
	startLine := doctest.Section(t, operationsDoc, "## Reload and shutdown")

	for _, b := range backends {
		t.Run(b.kind, func(t *testing.T) {
			if b.open == nil || b.startAttrs == nil {
				t.Fatalf("the backend %s has no open or no startAttrs", b.kind)
			}
			st, ok := storeSelecting(b.kind)
			if !ok {
				t.Fatalf("config.Store has no section %q: add it (a pointer to its struct, yaml:%q)", b.kind, b.kind)
			}
			if got := st.Kind(); got != b.kind {
				t.Errorf("a store with only its section %s set selects %q", b.kind, got)
			}

			// The first log line: store=kind, then attributes named for it;
			// the first says where the store is and is documented.
			attrs := storeAttrs(st, func(string) string { return "" })
			if len(attrs) < 4 || attrs[0] != "store" || attrs[1] != b.kind {
				t.Fatalf("storeAttrs = %v; want store=%s and where it is", attrs, b.kind)
			}
			for i := 2; i < len(attrs); i += 2 {
				if k, _ := attrs[i].(string); !strings.HasPrefix(k, b.kind) {
					t.Errorf("start log attribute %v is not named for its store %s", attrs[i], b.kind)
				}
			}
			if where := attrs[2].(string); !strings.Contains(startLine, "`"+where+"`") {
				t.Errorf("%s, \"## Reload and shutdown\": the first log line's description does not name %s's attribute `%s`", operationsDoc, b.kind, where)
			}

			// Its configuration: the reference names it, the table lists its fields.
			if !regexp.MustCompile(`\b` + b.kind + `\b`).MatchString(storeLine) {
				t.Errorf("%s, \"## Reference\": the store line %q does not name %s", configurationDoc, storeLine, b.kind)
			}
			if !strings.Contains(everyField, "| `store."+b.kind+".") {
				t.Errorf("%s, \"## Every field\": no row for a field of store.%s", configurationDoc, b.kind)
			}
			// Its metrics: the store label's value, and its own metrics.
			if !strings.Contains(opsRow, "`"+b.kind+"`") {
				t.Errorf("%s, \"## Metrics\": the row of idemproxy_store_operation_duration_seconds does not list the store %s", operationsDoc, b.kind)
			}
			if b.metrics == nil {
				return
			}
			rec := &metricLabels{Registerer: prometheus.NewRegistry(), labels: map[string][]string{}}
			b.metrics(rec, nil)
			for name := range rec.labels {
				if !strings.HasPrefix(name, "idemproxy_") {
					t.Errorf("the %s store registers %s, not named idemproxy_*", b.kind, name)
				}
			}
			// Registered without a store (as for the docs), they read as zero.
			if _, err := rec.Registerer.(*prometheus.Registry).Gather(); err != nil {
				t.Errorf("the %s store's metrics without a store: %v", b.kind, err)
			}
		})
	}
}

// storeSelecting returns a config.Store whose only section is the one
// named kind (zero-valued), false when config.Store has no such section.
func storeSelecting(kind string) (config.Store, bool) {
	var st config.Store
	v := reflect.ValueOf(&st).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name == kind && f.Type.Kind() == reflect.Pointer {
			v.Field(i).Set(reflect.New(f.Type.Elem()))
			return st, true
		}
	}
	return st, false
}
