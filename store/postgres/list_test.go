package postgres_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestListConformance(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestListForgedCursor: a cursor in the store's own form whose key is not
// one a listing of its prefix could end on (a NUL byte, which a text
// column cannot hold; a key of another route) is a bad cursor, not a
// failing store (503) nor a listing that silently ends or starts over
// among other routes' keys.
func TestListForgedCursor(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{})
	ctx := context.Background()
	for _, k := range []string{"r/-/a", "r/-/b", "s/-/a"} {
		if _, err := s.Reserve(ctx, k, store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	for _, last := range []string{"r/-/a\u0000", "s/-/a", "", "r/"} {
		b, _ := json.Marshal(map[string]string{"p": "r/", "k": last})
		q := store.ListQuery{Prefix: "r/", Limit: 10, Cursor: "p1." + base64.RawURLEncoding.EncodeToString(b)}
		if recs, next, err := s.List(ctx, q); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("List with a cursor after %q = %d records, next %q, %v; want ErrBadCursor", last, len(recs), next, err)
		}
	}
}
