package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestNewRefusesATableItCannotReserveIn: a table already there under the
// configured name that the store cannot take reservations in (someone
// else's table, or the store's own layout without its primary key, as a
// hand-made or migrated copy may be) fails New with an error naming the
// table; it must not start, report ready and answer every request 503.
func TestNewRefusesATableItCannotReserveIn(t *testing.T) {
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
