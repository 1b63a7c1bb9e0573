package postgres_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestListConformance(t *testing.T) {
	srv := pgtest.Start(t)
	storetest.RunList(t, func(t *testing.T) storetest.ListStore {
		return newStore(t, srv, postgres.Options{})
	})
}

// TestListConformanceCollated runs the listing suite on tables whose key
// column has a collation List does not take for byte order: the walk
// cannot stop at the end of the prefix's keys, and goes on to the table's
// end, skipping other routes' keys.
func TestListConformanceCollated(t *testing.T) {
	srv := pgtest.Start(t)
	collation := strings.TrimSpace(srv.MustExec(`SELECT collname FROM pg_collation
		WHERE collname NOT IN ('C', 'POSIX', 'ucs_basic', 'default') AND collencoding IN (-1, 6) ORDER BY collname LIMIT 1`))
	if collation == "" {
		t.Fatal("the server has no collation other than C and POSIX")
	}
	t.Logf("key column collation %q", collation)
	var n atomic.Int64
	storetest.RunList(t, func(t *testing.T) storetest.ListStore {
		table := fmt.Sprintf("collated_%d", n.Add(1))
		ddl := strings.Replace(postgres.SchemaSQL("public", table), "key                text PRIMARY KEY",
			`key text COLLATE "`+collation+`" PRIMARY KEY`, 1)
		if !strings.Contains(ddl, "COLLATE") {
			t.Fatalf("the table's statement has changed: %s", ddl)
		}
		srv.MustExec(ddl)
		return newStore(t, srv, postgres.Options{Table: table})
	})
}
