package postgres_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestQueryExecModes runs the conformance suites with the DSN's
// default_query_exec_mode set to the modes that work without prepared
// statements: exec, which the package documentation asks for behind
// PgBouncer in transaction pooling mode, and simple_protocol, which
// PgBouncer guides often give. In them pgx does not learn the parameters'
// types from the server and sends each as its Go type's text, so a value
// that is right only in binary (a []byte for a jsonb column) stores
// something else, or fails.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			opts := func() postgres.Options {
				return postgres.Options{DSN: srv.DSN() + "&default_query_exec_mode=" + mode}
			}
			t.Run("store", func(t *testing.T) {
				storetest.Run(t, func(t *testing.T) store.Store { return newStore(t, srv, opts()) })
			})
			t.Run("reconcile", func(t *testing.T) {
				storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore { return newStore(t, srv, opts()) })
			})
		})
	}
}
