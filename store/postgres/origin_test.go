package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// previousSchema is the table as the release before origins created it
// (its SchemaSQL("public", "prev")), and rows as its statements wrote
// them: in flight, in flight with a lapsed lease, in doubt, completed.
const previousSchema = `CREATE TABLE IF NOT EXISTS "public"."prev" (
	key                text COLLATE "C" PRIMARY KEY,
	state              text NOT NULL CHECK (state IN ('in_flight', 'completed', 'in_doubt')),
	token              text NOT NULL,
	fingerprint        text NOT NULL,
	created_at         timestamptz NOT NULL,
	lease_expires_at   timestamptz,
	expires_at         timestamptz NOT NULL,
	response           jsonb,
	body               bytea,
	next_lookup        timestamptz,
	lookup_token       text,
	lookup_lease_until timestamptz,
	listed_by          text,
	listed_until       timestamptz
);
CREATE INDEX IF NOT EXISTS "prev_expires_at" ON "public"."prev" (expires_at);
CREATE INDEX IF NOT EXISTS "prev_next_lookup" ON "public"."prev" (next_lookup) WHERE next_lookup IS NOT NULL;
CREATE INDEX IF NOT EXISTS "prev_unscheduled" ON "public"."prev" (key) WHERE next_lookup IS NULL AND state IN ('in_flight', 'in_doubt');
CREATE TABLE IF NOT EXISTS "public"."prev_schema" (id int PRIMARY KEY CHECK (id = 1), version int NOT NULL);
INSERT INTO "public"."prev_schema" (id, version) VALUES (1, 1) ON CONFLICT (id) DO NOTHING;
INSERT INTO "public"."prev" (key, state, token, fingerprint, created_at, lease_expires_at, expires_at) VALUES
	('charges/-/ORD-INFLIGHT', 'in_flight', 'tok-inflight', 'fp', now(), now() + interval '1 hour', now() + interval '1 day'),
	('charges/-/ORD-LAPSED', 'in_flight', 'tok-lapsed', 'fp', now() - interval '2 minutes', now() - interval '1 minute', now() + interval '1 day'),
	('charges/-/ORD-MARK', 'in_flight', 'tok-mark', 'fp', now(), now() + interval '1 hour', now() + interval '1 day');
INSERT INTO "public"."prev" (key, state, token, fingerprint, created_at, expires_at, response, body) VALUES
	('charges/-/ORD-DONE', 'completed', 'tok-done', 'fp', now(), now() + interval '1 day', '{"status":201,"body_stored":true}', '{"id":1}');
`

