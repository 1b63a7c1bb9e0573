package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// packedValues counts the MessagePack values of the packed record at the
// full key k, as the scripts unpack it.
const packedValues = `return select('#', cmsgpack.unpack(redis.call('GET', KEYS[1])))`

// TestOriginInBothLayouts: the origin is the packed record's eighth value,
// and the hash's field og, each only when there is one (a record without
// it is written as before origins were kept); a record of one layout
// changed by a replica of the other keeps it.
func TestOriginInBothLayouts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	prefix := fmt.Sprintf("origin%d:", prefixes.Add(1))
	stores := map[RecordLayout]*Store{
		layoutPacked: newStore(t, Options{Addrs: []string{srv.Addr()}, KeyPrefix: prefix}),
		layoutHash:   newStore(t, Options{Addrs: []string{srv.Addr()}, KeyPrefix: prefix, RecordLayout: layoutHash}),
	}
	// stored returns the origin as the record under key holds it, and
	// whether it holds one at all.
	stored := func(key string) (string, bool) {
		t.Helper()
		k := prefix + key
		switch typ := raw.Type(c, k).Val(); typ {
		case "string":
			n, err := raw.Eval(c, packedValues, []string{k}).Int()
			if err != nil {
				t.Fatal(err)
			}
			p, err := decodePacked(raw.Get(c, k).Val())
			if err != nil {
				t.Fatal(err)
			}
			if n != 7 && n != 8 {
				t.Errorf("%s packs %d values, want 7, or 8 with an origin", key, n)
			}
			return p.og, n == 8
		case "hash":
			og, err := raw.HGet(c, k, "og").Result()
			return og, err == nil
		default:
			t.Fatalf("%s is a %q", key, typ)
			return "", false
		}
	}
	type change struct {
		name string
		do   func(s *Store, key string) error
		want store.State
	}
	changes := []change{
		{"reserved", func(*Store, string) error { return nil }, store.StateInFlight},
		{"committed", func(s *Store, key string) error {
			return s.Commit(c, key, "tok-a", store.Response{Status: 201, BodyStored: true}, time.Hour)
		}, store.StateCompleted},
		{"marked in doubt", func(s *Store, key string) error { return s.MarkInDoubt(c, key, "tok-a", time.Hour) }, store.StateInDoubt},
	}
	for _, writer := range []RecordLayout{layoutPacked, layoutHash} {
		for _, changer := range []RecordLayout{layoutPacked, layoutHash} {
			for _, ch := range changes {
				for _, og := range []string{storetest.Origin, ""} {
					name := fmt.Sprintf("%s writes, %s %s, origin %q", writer, ch.name, changer, og)
					key := fmt.Sprintf("charges/-/%s-%s-%s-%d", writer, changer, ch.name, len(og))
					res := store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: time.Minute, TTL: time.Hour, Origin: og}
					if rec, err := stores[writer].Reserve(c, key, res); err != nil || rec != nil {
						t.Fatalf("%s: Reserve = %+v, %v; want reserved", name, rec, err)
					}
					if err := ch.do(stores[changer], key); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if got, has := stored(key); got != og || has != (og != "") {
						t.Errorf("%s: stored origin %q (present %v), want %q", name, got, has, og)
					}
					for _, l := range []RecordLayout{layoutPacked, layoutHash} {
						rec, err := stores[l].Get(c, key)
						if err != nil || rec == nil || rec.State != ch.want || rec.Origin != og {
							t.Errorf("%s: Get by %s = %+v, %v; want %s with origin %q", name, l, rec, err, ch.want, og)
						}
					}
				}
			}
		}
	}
}

// TestRecordsOfEarlierReleasesHaveNoOrigin: a hash the release before
// origins wrote (testdata/hash-records.txt) and a record packed without
// the eighth value are read, reserved against, committed, marked in doubt
// and reconciled with an empty origin.
func TestRecordsOfEarlierReleasesHaveNoOrigin(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	loadFixture(t, raw, "hash-records.txt", s.prefix)
	// Packed as the scripts did before origins: seven values.
	rt, err := raw.Time(c).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := rt.UnixMilli()
	for key, lease := range map[string]int64{"charges/-/PACKED-INFLIGHT": now + 60_000, "charges/-/PACKED-LAPSED": now - 1} {
		err := raw.Eval(c, `redis.call('SET', KEYS[1], cmsgpack.pack(1, 'in_flight', ARGV[1], 'fp', tonumber(ARGV[2]), tonumber(ARGV[3]), ''), 'PX', 3600000) return 1`,
			[]string{s.prefix + key}, "tok-"+key, now, lease).Err()
		if err != nil {
			t.Fatal(err)
		}
	}
	wantNone := func(what, key string, want store.State) {
		t.Helper()
		storetest.WantNoOrigin(t, c, s, what, key, want)
	}
	wantNone("read", "charges/-/ORD-INFLIGHT", store.StateInFlight)
	wantNone("read", "charges/-/ORD-DONE", store.StateCompleted)
	wantNone("read", "charges/-/ORD-LAPSED", store.StateInDoubt)
	wantNone("read", "charges/-/PACKED-INFLIGHT", store.StateInFlight)
	wantNone("read", "charges/-/PACKED-LAPSED", store.StateInDoubt)

	if err := s.Commit(c, "charges/-/ORD-INFLIGHT", "tok-inflight", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantNone("committed", "charges/-/ORD-INFLIGHT", store.StateCompleted)
	if err := s.MarkInDoubt(c, "charges/-/ORD-MARK", "tok-mark", time.Hour); err != nil {
		t.Fatal(err)
	}
	wantNone("marked in doubt", "charges/-/ORD-MARK", store.StateInDoubt)
	if err := s.Commit(c, "charges/-/PACKED-INFLIGHT", "tok-charges/-/PACKED-INFLIGHT", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantNone("committed", "charges/-/PACKED-INFLIGHT", store.StateCompleted)
	for _, key := range []string{"charges/-/ORD-LAPSED", "charges/-/PACKED-LAPSED"} {
		if err := s.ClaimLookup(c, key, "look", time.Minute, true); err != nil {
			t.Fatal(err)
		}
		applied := store.Response{Status: 201, BodyStored: true, Reconciled: true}
		if err := s.ResolveLookup(c, key, "look", store.LookupResult{Applied: &applied}); err != nil {
			t.Fatal(err)
		}
		wantNone("reconciled", key, store.StateCompleted)
	}
}
