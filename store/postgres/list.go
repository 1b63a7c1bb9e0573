package postgres

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

var _ store.Lister = (*Store)(nil)

// listColumns is what a listing reads of a row: never the token,
// fingerprint, headers or body. The last column says whether the row is
// live (expired rows wait for the sweeper).
const listColumns = `r.key, CASE WHEN {doubt} THEN 'in_doubt' ELSE r.state END, r.created_at,
	CASE WHEN r.state = 'in_flight' AND r.lease_expires_at > {ts} THEN r.lease_expires_at END,
	r.expires_at, COALESCE((r.response ->> 'status')::int, 0), {live}`

// listStatements returns the two statements of a listing's walk of the
// primary key index: from a key on (the first page, from the prefix) and
// after one (the following pages), in the index's order, at most $2 rows.
func listStatements(table string) (from, after string) {
	r := strings.NewReplacer("{t}", table, "{ts}", ts, "{live}", live, "{doubt}", doubt)
	cols := r.Replace(listColumns)
	return "SELECT " + cols + " FROM " + table + " AS r WHERE r.key >= $1 ORDER BY r.key LIMIT $2",
		"SELECT " + cols + " FROM " + table + " AS r WHERE r.key > $1 ORDER BY r.key LIMIT $2"
}

// bytewiseSQL asks whether the key column sorts byte by byte (the C or
// POSIX collation, of the column or of a database on the libc provider):
// then the keys under a prefix are one run of the index. The provider
// column exists from PostgreSQL 15 on; before, every database is libc.
const bytewiseSQL = `SELECT CASE
	WHEN c.collname IN ('C', 'POSIX', 'ucs_basic') THEN true
	WHEN c.collname = 'default' THEN (SELECT d.datcollate IN ('C', 'POSIX')
		AND COALESCE(to_jsonb(d.*) ->> 'datlocprovider', 'c') = 'c'
		FROM pg_database AS d WHERE d.datname = current_database())
	ELSE false END
FROM pg_attribute AS a JOIN pg_collation AS c ON c.oid = a.attcollation
WHERE a.attrelid = $1::regclass AND a.attname = 'key'`

// keysBytewise reports whether the key column sorts byte by byte, read
// once per Store (a failed read is tried again on the next listing).
func (s *Store) keysBytewise(ctx context.Context) (bool, error) {
	switch s.bytewise.Load() {
	case 1:
		return true, nil
	case 2:
		return false, nil
	}
	var b bool
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, bytewiseSQL, s.table).Scan(&b)
	})
	if err != nil {
		return false, fmt.Errorf("read the key column's collation: %w", err)
	}
	if b {
		s.bytewise.Store(1)
	} else {
		s.bytewise.Store(2)
	}
	return b, nil
}

// listCursor is where a listing of Prefix goes on: after the key Last.
type listCursor struct {
	Prefix string `json:"p"`
	Last   string `json:"k"`
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // strings only: cannot fail
	return "p1." + base64.RawURLEncoding.EncodeToString(b)
}

func decodeListCursor(s, prefix string) (*listCursor, error) {
	if s == "" {
		return nil, nil
	}
	rest, ok := strings.CutPrefix(s, "p1.")
	if !ok {
		return nil, store.ErrBadCursor
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, store.ErrBadCursor
	}
	var c listCursor
	// A listing ends a page on a key under its prefix, and a text column
	// holds no NUL byte (PostgreSQL would refuse the statement: a forged
	// cursor would read as a failing store).
	if err := json.Unmarshal(b, &c); err != nil || c.Prefix != prefix ||
		len(c.Last) <= len(prefix) || !strings.HasPrefix(c.Last, prefix) || strings.IndexByte(c.Last, 0) >= 0 {
		return nil, store.ErrBadCursor
	}
	return &c, nil
}

// List implements store.Lister by keyset pagination over the primary key
// index: each statement reads the next rows after the cursor's key in the
// index's order (a range scan of at most 1024 rows, without the bodies),
// and a call reads at most q.Budget() rows, expired ones included until
// the sweeper removes them; the filters are applied to the rows read.
//
// With a C (or POSIX) collation of the key column, the keys under a
// prefix are one run of the index: the walk starts at the prefix and ends
// with the run. With any other collation (en_US.UTF-8 and the like, which
// ignore punctuation at first) they may be interleaved with other routes'
// keys, so the walk starts at the prefix (a string sorts after its
// prefixes in the collations PostgreSQL ships) and goes on to the end of
// the table, skipping the keys of other routes: each page is still
// bounded, but listing a route costs reading the keys sorted after it.
// Creating the table in a database with LC_COLLATE C, or its key column
// with COLLATE "C", avoids that.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Listed, string, error) {
	if q.Limit <= 0 {
		return nil, "", fmt.Errorf("postgres store: list: limit %d is not positive", q.Limit)
	}
	cur, err := decodeListCursor(q.Cursor, q.Prefix)
	if err != nil {
		return nil, "", err
	}
	bw, err := s.keysBytewise(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("postgres store: list: %w", err)
	}
	fromSQL, afterSQL := listStatements(s.table)
	stmt, from := fromSQL, q.Prefix
	if cur != nil {
		stmt, from = afterSQL, cur.Last
	}
	var (
		recs     []store.Listed
		last     string
		examined int
		budget   = q.Budget()
	)
	for examined < budget {
		n := min(max(q.Limit+1, 256), 1024, budget-examined)
		var rows []listRow
		err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
			r, err := c.Query(ctx, stmt, from, n)
			if err != nil {
				return err
			}
			rows, err = pgx.CollectRows(r, scanListRow)
			return err
		})
		if err != nil {
			return nil, "", fmt.Errorf("postgres store: list: %w", err)
		}
		for _, r := range rows {
			inPrefix := strings.HasPrefix(r.Key, q.Prefix)
			if bw && !inPrefix {
				return recs, "", nil // past the prefix's run
			}
			if len(recs) == q.Limit {
				return recs, listCursor{q.Prefix, last}.encode(), nil
			}
			examined++
			last = r.Key
			if r.live && inPrefix && r.Key != epochKey && !strings.HasPrefix(r.Key, keyspacePrefix) && q.Matches(r.Key, r.State) {
				recs = append(recs, r.Listed)
			}
		}
		if len(rows) < n {
			return recs, "", nil // the end of the table
		}
		stmt, from = afterSQL, last
	}
	return recs, listCursor{q.Prefix, last}.encode(), nil
}

// listRow is a row a listing read.
type listRow struct {
	store.Listed
	live bool
}

func scanListRow(row pgx.CollectableRow) (listRow, error) {
	var (
		r     listRow
		st    string
		lease *time.Time
	)
	err := row.Scan(&r.Key, &st, &r.CreatedAt, &lease, &r.ExpiresAt, &r.StoredStatus, &r.live)
	r.State = store.State(st)
	if lease != nil {
		r.LeaseExpiresAt = *lease
	}
	return r, err
}
