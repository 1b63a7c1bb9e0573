package postgres

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// schemaVersion is the version of the table layout this binary writes and
// reads. A database at a newer version (written by a newer binary) is
// refused at start.
const schemaVersion = 1

// queries holds the statements, with the table's name filled in.
type queries struct {
	createTable, createIndexes, createVersion  []string
	versionTable                               string // quoted, schema-qualified
	reserve, get, commit, release, markInDoubt string
	// reserveEpoch is reserve that takes the key only while the epoch
	// marker's row (epoch.go) carries the ID $8.
	reserveEpoch string
	// batch is the statement of a batch (batch.go): reservations,
	// commits, releases and in-doubt marks of distinct keys, each kind
	// given as arrays.
	batch                                        string
	schedule, unschedule, claim, claimState      string
	resolveRelease, resolveApplied, resolveRetry string
	due, unscheduled, sweep                      string
}

// Every statement judges time by statement_timestamp(): the database's
// clock, never a proxy's, read once per statement, so that what a statement
// reads (is the lease over, has the record expired) and what it writes
// (created_at, the new lease) agree. now() would be the same in the
// autocommit statements used here, but not inside a transaction;
// clock_timestamp() changes while one statement runs. A statement that
// waited for a row lock judges by its start, which can only make it see as
// live a record that expired while it waited.
//
// "live" below: the row has not expired. An expired row counts as absent
// for every statement, swept or not. "doubt": the record is in doubt, marked
// so or in flight with a lapsed lease.
const (
	ts    = "statement_timestamp()"
	live  = "r.expires_at > " + ts
	doubt = "(r.state = 'in_doubt' OR (r.state = 'in_flight' AND r.lease_expires_at <= " + ts + "))"
	// us turns a bigint parameter of microseconds into an interval.
	us = " * interval '1 microsecond'"
	// cleared are the columns of the lookup schedule and lease, reset when
	// a record is settled or replaced.
	cleared = "next_lookup = NULL, lookup_token = NULL, lookup_lease_until = NULL, listed_by = NULL, listed_until = NULL"
)

