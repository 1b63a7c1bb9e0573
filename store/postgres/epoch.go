package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// The epoch marker (store.EpochStore) is a row of the key table itself,
// under epochKey, so that whatever empties the table (TRUNCATE, a table
// restored from a backup or recreated, a database rebuilt) takes the
// marker with the keys; a row beside the schema version would survive a
// TRUNCATE of the key table and vouch for keys that are gone. The row
// fits the table's constraints: state 'completed', token the marker's ID,
// fingerprint its state, created_at its time, expires_at in the year 9999 (the
// sweeper deletes only rows that expired), response its other fields. No
// record key can be epochKey: record keys hold a '/' and begin with a
// route name (a letter or digit). List skips it; Unscheduled and
// DueLookups never select a completed row. No schema change: a table of an
// older binary gains the row on its first start.

// epochKey is the key of the epoch marker's row in the key table.
const epochKey = "!epoch"

var _ store.EpochStore = (*Store)(nil)

// epochRest is what the response column holds of the marker.
type epochRest struct {
	Gen      uint64 `json:"gen"`
	Previous string `json:"prev,omitempty"`
	Note     string `json:"note,omitempty"`
}

// Epoch implements store.EpochStore.
func (s *Store) Epoch(ctx context.Context) (*store.Epoch, error) {
	var e *store.Epoch
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		var err error
		e, err = s.readEpoch(ctx, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres store: read the epoch marker: %w", err)
	}
	return e, nil
}

func (s *Store) readEpoch(ctx context.Context, c *pgxpool.Conn) (*store.Epoch, error) {
	return readEpochOn(ctx, c.Conn(), s.table)
}

// readEpochOn reads the marker in table over c.
func readEpochOn(ctx context.Context, c *pgx.Conn, table string) (*store.Epoch, error) {
	var (
		e    store.Epoch
		st   string
		rest []byte
	)
	err := c.QueryRow(ctx, "SELECT token, fingerprint, created_at, response FROM "+table+" WHERE key = $1", epochKey).
		Scan(&e.ID, &st, &e.CreatedAt, &rest)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r epochRest
	if err := json.Unmarshal(rest, &r); err != nil {
		return nil, fmt.Errorf("decode the marker: %w", err)
	}
	e.State, e.Gen, e.Previous, e.Note = store.EpochState(st), r.Gen, r.Previous, r.Note
	return &e, nil
}

// SwapEpoch implements store.EpochStore: an INSERT that does nothing on
// conflict when old is empty, an UPDATE conditional on the ID otherwise.
func (s *Store) SwapEpoch(ctx context.Context, old string, e store.Epoch) (*store.Epoch, bool, error) {
	if e.ID == "" {
		return nil, false, errors.New("postgres store: swap epoch: empty ID")
	}
	rest, err := json.Marshal(epochRest{Gen: e.Gen, Previous: e.Previous, Note: e.Note})
	if err != nil {
		return nil, false, fmt.Errorf("postgres store: swap epoch: %w", err)
	}
	var (
		cur     *store.Epoch
		swapped bool
	)
	err = s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		var tag interface{ RowsAffected() int64 }
		var err error
		if old == "" {
			tag, err = c.Exec(ctx, "INSERT INTO "+s.table+
				" (key, state, token, fingerprint, created_at, expires_at, response) VALUES ($1, 'completed', $2, $3, $4, '9999-12-31 00:00:00+00', $5)"+
				" ON CONFLICT (key) DO NOTHING", epochKey, e.ID, string(e.State), e.CreatedAt, rest)
		} else {
			tag, err = c.Exec(ctx, "UPDATE "+s.table+
				" SET token = $2, fingerprint = $3, created_at = $4, response = $5, expires_at = '9999-12-31 00:00:00+00' WHERE key = $1 AND token = $6",
				epochKey, e.ID, string(e.State), e.CreatedAt, rest, old)
		}
		if err != nil {
			return err
		}
		if swapped = tag.RowsAffected() == 1; swapped {
			cur = &e
			return nil
		}
		cur, err = s.readEpoch(ctx, c)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("postgres store: swap epoch: %w", err)
	}
	return cur, swapped, nil
}

// Incarnation identifies the server process the store's connections reach:
// its start time and address. It changes when PostgreSQL restarts or a
// failover promotes another server.
func (s *Store) Incarnation(ctx context.Context) (string, error) {
	var v string
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_postmaster_start_time()::text || ' ' || coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port()::text, '')").Scan(&v)
	})
	if err != nil {
		return "", fmt.Errorf("postgres store: read the server's start time: %w", err)
	}
	return v, nil
}

// ExpectEpoch makes every reservation take its key only while the marker's
// ID is id ("": stop checking), in the same statement (an EXISTS on the
// marker's row, by primary key): not one reservation lands on a table that
// was truncated between two checks of the watcher. A reservation refused
// so is store.ErrKeysLost, and Options.EpochSeen hears of the marker. The
// program calls it with the epoch the replica trusts.
func (s *Store) ExpectEpoch(id string) { s.expect.Store(&id) }

func (s *Store) expectedEpoch() string {
	if p := s.expect.Load(); p != nil {
		return *p
	}
	return ""
}
