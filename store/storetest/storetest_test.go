package storetest_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestReference runs the suite against refStore, the state machine written
// as plainly as possible, so the suite itself is checked without any backend.
// It is not a store to use.
func TestReference(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return &refStore{recs: map[string]*refRecord{}} })
}

// TestReferenceList runs the listing suite against refStore.
func TestReferenceList(t *testing.T) {
	storetest.RunList(t, func(t *testing.T) storetest.ListStore { return &refStore{recs: map[string]*refRecord{}} })
}

type refRecord struct {
	rec     store.Record
	expires time.Time
}

type refStore struct {
	mu   sync.Mutex
	recs map[string]*refRecord
}

// lookup returns the live record under key, with a lapsed lease reported as
// in doubt.
func (s *refStore) lookup(key string) *refRecord {
	r, ok := s.recs[key]
	if !ok {
		return nil
	}
	now := time.Now()
	if !now.Before(r.expires) {
		delete(s.recs, key)
		return nil
	}
	if r.rec.State == store.StateInFlight && !now.Before(r.rec.LeaseExpiresAt) {
		r.rec.State, r.rec.LeaseExpiresAt = store.StateInDoubt, time.Time{}
	}
	return r
}

func (s *refStore) snapshot(r *refRecord) *store.Record {
	rec := r.rec
	rec.ExpiresAt = r.expires
	return &rec
}

func (s *refStore) Reserve(_ context.Context, key string, res store.Reservation) (*store.Record, error) {
	if err := store.CheckOrigin(res.Origin); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.lookup(key); r != nil {
		if r.rec.State == store.StateInFlight && r.rec.Token == res.Token {
			return nil, nil
		}
		return s.snapshot(r), nil
	}
	now := time.Now()
	s.recs[key] = &refRecord{
		rec: store.Record{
			State: store.StateInFlight, Token: res.Token, Fingerprint: res.Fingerprint,
			CreatedAt: now, LeaseExpiresAt: now.Add(res.Lease), Origin: res.Origin,
		},
		expires: now.Add(res.TTL),
	}
	return nil, nil
}

func (s *refStore) owned(key, token string) (*refRecord, error) {
	r := s.lookup(key)
	if r == nil || r.rec.Token != token {
		return nil, store.ErrNotOwner
	}
	return r, nil
}

func (s *refStore) Commit(_ context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	r.rec.State, r.rec.LeaseExpiresAt, r.rec.Response = store.StateCompleted, time.Time{}, &resp
	r.expires = time.Now().Add(ttl)
	return nil
}

func (s *refStore) Release(_ context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.owned(key, token); err != nil {
		return err
	}
	delete(s.recs, key)
	return nil
}

func (s *refStore) MarkInDoubt(_ context.Context, key, token string, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	r.rec.State, r.rec.LeaseExpiresAt = store.StateInDoubt, time.Time{}
	r.expires = time.Now().Add(ttl)
	return nil
}

func (s *refStore) Get(_ context.Context, key string) (*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.lookup(key); r != nil {
		return s.snapshot(r), nil
	}
	return nil, nil
}

func (s *refStore) Ping(context.Context) error { return nil }

// List lists in key order; its cursor is "ref:" and the last key listed.
func (s *refStore) List(_ context.Context, q store.ListQuery) ([]store.Listed, string, error) {
	if q.Limit <= 0 {
		return nil, "", errors.New("limit not positive")
	}
	after, ok := "", true
	if q.Cursor != "" {
		after, ok = strings.CutPrefix(q.Cursor, "ref:")
		if !ok || !strings.HasPrefix(after, q.Prefix) {
			return nil, "", store.ErrBadCursor
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Listed
	examined, last := 0, ""
	for _, k := range slices.Sorted(maps.Keys(s.recs)) {
		if k <= after || !strings.HasPrefix(k, q.Prefix) {
			continue
		}
		if examined == q.Budget() {
			return out, "ref:" + last, nil
		}
		examined, last = examined+1, k
		r := s.lookup(k)
		if r == nil || !q.Matches(k, r.rec.State) {
			continue
		}
		if len(out) == q.Limit {
			return out, "ref:" + out[len(out)-1].Key, nil
		}
		l := store.Listed{Key: k, State: r.rec.State, CreatedAt: r.rec.CreatedAt, ExpiresAt: r.expires, LeaseExpiresAt: r.rec.LeaseExpiresAt}
		if r.rec.Response != nil {
			l.StoredStatus = r.rec.Response.Status
		}
		out = append(out, l)
	}
	return out, "", nil
}
