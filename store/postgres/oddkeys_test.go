package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestKeysNoTextColumnHolds: store keys are opaque strings, and the admin
// API builds them from any bytes of its URL (%00, %FF). PostgreSQL's text
// cannot hold a NUL byte or invalid UTF-8, so no record can exist under
// such a key: reading it finds none and a fenced change is not the
// owner's, as with Redis and Badger, instead of an error the admin API
// answers as "store unavailable" (503). Reserving it is an error.
func TestKeysNoTextColumnHolds(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{})
	c := ctx(t)
	resp := store.Response{Status: 200, BodyStored: true}
	for _, key := range []string{"r/-/a\x00b", "r/-/\xff\xfe", "r/-/\xc3"} {
		if rec, err := s.Get(c, key); err != nil || rec != nil {
			t.Errorf("Get(%q) = %+v, %v; want nil, nil", key, rec, err)
		}
		for _, w := range []struct {
			name string
			err  error
			want error
		}{
			{"Commit", s.Commit(c, key, "t", resp, time.Hour), store.ErrNotOwner},
			{"Release", s.Release(c, key, "t"), store.ErrNotOwner},
			{"MarkInDoubt", s.MarkInDoubt(c, key, "t", time.Hour), store.ErrNotOwner},
			{"ClaimLookup", s.ClaimLookup(c, key, "l", time.Minute, true), store.ErrNotInDoubt},
			{"ResolveLookup", s.ResolveLookup(c, key, "l", store.LookupResult{Release: true}), store.ErrNotOwner},
			{"ScheduleLookup", s.ScheduleLookup(c, key, time.Minute), nil},
			{"UnscheduleLookup", s.UnscheduleLookup(c, key), nil},
		} {
			if !errors.Is(w.err, w.want) || (w.want == nil && w.err != nil) {
				t.Errorf("%s(%q) = %v; want %v", w.name, key, w.err, w.want)
			}
		}
		if rec, err := s.Reserve(c, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err == nil {
			t.Errorf("Reserve(%q) = %+v, nil; want an error", key, rec)
		}
	}
}
