package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestNewRefusesATableItCannotReserveIn: a table already there under the
// configured name that the store cannot take reservations in (someone
// else's table, or the store's own layout without its primary key, as a
// hand-made or migrated copy may be) fails New with an error naming the
// table; it must not start, report ready and answer every request 503.
func TestNewRefusesATableItCannotReserveIn(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	tests := []struct {
		name, table, sql string
	}{
		{"someone else's table", "theirs", `CREATE TABLE theirs (id serial PRIMARY KEY, name text)`},
		{"no primary key", "nokey", postgres.SchemaSQL("public", "nokey") + `ALTER TABLE nokey DROP CONSTRAINT nokey_pkey`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv.MustExec(tc.sql)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := postgres.New(ctx, postgres.Options{DSN: srv.DSN(), Table: tc.table})
			if err == nil {
				_, rerr := s.Reserve(ctx, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
				s.Close()
				t.Fatalf("New = nil error (and then Reserve = %v); want the table refused at start", rerr)

			}
			if want := fmt.Sprintf("%q", tc.table); !strings.Contains(err.Error(), want) {
				t.Errorf("New error %q does not name the table %s", err, want)
			}
		})
	}
}

// TestKeysCompareAsBytes: in a database whose default collation is a
// linguistic one (ICU's en-US here; glibc's en_US.UTF-8 alike), the key
// column and its indexes still compare bytes (COLLATE "C"). A linguistic
// order changes with the ICU or glibc version (glibc 2.28 reordered '-'
// and '/', which every key holds); an index built under the old order
// then misses keys it holds, INSERT ... ON CONFLICT no longer sees the
// reservation, and the retry is reserved and charged a second time.
func TestKeysCompareAsBytes(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.MustExec(`CREATE DATABASE icu TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'`)
	newStore(t, srv, postgres.Options{DSN: srv.DSNAs(pgtest.User, "", "icu"), Table: "keys"})
	conn, err := pgx.Connect(ctx(t), srv.DSNAs(pgtest.User, "", "icu"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var got string
	err = conn.QueryRow(ctx(t), `SELECT string_agg(i.indexrelid::regclass || ' ' || c.collname, ', ' ORDER BY 1)
		FROM pg_index i JOIN pg_collation c ON c.oid = i.indcollation[0]
		WHERE i.indrelid = 'keys'::regclass
			AND i.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = 'keys'::regclass AND attname = 'key')`).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	if want := "keys_pkey C, keys_unscheduled C"; got != want {
		t.Errorf("collations of the indexes on key = %q; want %q", got, want)
	}
}
