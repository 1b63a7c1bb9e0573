package app

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/pgtest"
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
