package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

var tables atomic.Int64

// newStore returns a Store on srv, on a table of its own unless opts names
// one, closed when the test ends.
func newStore(t *testing.T, srv *pgtest.Server, opts postgres.Options) *postgres.Store {
	t.Helper()
	if opts.DSN == "" {
		opts.DSN = srv.DSN()
	}
	if opts.Table == "" {
		opts.Table = fmt.Sprintf("keys_%d", tables.Add(1))
	}
	if opts.StatementTimeout == 0 {
		// Generous: the suites run their cases in parallel, under the race
		// detector, with 1 MiB bodies, on machines busy with other tests.
		// The tests of the timeouts set their own.
		opts.StatementTimeout = 10 * time.Second
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, opts)
	if err != nil {
		t.Fatalf("New(table %q): %v", opts.Table, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestConformance(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, srv, postgres.Options{})
	})
}

func TestReconcileConformance(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
		return newStore(t, srv, postgres.Options{})
	})
}

// TestStoresShareOneTable runs the conformance suite with every case on its
// own Store but all on one table, as replicas are.
func TestStoresShareOneTable(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, srv, postgres.Options{Table: "shared", Schema: "idemproxy"})
	})
}
