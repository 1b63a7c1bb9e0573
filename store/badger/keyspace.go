package badger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// The keyspace registry (store.KeyspaceStore) is one key of the database
// per keyspace, without expiry, beside the epoch marker: keyspaceKeys
// begin with a zero byte, which no record key does, so List passes them
// by, and carry UserMeta metaKeyspace, which no scan for records selects.

// keyspacePrefix begins the key of every registry entry.
const keyspacePrefix = "\x00ks/"

// metaKeyspace is the UserMeta of a registry entry.
const metaKeyspace byte = 7

var (
	_ store.KeyspaceStore = (*Store)(nil)
	_ store.KeyspaceStore = (*Guard)(nil)
)

// keyspaceValue is a registry entry as stored.
type keyspaceValue struct {
	Digest    string `json:"digest"`
	Recipe    string `json:"recipe"`
	Routes    string `json:"routes,omitempty"`
	UpdatedAt int64  `json:"at"` // Unix ms
}

// Keyspaces implements store.KeyspaceStore.
func (s *Store) Keyspaces(ctx context.Context) ([]store.Keyspace, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []store.Keyspace
	err := s.db.View(func(txn *bdg.Txn) error {
		it := txn.NewIterator(bdg.IteratorOptions{Prefix: []byte(keyspacePrefix), PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			var v keyspaceValue
			if err := item.Value(func(b []byte) error { return json.Unmarshal(b, &v) }); err != nil {
				return fmt.Errorf("decode the keyspace entry %q: %w", item.Key(), err)
			}
			out = append(out, store.Keyspace{Name: string(item.Key()[len(keyspacePrefix):]), Digest: v.Digest,
				Recipe: v.Recipe, Routes: v.Routes, UpdatedAt: time.UnixMilli(v.UpdatedAt)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("badger: read the keyspace registry: %w", err)
	}
	return out, nil
}

// PutKeyspace implements store.KeyspaceStore; the write is synced.
func (s *Store) PutKeyspace(ctx context.Context, k store.Keyspace) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if k.Name == "" {
		return errors.New("badger: record a keyspace: empty name")
	}
	b, err := json.Marshal(keyspaceValue{Digest: k.Digest, Recipe: k.Recipe, Routes: k.Routes, UpdatedAt: k.UpdatedAt.UnixMilli()})
	if err != nil {
		return err
	}
	err = s.update(func(txn *wtxn) error {
		return txn.SetEntry(bdg.NewEntry([]byte(keyspacePrefix+k.Name), b).WithMeta(metaKeyspace))
	})
	if err != nil {
		return fmt.Errorf("badger: record keyspace %s: %w", k.Name, err)
	}
	return nil
}

// DropKeyspace implements store.KeyspaceStore; the write is synced.
func (s *Store) DropKeyspace(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var found bool
	err := s.update(func(txn *wtxn) error {
		found = false
		key := []byte(keyspacePrefix + name)
		if _, err := txn.Get(key); errors.Is(err, bdg.ErrKeyNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		found = true
		return txn.Delete(key)
	})
	if err != nil {
		return false, fmt.Errorf("badger: drop keyspace %s: %w", name, err)
	}
	return found, nil
}

// Keyspaces implements store.KeyspaceStore.
func (g *Guard) Keyspaces(ctx context.Context) (ks []store.Keyspace, err error) {
	err = g.do(func(s *Store) error {
		ks, err = s.Keyspaces(ctx)
		return err
	})
	return ks, err
}

// PutKeyspace implements store.KeyspaceStore.
func (g *Guard) PutKeyspace(ctx context.Context, k store.Keyspace) error {
	return g.do(func(s *Store) error { return s.PutKeyspace(ctx, k) })
}

// DropKeyspace implements store.KeyspaceStore.
func (g *Guard) DropKeyspace(ctx context.Context, name string) (found bool, err error) {
	err = g.do(func(s *Store) error {
		found, err = s.DropKeyspace(ctx, name)
		return err
	})
	return found, err
}
