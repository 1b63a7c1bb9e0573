package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// The keyspace registry (store.KeyspaceStore) is one hash without TTL
// under the key prefix, <prefix>keyspaces, beside the epoch marker: no
// '/' in its name, so no route's key can reach it, and List and
// Unscheduled pass it by. Each field is a keyspace's name behind '@'
// (no field of a record begins so), its value the entry in JSON. On a
// Cluster it is one key in one slot.

var _ store.KeyspaceStore = (*Store)(nil)

// keyspaceField begins the field of every entry.
const keyspaceField = "@"

// keyspacesKey returns the Redis key of the keyspace registry.
func (s *Store) keyspacesKey() string { return s.prefix + "keyspaces" }

// keyspaceValue is a registry entry as stored.
type keyspaceValue struct {
	Digest    string `json:"digest"`
	Recipe    string `json:"recipe"`
	Routes    string `json:"routes,omitempty"`
	UpdatedAt int64  `json:"at"` // Unix ms
}

// Keyspaces implements store.KeyspaceStore.
func (s *Store) Keyspaces(ctx context.Context) ([]store.Keyspace, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	all, err := s.client.HGetAll(ctx, s.keyspacesKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("redis store: read the keyspace registry: %w", err)
	}
	var out []store.Keyspace
	for f, raw := range all {
		name, ok := strings.CutPrefix(f, keyspaceField)
		if !ok {
			continue
		}
		var v keyspaceValue
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			return nil, fmt.Errorf("redis store: read the keyspace registry: entry %s: %w", name, err)
		}
		out = append(out, store.Keyspace{Name: name, Digest: v.Digest, Recipe: v.Recipe, Routes: v.Routes,
			UpdatedAt: time.UnixMilli(v.UpdatedAt)})
	}
	return out, nil
}

// PutKeyspace implements store.KeyspaceStore.
func (s *Store) PutKeyspace(ctx context.Context, k store.Keyspace) error {
	if k.Name == "" {
		return errors.New("redis store: record a keyspace: empty name")
	}
	b, err := json.Marshal(keyspaceValue{Digest: k.Digest, Recipe: k.Recipe, Routes: k.Routes, UpdatedAt: k.UpdatedAt.UnixMilli()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	if err := s.client.HSet(ctx, s.keyspacesKey(), keyspaceField+k.Name, b).Err(); err != nil {
		return fmt.Errorf("redis store: record keyspace %s: %w", k.Name, err)
	}
	return nil
}

// DropKeyspace implements store.KeyspaceStore.
func (s *Store) DropKeyspace(ctx context.Context, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	n, err := s.client.HDel(ctx, s.keyspacesKey(), keyspaceField+name).Result()
	if err != nil {
		return false, fmt.Errorf("redis store: drop keyspace %s: %w", name, err)
	}
	return n == 1, nil
}
