package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestNewRefusesADatabaseItCannotWrite: a role that may only read the
// table, a database whose transactions are read-only, and a role that may
// not create the missing table each fail New with an error saying so.
func TestNewRefusesADatabaseItCannotWrite(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	newStore(t, srv, postgres.Options{Table: "readable"}) // creates it
	srv.MustExec(`CREATE ROLE reader LOGIN;
		GRANT SELECT ON readable, readable_schema TO reader;
		CREATE ROLE nobody LOGIN`)
	srv.MustExec(`CREATE DATABASE ro`)
	srv.MustExec(`ALTER DATABASE ro SET default_transaction_read_only = on`)
	tests := []struct {
		name, dsn, table string
		want             []string
	}{
		{"select only", srv.DSNAs("reader", "", "postgres"), "readable",
			[]string{"refuses writes", "permission denied", "INSERT, UPDATE and DELETE"}},
		{"read-only database", srv.DSNAs(pgtest.User, "", "ro"), "keys",
			[]string{"create", "read-only transaction", "privileges"}},
		{"no create privilege", srv.DSNAs("nobody", "", "postgres"), "missing",
			[]string{"create", "permission denied for schema public", "privileges"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := postgres.New(ctx, postgres.Options{DSN: tc.dsn, Table: tc.table})
			if err == nil {
				s.Close()
				t.Fatal("New = nil error; want the database refused")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New error %q does not say %q", err, w)
				}
			}
		})
	}
	// Written to with an existing table, the read-only database fails the
	// write probe rather than the creation.
	srv.MustExec(`ALTER DATABASE ro SET default_transaction_read_only = off`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, postgres.Options{DSN: srv.DSNAs(pgtest.User, "", "ro"), Table: "keys"})
	if err != nil {
		t.Fatalf("New on the writable database: %v", err)
	}
	s.Close()
	srv.MustExec(`ALTER DATABASE ro SET default_transaction_read_only = on`)
	_, err = postgres.New(ctx, postgres.Options{DSN: srv.DSNAs(pgtest.User, "", "ro"), Table: "keys"})
	if err == nil || !strings.Contains(err.Error(), "refuses writes") || !strings.Contains(err.Error(), "read-only transaction") {
		t.Errorf("New on a read-only database with the table = %v; want a refused-writes error", err)
	}
}

// TestSchemaByAnAdministrator: with the table created from SchemaSQL by an
// owner, a role that has only the documented privileges (USAGE on the
// schema; SELECT, INSERT, UPDATE and DELETE on the tables) runs the store.
func TestSchemaByAnAdministrator(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.MustExec(`CREATE SCHEMA idem`)
	srv.MustExec(postgres.SchemaSQL("idem", "keys"))
	srv.MustExec(`CREATE ROLE proxy LOGIN;
		GRANT USAGE ON SCHEMA idem TO proxy;
		GRANT SELECT, INSERT, UPDATE, DELETE ON idem.keys, idem.keys_schema TO proxy`)
	s := newStore(t, srv, postgres.Options{DSN: srv.DSNAs("proxy", "", "postgres"), Schema: "idem", Table: "keys"})
	c := ctx(t)
	if rec, err := s.Reserve(c, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve as the proxy's role = %+v, %v; want nil, nil", rec, err)
	}
	if err := s.Commit(c, "r/-/k", "t", store.Response{Status: 200, BodyStored: true}, time.Hour); err != nil {
		t.Errorf("Commit as the proxy's role: %v", err)
	}
	if _, err := s.Sweep(c); err != nil {
		t.Errorf("Sweep as the proxy's role: %v", err)
	}
}

