package storetest

import (
	"context"
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// KeyspaceStore is what RunKeyspaces tests: a store with its keyspace
// registry, that lists its keys.
type KeyspaceStore interface {
	store.Store
	store.Lister
	store.KeyspaceStore
}

// RunKeyspaces runs the conformance cases of the keyspace registry.
// newStore must return a store without a registry each time it is called
// (a fresh key prefix, table or directory).
func RunKeyspaces(t *testing.T, newStore func(t *testing.T) KeyspaceStore) {
	ctx := context.Background()
	entry := func(name string) store.Keyspace {
		return store.Keyspace{Name: name, Digest: strings.ToLower(rand.Text()), Recipe: "header Idempotency-Key; scope header Authorization; normalize none",
			Routes: name + ",other", UpdatedAt: time.Now().Truncate(time.Millisecond)}
	}
	cases := []struct {
		name string
		run  func(t *testing.T, s KeyspaceStore)
	}{
		{"a store that never had a registry has no entries", func(t *testing.T, s KeyspaceStore) {
			if got, err := s.Keyspaces(ctx); err != nil || len(got) != 0 {
				t.Fatalf("Keyspaces = %+v, %v; want none", got, err)
			}
		}},
		{"entries are written, read back whole, replaced and dropped", func(t *testing.T, s KeyspaceStore) {
			a, b := entry("charges"), entry("refunds.v2_x-1")
			for _, k := range []store.Keyspace{a, b} {
				if err := s.PutKeyspace(ctx, k); err != nil {
					t.Fatalf("PutKeyspace(%s): %v", k.Name, err)
				}
			}
			wantKeyspaces(t, "after two puts", s, a, b)
			a2 := entry("charges")
			a2.Recipe, a2.Routes = "json orderId; scope none; normalize nfc", ""
			if err := s.PutKeyspace(ctx, a2); err != nil {
				t.Fatal(err)
			}
			wantKeyspaces(t, "after a replacement", s, a2, b)
			if found, err := s.DropKeyspace(ctx, "charges"); err != nil || !found {
				t.Fatalf("DropKeyspace(charges) = %v, %v; want found", found, err)
			}
			wantKeyspaces(t, "after a drop", s, b)
			if found, err := s.DropKeyspace(ctx, "charges"); err != nil || found {
				t.Fatalf("DropKeyspace(charges) again = %v, %v; want not found", found, err)
			}
		}},
		{"the registry is no key record: not listed, and records do not touch it", func(t *testing.T, s KeyspaceStore) {
			k := entry("ks-route")
			if err := s.PutKeyspace(ctx, k); err != nil {
				t.Fatal(err)
			}
			key := store.Key("ks-route", "", "k-"+rand.Text())
			if _, err := s.Reserve(ctx, key, store.Reservation{Token: "t", Fingerprint: "f", Lease: longLease, TTL: longTTL}); err != nil {
				t.Fatal(err)
			}
			for _, prefix := range []string{"", "ks-route/"} {
				recs, next, err := s.List(ctx, store.ListQuery{Prefix: prefix, Limit: 1000})
				for err == nil && next != "" {
					var more []store.Listed
					more, next, err = s.List(ctx, store.ListQuery{Prefix: prefix, Limit: 1000, Cursor: next})
					recs = append(recs, more...)
				}
				if err != nil {
					t.Fatalf("List(%q): %v", prefix, err)
				}
				if len(recs) != 1 || recs[0].Key != key {
					t.Errorf("List(%q) = %+v, want only the record %q", prefix, recs, key)
				}
			}
			if rs, ok := s.(store.ReconcileStore); ok {
				if keys, err := rs.Unscheduled(ctx, "", 100); err != nil || len(keys) != 0 {
					t.Errorf("Unscheduled = %q, %v; want no key (the record is in flight, the registry no record)", keys, err)
				}
				if keys, err := rs.DueLookups(ctx, 100); err != nil || len(keys) != 0 {
					t.Errorf("DueLookups = %q, %v; want none", keys, err)
				}
			}
			if err := s.Release(ctx, key, "t"); err != nil {
				t.Fatal(err)
			}
			if recs, _, err := s.List(ctx, store.ListQuery{Prefix: "ks-route/", Limit: 1}); err != nil || len(recs) != 0 {
				t.Errorf("List after the release = %+v, %v; want none", recs, err)
			}
			wantKeyspaces(t, "after a record's life", s, k)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newStore(t))
		})
	}
}

// wantKeyspaces fails t unless s's registry holds exactly want
// (UpdatedAt to the millisecond).
func wantKeyspaces(t *testing.T, what string, s store.KeyspaceStore, want ...store.Keyspace) {
	t.Helper()
	got, err := s.Keyspaces(context.Background())
	if err != nil {
		t.Fatalf("%s: Keyspaces: %v", what, err)
	}
	byName := func(a, b store.Keyspace) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(got, byName)
	want = slices.Clone(want)
	slices.SortFunc(want, byName)
	if len(got) != len(want) {
		t.Fatalf("%s: Keyspaces = %+v, want %+v", what, got, want)
	}
	for i := range got {
		g := got[i]
		if !g.UpdatedAt.Equal(want[i].UpdatedAt) {
			t.Errorf("%s: %s: UpdatedAt %v, want %v", what, g.Name, g.UpdatedAt, want[i].UpdatedAt)
		}
		g.UpdatedAt = want[i].UpdatedAt
		if g != want[i] {
			t.Errorf("%s: entry %+v, want %+v", what, g, want[i])
		}
	}
}
