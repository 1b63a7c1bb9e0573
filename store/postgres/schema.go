package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// setUpTimeout bounds each step of New's set-up (the schema's creation may
// wait for locks that a statement_timeout of 500ms would not outlast).
const setUpTimeout = 30 * time.Second

// setUp checks the server, creates the schema when it is missing or older
// than this binary's, and checks that the table takes writes.
func (s *Store) setUp(ctx context.Context, schema, table string) error {
	c, err := s.conn(ctx)
	if err != nil {
		return fmt.Errorf("postgres store: connect: %w", err)
	}
	defer c.Release()
	ctx, cancel := context.WithTimeout(ctx, setUpTimeout)
	defer cancel()

	var recovery bool
	if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil {
		return fmt.Errorf("postgres store: connect: %w", err)
	}
	if recovery {
		return errors.New("postgres store: the server is a read-only standby (in recovery): the dsn must lead to the primary")
	}
	v, err := s.version(ctx, c)
	if err != nil {
		return err
	}
	if v > schemaVersion {
		return fmt.Errorf("postgres store: %s is at schema version %d, newer than this binary's %d: run a newer idemproxy, or another table",
			s.table, v, schemaVersion)
	}
	if v < schemaVersion {
		// Two replicas starting on an empty database race on CREATE ... IF
		// NOT EXISTS (the catalog's unique indexes refuse the second); the
		// loser's second attempt finds everything in place.
		err = s.create(ctx, c, schema)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			err = s.create(ctx, c, schema)
		}
		if err != nil {
			return fmt.Errorf("postgres store: create %s (see the package documentation for the privileges this needs): %w", s.table, err)
		}
	}
	if err := s.addColumns(ctx, c); err != nil {
		return err
	}
	if _, _, err := s.clock.get(ctx, c, s.statementTimeout); err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	if err := s.probeWrite(ctx, c); err != nil {
		return fmt.Errorf("postgres store: the database refuses writes to %s (the role needs SELECT, INSERT, UPDATE and DELETE on it, on a primary that is not read-only, and the table the layout of SchemaSQL): %w",
			s.table, err)
	}
	return nil
}

// version returns the schema version recorded next to the table, 0 when
// there is none.
func (s *Store) version(ctx context.Context, c *pgxpool.Conn) (int, error) {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.sql.versionTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("postgres store: look for %s: %w", s.sql.versionTable, err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := c.QueryRow(ctx, "SELECT version FROM "+s.sql.versionTable+" WHERE id = 1").Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("postgres store: read the schema version in %s: %w", s.sql.versionTable, err)
	}
	return v, nil
}

// create creates the schema (when missing: CREATE SCHEMA needs CREATE on the
// database even with IF NOT EXISTS), the table, its indexes and the version
// table, in one transaction.
func (s *Store) create(ctx context.Context, c *pgxpool.Conn, schema string) error {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := c.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '30s'"); err != nil {
			return err
		}
		stmts := append(append(append([]string(nil), s.sql.createTable...), s.sql.createIndexes...), s.sql.createVersion[0])
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, s.sql.createVersion[1], schemaVersion)
		return err
	})
}

// addedColumns are the columns added to the table after its version 1
// was released, with their types: a table created by an earlier release
// gets them at start (addColumns). Each is nullable without a default, so
// that adding it changes the catalog only (no rewrite of the table), and
// earlier releases, which name the columns they write, work on the table
// as it then is: so the schema version stays 1, and earlier releases
// still start on it (a rolling upgrade, a rollback).
var addedColumns = []struct{ name, typ string }{
	{"origin", "text"}, // store.Reservation.Origin, NULL for none
}

// addColumnTries is how many times addColumns tries an ALTER TABLE that
// waits for its lock longer than addColumnLockTimeout.
const addColumnTries = 5

// addColumnLockTimeout bounds an ALTER TABLE's wait for its lock: the
// statements queued behind it (every request's) wait as long.
const addColumnLockTimeout = "1s"

// addColumns adds the columns of addedColumns the table lacks. Replicas
// starting at once may each add one: ALTER TABLE ... ADD COLUMN IF NOT
// EXISTS takes the table's lock first, so the second finds it there. A
// table whose role may not alter it (one an administrator created, see
// SchemaSQL) fails with the statement to run.
func (s *Store) addColumns(ctx context.Context, c *pgxpool.Conn) error {
	for _, col := range addedColumns {
		var exists bool
		err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
			s.table, col.name).Scan(&exists)
		if err != nil {
			return fmt.Errorf("postgres store: look for the column %s of %s: %w", col.name, s.table, err)
		}
		if exists {
			continue
		}
		alter := "ALTER TABLE " + s.table + " ADD COLUMN IF NOT EXISTS " + col.name + " " + col.typ
		for try := 1; ; try++ {
			err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+addColumnLockTimeout+"'"); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, alter)
				return err
			})
			var pgErr *pgconn.PgError
			if err == nil || try == addColumnTries || !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
				break
			}
		}
		if err != nil {
			return fmt.Errorf("postgres store: add the column %s to %s, which this release keeps (as the table's owner, run: %s): %w",
				col.name, s.table, alter, err)
		}
	}
	return nil
}

// errRollback ends the write probe's transaction.
var errRollback = errors.New("rollback")

// probeWrite reserves, commits and releases a row with the store's own
// statements in a transaction that is rolled back: the privileges, a
// read-only database and a table the reservation cannot run on (one
// without the unique key ON CONFLICT needs) show at start, not at the
// first request.
func (s *Store) probeWrite(ctx context.Context, c *pgxpool.Conn) error {
	key := "idemproxy-write-probe/" + rand.Text()
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		off, _, err := s.clock.get(ctx, c, s.statementTimeout)
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.sql.reserve, key, "probe", "", int64(1), int64(1), time.Now().Add(off+setUpTimeout), "probe")
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("a reservation of a new key took nothing")
		}
		if _, err := tx.Exec(ctx, s.sql.commit, key, "probe", "{}", []byte(nil), int64(1)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.release, key, "probe"); err != nil {
			return err
		}
		return errRollback
	})
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// randomToken returns a random identifier.
func randomToken() string { return rand.Text() }