// TestTableOfThePreviousRelease: on a table the release before origins
// created and wrote, replicas starting at once add the origin column (one
// ALTER TABLE takes, the others find it), read the earlier rows without
// origin, and keep the origins of their own reservations.
func TestTableOfThePreviousRelease(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.MustExec(previousSchema)
	const replicas = 3
	stores := make([]*postgres.Store, replicas)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() { stores[i] = newStore(t, srv, postgres.Options{Table: "prev"}) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if got := srv.MustExec(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'prev'::regclass AND attname = 'origin'`); got != "text" {
		t.Errorf("the column origin after the start is %q, want text", got)
	}
	if got := srv.MustExec(`SELECT version FROM prev_schema`); got != "1" {
		t.Errorf("schema version = %q, want 1 (the earlier release must still start on it)", got)
	}
	s, c := stores[0], ctx(t)
	wantNone := func(what, key string, want store.State) {
		t.Helper()
		storetest.WantNoOrigin(t, c, s, what, key, want)
	}
	wantNone("read", "charges/-/ORD-INFLIGHT", store.StateInFlight)
	wantNone("read", "charges/-/ORD-LAPSED", store.StateInDoubt)
	wantNone("read", "charges/-/ORD-DONE", store.StateCompleted)
	if err := s.Commit(c, "charges/-/ORD-INFLIGHT", "tok-inflight", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantNone("committed", "charges/-/ORD-INFLIGHT", store.StateCompleted)
	if err := s.MarkInDoubt(c, "charges/-/ORD-MARK", "tok-mark", time.Hour); err != nil {
		t.Fatal(err)
	}
	wantNone("marked in doubt", "charges/-/ORD-MARK", store.StateInDoubt)
	if err := s.ClaimLookup(c, "charges/-/ORD-LAPSED", "look", time.Minute, true); err != nil {
		t.Fatal(err)
	}
	applied := store.Response{Status: 201, BodyStored: true, Reconciled: true}
	if err := s.ResolveLookup(c, "charges/-/ORD-LAPSED", "look", store.LookupResult{Applied: &applied}); err != nil {
		t.Fatal(err)
	}
	wantNone("reconciled", "charges/-/ORD-LAPSED", store.StateCompleted)

	// A new reservation keeps its origin, seen by every replica.
	res := store.Reservation{Token: "tok-new", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Origin: storetest.Origin}
	if rec, err := stores[1].Reserve(c, "charges/-/ORD-NEW", res); err != nil || rec != nil {
		t.Fatalf("Reserve(ORD-NEW) = %+v, %v; want reserved", rec, err)
	}
	for i, r := range stores {
		if rec, err := r.Get(c, "charges/-/ORD-NEW"); err != nil || rec == nil || rec.Origin != storetest.Origin {
			t.Errorf("replica %d: Get(ORD-NEW) = %+v, %v; want origin %q", i, rec, err, storetest.Origin)
		}
	}
	// Stored as NULL when empty: a row without origin costs nothing more.
	if rec, err := s.Reserve(c, "charges/-/ORD-NONE", store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("Reserve(ORD-NONE) = %+v, %v; want reserved", rec, err)
	}
	if got := srv.MustExec(`SELECT count(*) FROM prev WHERE origin IS NULL`); got != "5" {
		t.Errorf("%s rows have a NULL origin, want 5 (the earlier release's four and one reserved without origin)", got)
	}
}

// TestOriginOfAKeyTheEarlierReleaseReservedAgain: a key whose record
// expired, reserved again by the release before origins (a replica not yet
// upgraded, or a rollback), does not keep the origin of the expired
// reservation: that release's statement leaves the column as it was, and
// a replay would link to another request's span.
func TestOriginOfAKeyTheEarlierReleaseReservedAgain(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.MustExec(previousSchema)
	s, c := newStore(t, srv, postgres.Options{Table: "prev"}), ctx(t)
	const key = "charges/-/ORD-AGAIN"
	res := store.Reservation{Token: "tok-first", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Origin: storetest.Origin}
	if rec, err := s.Reserve(c, key, res); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v; want reserved", rec, err)
	}
	srv.MustExec(`UPDATE prev SET expires_at = now() - interval '1 second' WHERE key = '` + key + `'`)
	// The earlier release's reserve statement, as it ran.
	srv.MustExec(`INSERT INTO "public"."prev" AS r (key, state, token, fingerprint, created_at, lease_expires_at, expires_at)
SELECT '` + key + `', 'in_flight', 'tok-earlier', 'fp', now(), now() + interval '1 hour', now() + interval '1 day'
ON CONFLICT (key) DO UPDATE SET
	state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
	created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
	expires_at = excluded.expires_at, response = NULL, body = NULL
WHERE r.expires_at <= now()`)
	rec, err := s.Get(c, key)
	if err != nil || rec == nil || rec.Token != "tok-earlier" {
		t.Fatalf("Get = %+v, %v; want the earlier release's reservation", rec, err)
	}
	if rec.Origin != "" {
		t.Errorf("Get: origin %q, want none (it was the expired reservation's)", rec.Origin)
	}
}

// TestTableOfThePreviousReleaseNotOwned: a table of the release before
// origins that an administrator created, which the proxy's role may not
// alter, fails New with the statement to run; once the owner ran it, New
// starts.
func TestTableOfThePreviousReleaseNotOwned(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	srv.MustExec(previousSchema)
	srv.MustExec(`CREATE ROLE proxy LOGIN;
		GRANT SELECT, INSERT, UPDATE, DELETE ON prev, prev_schema TO proxy`)
	opts := postgres.Options{DSN: srv.DSNAs("proxy", "", "postgres"), Table: "prev"}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(c, opts)
	if err == nil {
		s.Close()
		t.Fatal("New on a table it may not alter, without the origin column = nil error; want it refused")
	}
	for _, want := range []string{`ALTER TABLE "public"."prev" ADD COLUMN IF NOT EXISTS origin text`, "owner", "must be owner"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not say %q", err, want)
		}
	}
	srv.MustExec(`ALTER TABLE "public"."prev" ADD COLUMN IF NOT EXISTS origin text`)
	s = newStore(t, srv, opts)
	if rec, err := s.Get(ctx(t), "charges/-/ORD-DONE"); err != nil || rec == nil || rec.Origin != "" {
		t.Errorf("Get(ORD-DONE) = %+v, %v; want the record without origin", rec, err)
	}
}
