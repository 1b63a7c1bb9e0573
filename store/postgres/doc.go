// Package postgres is the idemproxy store kept in PostgreSQL: replicas that
// may receive the same idempotency key share one database and so agree on
// who owns a key, and with synchronous replication a failover of the
// database loses no acknowledged reservation.
//
// # Data layout
//
// One table (Options.Schema and Options.Table, default
// public.idemproxy_keys) holds one row per key:
//
//	key                 the proxy's key, "route/scopehash/key" (primary key,
//	                    COLLATE "C": compared as bytes, so that its index
//	                    does not depend on the OS's or ICU's locale data,
//	                    whose order changes with their versions)
//	state               in_flight, completed or in_doubt
//	token               owner token of the reservation
//	fingerprint         request fingerprint
//	created_at          when the reservation was made
//	lease_expires_at    end of an in-flight reservation's lease
//	expires_at          when the record is forgotten
//	response            the stored answer without its body, JSON (jsonb)
//	body                the stored answer's body (bytea; NULL when not stored)
//	next_lookup         the reconciler's next lookup of an in-doubt record
//	lookup_token        owner token of the running lookup
//	lookup_lease_until  end of that lookup's lease
//	listed_by           the process DueLookups last listed the record for
//	listed_until        until when that listing holds
//	origin              the reservation's store.Reservation.Origin and
//	                    its token, "<origin> <token>" (NULL: none, or a
//	                    row of an earlier release; an origin stored with
//	                    another token than the row's is none: the row was
//	                    reserved again by an earlier release)
//
// with an index on expires_at, a partial index on next_lookup (scheduled
// lookups only) and a partial index on key of the records in flight or in
// doubt without a scheduled lookup. A second table, <table>_schema, holds
// the layout's version (1). New creates what is missing (CREATE SCHEMA,
// TABLE and INDEX IF NOT EXISTS), adds the nullable columns added since
// (origin: addColumns, which earlier releases of version 1 work with), and
// refuses a version newer than the binary knows, so a later release can
// migrate the table.
//
// # Atomicity and clocks
//
// Reserve, Commit, Release and MarkInDoubt each change the record with one
// statement (or with one part of a batch's statement, see Batching): Reserve is an INSERT ... ON CONFLICT (key) DO UPDATE that
// takes the key only when the row there has expired, the others an UPDATE
// or DELETE ... WHERE key = $1 AND token = $2, fenced by the owner token,
// so an owner whose lease ran out can never touch a newer owner's record.
// Of N concurrent reservations of a key, on one proxy or many, exactly one
// inserts the row. When Reserve finds a live record it reads it with a
// second statement (trying again if it vanished in between). A reservation
// also carries a deadline on the database's clock (see clock.go), so that
// one that reaches a stalled database after its caller gave up takes
// nothing.
//
// Leases and expiry are judged by the database's clock, statement_timestamp()
// (one instant per statement), never a proxy's, however skewed the
// proxies' clocks are. An in-flight record whose lease has passed is
// reported as in doubt; an expired record counts as absent for every
// method. Expired rows are deleted in the background (Options.SweepInterval)
// in bounded batches through the index on expires_at, DELETE ... WHERE key
// = ANY (ARRAY (SELECT ... ORDER BY expires_at LIMIT n FOR UPDATE SKIP
// LOCKED)), each row then found by its key, never by a scan per request; autovacuum reclaims their space, so the table's
// size follows the number of live keys.
//
// The reconcile schedule lives on the rows. DueLookups takes the due rows
// FOR UPDATE SKIP LOCKED and tags them for its process for a few seconds,
// so replicas polling at once share the work; ClaimLookup is a fenced
// UPDATE, so exactly one lookup of a key runs at a time.
//
// # Batching
//
// Writes made while another write of the same Store is at the database
// share one statement (batch.go): whatever queued meanwhile, up to 128
// writes of distinct keys, goes as one INSERT ... SELECT FROM unnest(...)
// ON CONFLICT for the reservations, with the fenced UPDATEs and DELETE of
// the commits, releases and in-doubt marks in the same statement: one round
// trip, one transaction, one commit and WAL flush (and one wait for a
// synchronous standby) for all of them. A write made while nothing runs
// uses the single statements above, at once. Each write in a batch gets
// its own answer, the same the single statements give (the conformance
// suites run on both). A batch the server refuses with an error (statement_timeout
// included) changed nothing, and each of its writes is then run alone, so
// that a value the server cannot take, or a row locked past the timeout,
// fails its own caller only; a batch whose outcome is unknown (the
// connection lost, a commit the synchronous standby did not confirm) fails
// every caller in it, as it would fail a single write. A caller that gives up returns at once and
// leaves the batch to the others. One batch is at the database at a
// time while it answers promptly; one that waits (a row lock another
// session holds) for 100 ms lets the writes of other keys go in a batch of
// their own, up to 4 at once, so a key's lock stalls its own batch only.
//
// # Failures
//
// Getting a connection (from the pool, or a new one) waits at most
// Options.ConnectTimeout for each host the DSN lists (a new connection
// tries them in turn, so a frozen old primary listed first costs its
// timeout before the new one is reached); every statement runs under statement_timeout
// (Options.StatementTimeout, set on each connection), and the client gives
// up shortly after the server would have cancelled it, sending a cancel
// request. A database that is down or unreachable, a pool whose
// connections are all busy, or a slow statement is therefore an error
// within about ConnectTimeout + StatementTimeout (the proxy answers 503),
// never a hang, and the pool reconnects on its own when the database is
// back. Ping, which /readyz uses, also fails on a read-only standby (SELECT
// pg_is_in_recovery()), which cannot take reservations.
//
// # Privileges
//
// The role in the DSN needs, on an existing table and its version table,
// SELECT, INSERT, UPDATE and DELETE, and USAGE on the schema. To let New
// create them it also needs CREATE on the schema (and CREATE on the
// database when the schema itself is missing); an administrator can instead
// create them with an owner role (SchemaSQL returns the statements) and
// grant the four privileges to the proxy's role. New checks
// them with a reservation, a commit and a release in a transaction it rolls
// back, so a database the proxy cannot write to (missing privileges,
// default_transaction_read_only, a standby) or a table it cannot reserve
// in (one without the primary key on key) fails at start with a clear
// error, not at the first request.
//
// # Durability
//
// A reservation is acknowledged when its INSERT commits. What that commit
// waits for is synchronous_commit (Options.SynchronousCommit sets it on
// every connection; empty leaves the server's):
//
//   - on (PostgreSQL's default): the commit record is flushed to the
//     primary's disk, and, when synchronous_standby_names names standbys,
//     to theirs. With a synchronous standby, a failover to it loses no
//     acknowledged reservation: the retry of a request whose reservation was
//     acknowledged finds it, and the upstream is not called twice.
//   - remote_apply: as on, and the standby has also applied the commit, so
//     a read from the standby sees it.
//   - remote_write: the standby has received the commit and handed it to
//     its operating system, not flushed it: a failover loses nothing unless
//     the standby's host also crashes.
//   - local: flushed on the primary only; a failover to an asynchronous
//     standby can lose the last acknowledged reservations.
//   - off: not even flushed on the primary (a crash of the primary loses
//     the last few hundred milliseconds of writes; the database stays
//     consistent).
//
// Without synchronous standbys, on, remote_apply and remote_write all
// behave as local. While a synchronous standby is unreachable, commits
// wait for it. statement_timeout, or the cancel the store sends when a
// call runs past it, ends the wait, and PostgreSQL then keeps the commit on
// the primary and answers success with a WARNING. The store takes that
// warning, and any reply that comes after it gave up, for what it is, a
// write a failover can lose, and fails the call (a 503): a reservation may
// exist whose caller saw an error, and it is in doubt once its lease ends,
// but none is acknowledged that the standby does not have.
//
// # Other databases
//
// The statements keep to SQL that CockroachDB and YugabyteDB also accept
// where that costs nothing: ON CONFLICT, RETURNING, partial indexes, FOR
// UPDATE SKIP LOCKED, ARRAY (subquery), statement_timestamp(), deleting by
// key (they have no ctid). The exception is the key's COLLATE "C", which
// PostgreSQL needs (above) and CockroachDB refuses on a column (its strings
// compare as bytes anyway): there, create the table from SchemaSQL with
// that clause removed. This cannot be tested here; set-up relies on to_regclass,
// pg_namespace and pg_is_in_recovery(), which they emulate.
//
// statement_timeout, synchronous_commit and default_transaction_isolation
// (read committed, which the statements are written for: under repeatable
// read or serializable a duplicate meeting a row in change would fail
// instead of reading it) are sent as startup parameters of each
// connection. PgBouncer refuses those unless they are listed in its
// ignore_startup_parameters, and then drops them: behind PgBouncer set them
// on the role instead (ALTER ROLE ... SET statement_timeout = ...); the
// client's own deadline still bounds every call. In transaction pooling
// mode also add default_query_exec_mode=exec (or simple_protocol) to the
// DSN (pgx prepares statements per connection otherwise); the store sends
// every value in a form those modes keep.
package postgres