func newQueries(schema, table string) queries {
	t := pgx.Identifier{schema, table}.Sanitize()
	ix := func(suffix string) string { return pgx.Identifier{table + suffix}.Sanitize() }
	vt := pgx.Identifier{schema, table + "_schema"}.Sanitize()
	r := strings.NewReplacer("{vepoch}", "(v.epoch = '' OR EXISTS (SELECT 1 FROM "+t+" AS e WHERE e.key = '"+epochKey+"' AND e.token = v.epoch))", "{epoch}", "EXISTS (SELECT 1 FROM "+t+" AS e WHERE e.key = '"+epochKey+"' AND e.token = $8)", "{t}", t, "{ts}", ts, "{live}", live, "{doubt}", doubt, "{us}", us, "{cleared}", cleared)
	q := func(s string) string { return r.Replace(s) }
	return queries{
		createTable: []string{q(`CREATE TABLE IF NOT EXISTS {t} (
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
	listed_until       timestamptz,
	origin             text
)`)},
		createIndexes: []string{
			q(`CREATE INDEX IF NOT EXISTS ` + ix("_expires_at") + ` ON {t} (expires_at)`),
			q(`CREATE INDEX IF NOT EXISTS ` + ix("_next_lookup") + ` ON {t} (next_lookup) WHERE next_lookup IS NOT NULL`),
			q(`CREATE INDEX IF NOT EXISTS ` + ix("_unscheduled") + ` ON {t} (key) WHERE next_lookup IS NULL AND state IN ('in_flight', 'in_doubt')`),
		},
		createVersion: []string{
			`CREATE TABLE IF NOT EXISTS ` + vt + ` (id int PRIMARY KEY CHECK (id = 1), version int NOT NULL)`,
			`INSERT INTO ` + vt + ` (id, version) VALUES (1, $1) ON CONFLICT (id) DO NOTHING`,
		},
		versionTable: vt,

		// $6 is the reservation's deadline (see clock.go), compared with
		// clock_timestamp(): the time the row is written, after any wait
		// for a lock, not when the statement started. $7 is its origin,
		// stored with the token it belongs to ("<origin> <token>",
		// decodeRecord), NULL when empty.
		reserve: q(`INSERT INTO {t} AS r (key, state, token, fingerprint, created_at, lease_expires_at, expires_at, origin)
SELECT $1, 'in_flight', $2, $3, {ts}, {ts} + $4::bigint{us}, {ts} + $5::bigint{us}, NULLIF($7::text, '') || ' ' || $2::text
WHERE clock_timestamp() <= $6::timestamptz
ON CONFLICT (key) DO UPDATE SET
	state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
	created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
	expires_at = excluded.expires_at, origin = excluded.origin, response = NULL, body = NULL, {cleared}
WHERE r.expires_at <= {ts} AND clock_timestamp() <= $6::timestamptz`),
		reserveEpoch: q(`INSERT INTO {t} AS r (key, state, token, fingerprint, created_at, lease_expires_at, expires_at, origin)
SELECT $1, 'in_flight', $2, $3, {ts}, {ts} + $4::bigint{us}, {ts} + $5::bigint{us}, NULLIF($7::text, '') || ' ' || $2::text
WHERE clock_timestamp() <= $6::timestamptz AND {epoch}
ON CONFLICT (key) DO UPDATE SET
	state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
	created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
	expires_at = excluded.expires_at, origin = excluded.origin, response = NULL, body = NULL, {cleared}
WHERE r.expires_at <= {ts} AND clock_timestamp() <= $6::timestamptz AND {epoch}`),
		// The batch's reservations are the reserve statement's over the
		// rows of v, in the order of their keys (the order in which they
		// lock rows), each with its own deadline and epoch ('': none); the
		// conflict's WHERE finds the row's own in v. The rows it did not
		// take are read in the same statement, from its snapshot: a record
		// committed after the snapshot began is not seen, and the caller
		// then tries alone. The commits, releases and in-doubt marks are
		// the fenced statements over their own arrays. The keys are
		// distinct across the whole batch, so no row is changed twice.
		// Each row of the result is a key of the batch: for a reservation
		// whether it took the key and otherwise the live record (as get
		// returns it); for the others, the keys whose record they changed.
		//
		// The arrays are read through p, which the planner does not look
		// into: it then plans every batch alike, whatever its size, and
		// the plan cache keeps one generic plan of the statement instead
		// of planning it anew each time (the arrays' lengths would make
		// each plan look cheaper than the generic one). Its planning costs
		// more than its execution.
		batch: q(`WITH p AS MATERIALIZED (
	SELECT $1::text[] AS rk, $2::text[] AS rt, $3::text[] AS rf, $4::bigint[] AS rl, $5::bigint[] AS rx, $6::timestamptz[] AS rd, $7::text[] AS re, $8::text[] AS ro,
		$9::text[] AS ck, $10::text[] AS ct, $11::text[] AS cr, $12::bytea[] AS cb, $13::bigint[] AS cx,
		$14::text[] AS dk, $15::text[] AS dt,
		$16::text[] AS mk, $17::text[] AS mt, $18::bigint[] AS mx
), v AS (
	SELECT v.* FROM p, unnest(p.rk, p.rt, p.rf, p.rl, p.rx, p.rd, p.re, p.ro) AS v (key, token, fingerprint, lease, ttl, deadline, epoch, origin)
), ins AS (
	INSERT INTO {t} AS r (key, state, token, fingerprint, created_at, lease_expires_at, expires_at, origin)
	SELECT v.key, 'in_flight', v.token, v.fingerprint, {ts}, {ts} + v.lease{us}, {ts} + v.ttl{us}, NULLIF(v.origin, '') || ' ' || v.token
	FROM v WHERE clock_timestamp() <= v.deadline AND {vepoch}
	ORDER BY v.key
	ON CONFLICT (key) DO UPDATE SET
		state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
		created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
		expires_at = excluded.expires_at, origin = excluded.origin, response = NULL, body = NULL, {cleared}
	WHERE r.expires_at <= {ts} AND EXISTS (SELECT 1 FROM v WHERE v.key = excluded.key AND clock_timestamp() <= v.deadline AND {vepoch})
	RETURNING r.key
), cm AS (
	UPDATE {t} AS r SET
		state = 'completed',
		response = CASE WHEN r.state = 'completed' THEN r.response ELSE c.response::jsonb END,
		body = CASE WHEN r.state = 'completed' THEN r.body ELSE c.body END,
		expires_at = CASE WHEN r.state = 'completed' THEN r.expires_at ELSE {ts} + c.ttl{us} END,
		lease_expires_at = NULL, {cleared}
	FROM p, unnest(p.ck, p.ct, p.cr, p.cb, p.cx) AS c (key, token, response, body, ttl)
	WHERE r.key = c.key AND r.token = c.token AND {live}
	RETURNING r.key
), rl AS (
	DELETE FROM {t} AS r USING p, unnest(p.dk, p.dt) AS d (key, token)
	WHERE r.key = d.key AND r.token = d.token AND {live}
	RETURNING r.key
), md AS (
	UPDATE {t} AS r SET
		state = CASE WHEN r.state = 'completed' THEN r.state ELSE 'in_doubt' END,
		lease_expires_at = NULL,
		expires_at = CASE WHEN r.state = 'completed' THEN r.expires_at ELSE {ts} + m.ttl{us} END
	FROM p, unnest(p.mk, p.mt, p.mx) AS m (key, token, ttl)
	WHERE r.key = m.key AND r.token = m.token AND {live}
	RETURNING r.key
)
SELECT v.key, ins.key IS NOT NULL, CASE WHEN {doubt} THEN 'in_doubt' ELSE r.state END, r.token, r.fingerprint, r.created_at,
	CASE WHEN r.state = 'in_flight' AND r.lease_expires_at > {ts} THEN r.lease_expires_at END,
	r.expires_at, r.response, r.body, r.origin
FROM v LEFT JOIN ins ON ins.key = v.key
	LEFT JOIN {t} AS r ON ins.key IS NULL AND r.key = v.key AND {live}
UNION ALL SELECT key, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM cm
UNION ALL SELECT key, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM rl
UNION ALL SELECT key, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM md`),
		get: q(`SELECT CASE WHEN {doubt} THEN 'in_doubt' ELSE r.state END, r.token, r.fingerprint, r.created_at,
	CASE WHEN r.state = 'in_flight' AND r.lease_expires_at > {ts} THEN r.lease_expires_at END,
	r.expires_at, r.response, r.body, r.origin
FROM {t} AS r WHERE r.key = $1 AND {live}`),
		// A completed record keeps its answer and expiry: this is a retried
		// commit whose first reply was lost. It is still "updated" (to the
		// same values) so that the one statement tells owner from not.
		commit: q(`UPDATE {t} AS r SET
	state = 'completed',
	response = CASE WHEN r.state = 'completed' THEN r.response ELSE $3::jsonb END,
	body = CASE WHEN r.state = 'completed' THEN r.body ELSE $4::bytea END,
	expires_at = CASE WHEN r.state = 'completed' THEN r.expires_at ELSE {ts} + $5::bigint{us} END,
	lease_expires_at = NULL, {cleared}
WHERE r.key = $1 AND r.token = $2 AND {live}`),
		release: q(`DELETE FROM {t} AS r WHERE r.key = $1 AND r.token = $2 AND {live}`),
		markInDoubt: q(`UPDATE {t} AS r SET
	state = CASE WHEN r.state = 'completed' THEN r.state ELSE 'in_doubt' END,
	lease_expires_at = NULL,
	expires_at = CASE WHEN r.state = 'completed' THEN r.expires_at ELSE {ts} + $3::bigint{us} END
WHERE r.key = $1 AND r.token = $2 AND {live}`),

		schedule: q(`UPDATE {t} AS r SET state = 'in_doubt', lease_expires_at = NULL, next_lookup = {ts} + $2::bigint{us}
WHERE r.key = $1 AND {live} AND r.next_lookup IS NULL AND {doubt}`),
		unschedule: q(`UPDATE {t} AS r SET next_lookup = NULL, listed_by = NULL, listed_until = NULL
WHERE r.key = $1 AND {live} AND r.next_lookup IS NOT NULL AND {doubt}`),
		claim: q(`UPDATE {t} AS r SET state = 'in_doubt', lease_expires_at = NULL,
	lookup_token = $2, lookup_lease_until = {ts} + $3::bigint{us}
WHERE r.key = $1 AND {live} AND {doubt}
	AND (r.lookup_token IS NULL OR r.lookup_lease_until <= {ts})
	AND ($4::boolean OR r.next_lookup <= {ts})`),
		claimState: q(`SELECT {doubt}, COALESCE(r.lookup_token IS NOT NULL AND r.lookup_lease_until > {ts}, false)
FROM {t} AS r WHERE r.key = $1 AND {live}`),
		resolveRelease: q(`DELETE FROM {t} AS r WHERE r.key = $1 AND r.lookup_token = $2 AND {live} AND {doubt}`),
		resolveApplied: q(`UPDATE {t} AS r SET state = 'completed', response = $3::jsonb, body = $4::bytea,
	lease_expires_at = NULL, {cleared}
WHERE r.key = $1 AND r.lookup_token = $2 AND {live} AND {doubt}`),
		resolveRetry: q(`UPDATE {t} AS r SET state = 'in_doubt', lease_expires_at = NULL,
	lookup_token = NULL, lookup_lease_until = NULL, listed_by = NULL, listed_until = NULL,
	next_lookup = {ts} + $3::bigint{us}
WHERE r.key = $1 AND r.lookup_token = $2 AND {live} AND {doubt}`),

		// The due records are taken FOR UPDATE SKIP LOCKED and tagged as
		// listed by this Store for a while, so that replicas polling at
		// once get different keys; the claim itself is ClaimLookup's fenced
		// UPDATE.
		due: q(`UPDATE {t} AS r SET listed_by = $2, listed_until = {ts} + $3::bigint{us}
WHERE r.key = ANY (ARRAY (
	SELECT r.key FROM {t} AS r
	WHERE r.next_lookup IS NOT NULL AND r.next_lookup <= {ts} AND {live} AND {doubt}
		AND (r.lookup_token IS NULL OR r.lookup_lease_until <= {ts})
		AND (r.listed_by IS NULL OR r.listed_by = $2 OR r.listed_until <= {ts})
	ORDER BY r.next_lookup
	LIMIT $1
	FOR UPDATE SKIP LOCKED))
RETURNING r.key`),
		unscheduled: q(`SELECT r.key FROM {t} AS r
WHERE r.next_lookup IS NULL AND r.state IN ('in_flight', 'in_doubt')
	AND substr(r.key, 1, length($1::text)) = $1::text AND {live} AND {doubt}
LIMIT $2`),
		// The keys are collected into an array first, so that the rows are
		// then found by the primary key, one lookup each: a join with the
		// table could read every expired row, however many, per batch. The
		// outer condition on expires_at is checked again on the row version
		// the DELETE finds, so a key reserved anew meanwhile stays.
		sweep: q(`DELETE FROM {t} AS r
WHERE r.key = ANY (ARRAY (
	SELECT r.key FROM {t} AS r WHERE r.expires_at <= {ts}
	ORDER BY r.expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED))
AND r.expires_at <= {ts}`),
	}
}

// SchemaSQL returns the statements New runs to create the table of key
// records in schema (CREATE SCHEMA excepted), its indexes and its version
// table, as one script: for an administrator who creates them with an owner
// role, so that the proxy's role needs only SELECT, INSERT, UPDATE and
// DELETE on the two tables and USAGE on the schema. Empty schema and table
// mean the defaults.
func SchemaSQL(schema, table string) string {
	if schema == "" {
		schema = defaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	q := newQueries(schema, table)
	stmts := append(append(append([]string(nil), q.createTable...), q.createIndexes...), q.createVersion[0],
		strings.Replace(q.createVersion[1], "$1", strconv.Itoa(schemaVersion), 1))
	return strings.Join(stmts, ";\n") + ";\n"
}
