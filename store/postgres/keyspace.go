package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// The keyspace registry (store.KeyspaceStore) is rows of the key table
// itself, as the epoch marker is, so that whatever empties the table takes
// the registry with the keys: one row a keyspace under keyspacePrefix +
// its name (no record key begins with '!'), state 'completed', token the
// recipe's digest, fingerprint the recipe, created_at when it was
// written, expires_at in the year 9999 (never swept), response the routes.
// List skips keys that begin with '!'; Unscheduled and DueLookups never
// select a completed row. No schema change.

// keyspacePrefix begins the key of every registry row.
const keyspacePrefix = "!ks/"

var _ store.KeyspaceStore = (*Store)(nil)

// keyspaceRest is what the response column holds of an entry.
type keyspaceRest struct {
	Routes string `json:"routes,omitempty"`
}

// Keyspaces implements store.KeyspaceStore.
func (s *Store) Keyspaces(ctx context.Context) ([]store.Keyspace, error) {
	var out []store.Keyspace
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		out = nil
		// '0' follows '/': the range is every key behind the prefix.
		rows, err := c.Query(ctx, "SELECT key, token, fingerprint, created_at, response FROM "+s.table+
			" WHERE key >= $1 AND key < $2", keyspacePrefix, strings.TrimSuffix(keyspacePrefix, "/")+"0")
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Keyspace, error) {
			var (
				k    store.Keyspace
				rest []byte
			)
			if err := r.Scan(&k.Name, &k.Digest, &k.Recipe, &k.UpdatedAt, &rest); err != nil {
				return k, err
			}
			k.Name = strings.TrimPrefix(k.Name, keyspacePrefix)
			var v keyspaceRest
			if err := json.Unmarshal(rest, &v); err != nil {
				return k, fmt.Errorf("entry %s: %w", k.Name, err)
			}
			k.Routes = v.Routes
			return k, nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres store: read the keyspace registry: %w", err)
	}
	return out, nil
}

// PutKeyspace implements store.KeyspaceStore.
func (s *Store) PutKeyspace(ctx context.Context, k store.Keyspace) error {
	if k.Name == "" {
		return errors.New("postgres store: record a keyspace: empty name")
	}
	rest, err := json.Marshal(keyspaceRest{Routes: k.Routes})
	if err != nil {
		return err
	}
	err = s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, "INSERT INTO "+s.table+
			" (key, state, token, fingerprint, created_at, expires_at, response) VALUES ($1, 'completed', $2, $3, $4, '9999-12-31 00:00:00+00', $5)"+
			" ON CONFLICT (key) DO UPDATE SET state = 'completed', token = $2, fingerprint = $3, created_at = $4,"+
			" expires_at = '9999-12-31 00:00:00+00', response = $5", keyspacePrefix+k.Name, k.Digest, k.Recipe, k.UpdatedAt, rest)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres store: record keyspace %s: %w", k.Name, err)
	}
	return nil
}

// DropKeyspace implements store.KeyspaceStore.
func (s *Store) DropKeyspace(ctx context.Context, name string) (bool, error) {
	var found bool
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		tag, err := c.Exec(ctx, "DELETE FROM "+s.table+" WHERE key = $1", keyspacePrefix+name)
		found = err == nil && tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("postgres store: drop keyspace %s: %w", name, err)
	}
	return found, nil
}