// TestSchemaIsCreatedOnceAndVersioned: New creates the schema, table and
// version; a second New on it changes nothing and keeps the records; a
// version newer than the binary's is refused.
func TestSchemaIsCreatedOnceAndVersioned(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	opts := postgres.Options{Schema: "idem", Table: "keys"}
	s := newStore(t, srv, opts)
	c := ctx(t)
	if rec, err := s.Reserve(c, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v", rec, err)
	}
	if got := srv.MustExec(`SELECT version FROM idem.keys_schema`); got != "1" {
		t.Errorf("schema version = %q; want 1", got)
	}
	wantIndexes := "keys_expires_at\nkeys_next_lookup\nkeys_pkey\nkeys_unscheduled"
	if got := srv.MustExec(`SELECT indexname FROM pg_indexes WHERE schemaname = 'idem' AND tablename = 'keys' ORDER BY 1`); got != wantIndexes {
		t.Errorf("indexes = %q; want %q", got, wantIndexes)
	}
	again := newStore(t, srv, opts)
	if rec, err := again.Get(c, "r/-/k"); err != nil || rec == nil {
		t.Errorf("Get through a second Store = %+v, %v; want the record", rec, err)
	}
	srv.MustExec(`UPDATE idem.keys_schema SET version = 2`)
	_, err := postgres.New(c, postgres.Options{DSN: srv.DSN(), Schema: "idem", Table: "keys"})
	if err == nil || !strings.Contains(err.Error(), "schema version 2, newer") {
		t.Errorf("New on a newer schema = %v; want it refused", err)
	}
}

// TestReplicasShareDueLookups: two Stores on one table, as two replicas.
// Polling at once they list disjoint sets of the due keys, every due key
// listed by one of them, and a third replica then finds none; of their
// claims of one key exactly one wins.
func TestReplicasShareDueLookups(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	a := newStore(t, srv, postgres.Options{Table: "shared"})
	b := newStore(t, srv, postgres.Options{Table: "shared"})
	c := ctx(t)
	const n = 40
	for i := range n {
		key := "r/-/" + string(rune('A'+i))
		if rec, err := a.Reserve(c, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
			t.Fatalf("Reserve = %+v, %v", rec, err)
		}
		if err := a.MarkInDoubt(c, key, "t", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := a.ScheduleLookup(c, key, 0); err != nil {
			t.Fatal(err)
		}
	}
	type listing struct {
		keys []string
		err  error
	}
	start := make(chan struct{})
	results := make(chan listing, 2)
	for _, s := range []*postgres.Store{a, b} {
		go func() {
			<-start
			keys, err := s.DueLookups(c, n/2)
			results <- listing{keys, err}
		}()
	}
	close(start)
	seen := map[string]int{}
	for range 2 {
		l := <-results
		if l.err != nil {
			t.Fatalf("DueLookups: %v", l.err)
		}
		for _, k := range l.keys {
			seen[k]++
		}
	}
	if len(seen) != n {
		t.Errorf("the two replicas listed %d distinct keys; want all %d", len(seen), n)
	}
	for k, times := range seen {
		if times != 1 {
			t.Errorf("key %s listed %d times; want once over both replicas", k, times)
		}
	}
	// Listed by one, the keys are not listed by a third replica...
	third := newStore(t, srv, postgres.Options{Table: "shared"})
	if keys, err := third.DueLookups(c, n); err != nil || len(keys) != 0 {
		t.Errorf("DueLookups of a third replica after both took their share = %q, %v; want none", keys, err)
	}
	// ...and whichever replica tries, one claim of a key wins.
	var wins int
	errs := make(chan error, 2)
	for i, s := range []*postgres.Store{a, b} {
		go func() { errs <- s.ClaimLookup(c, "r/-/A", "look-"+string(rune('0'+i)), time.Minute, false) }()
	}
	for range 2 {
		switch err := <-errs; err {
		case nil:
			wins++
		case store.ErrLookupBusy:
		default:
			t.Errorf("ClaimLookup = %v; want nil or ErrLookupBusy", err)
		}
	}
	if wins != 1 {
		t.Errorf("%d claims of one key won; want exactly 1", wins)
	}
}
