package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Origin is a Reservation.Origin as the proxy sends it: a trace ID and a
// span ID, "<32 hex>-<16 hex>".
const Origin = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"

// reserveOrigin reserves key for tok-a with origin o and the lease lease.
func (e *env) reserveOrigin(key, o string, lease time.Duration) {
	e.t.Helper()
	rec, err := e.s.Reserve(e.ctx, key, store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: lease, TTL: longTTL, Origin: o})
	if err != nil || rec != nil {
		e.t.Fatalf("Reserve(%q, origin %q) = %+v, %v; want nil, nil (reserved)", key, o, rec, err)
	}
}

// wantOrigin checks the Origin of rec, as what says it was read.
func (e *env) wantOrigin(what string, rec *store.Record, want string) {
	e.t.Helper()
	if rec == nil {
		e.t.Fatalf("%s: record = nil, want one with origin %q", what, want)
	}
	if rec.Origin != want {
		e.t.Errorf("%s: Origin = %q, want %q", what, rec.Origin, want)
	}
}

// WantNoOrigin checks that key, in s, is a record in the state want
// without an origin, as a record a release before origins wrote must
// stay (what says what was done to it): read, and returned to another
// reservation, which carries an origin of its own.
func WantNoOrigin(t testing.TB, ctx context.Context, s store.Store, what, key string, want store.State) {
	t.Helper()
	rec, err := s.Get(ctx, key)
	if err != nil || rec == nil || rec.State != want || rec.Origin != "" {
		t.Errorf("%s: Get(%s) = %+v, %v; want %s without origin", what, key, rec, err, want)
	}
	other := store.Reservation{Token: "other", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Origin: Origin}
	if rec, err := s.Reserve(ctx, key, other); err != nil || rec == nil || rec.Origin != "" {
		t.Errorf("%s: Reserve(%s) = %+v, %v; want the record, without origin", what, key, rec, err)
	}
}

// originCases are the cases of Reservation.Origin, part of cases.
var originCases = []testCase{
	{"origin is kept with the record in every state", func(e *env) {
		for _, o := range []string{Origin, ""} {
			type step struct {
				name   string
				lease  time.Duration
				settle func(key string) // brings key into the state under test
				want   store.State
			}
			steps := []step{
				{"in_flight", longLease, func(string) {}, store.StateInFlight},
				{"completed", longLease, func(key string) { e.commit(key, "tok-a", sampleResponse(), time.Hour, nil) }, store.StateCompleted},
				{"in_doubt", longLease, func(key string) { e.markInDoubt(key, "tok-a", time.Hour, nil) }, store.StateInDoubt},
				{"lapsed", shortLease, func(key string) {}, store.StateInDoubt},
				{"lapsed, then committed", shortLease, func(key string) {
					e.waitForKey(key, func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
					e.commit(key, "tok-a", sampleResponse(), time.Hour, nil)
				}, store.StateCompleted},
			}
			for _, st := range steps {
				key := e.key + "/" + st.name + "/" + o
				e.reserveOrigin(key, o, st.lease)
				st.settle(key)
				rec := e.waitForKey(key, func(r *store.Record) bool { return r != nil && r.State == st.want })
				e.wantOrigin("Get of a "+st.name+" record", rec, o)
				// Another request, and the owner's own retry once the
				// record is not in flight, get the record with its origin.
				e.wantOrigin("Reserve of a "+st.name+" record", e.reserve(key, "tok-b", "fp-a", longLease, longTTL), o)
				if st.want != store.StateInFlight {
					e.wantOrigin("the owner's Reserve of a "+st.name+" record", e.reserve(key, "tok-a", "fp-a", longLease, longTTL), o)
				}
			}
		}
	}},
	{"a reservation after a release or expiry has its own origin", func(e *env) {
		e.reserveOrigin(e.key, Origin, longLease)
		e.release(e.key, "tok-a", nil)
		e.reserveOK(e.key, "tok-b", "fp-b", longLease, longTTL)
		e.wantOrigin("Get after a release and a reservation without origin", e.get(e.key), "")

		expired := e.key + "/expired"
		rec, err := e.s.Reserve(e.ctx, expired, store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: shortLease, TTL: shortTTL, Origin: Origin})
		if err != nil || rec != nil {
			e.t.Fatalf("Reserve(%q) = %+v, %v; want nil, nil (reserved)", expired, rec, err)
		}
		e.waitForKey(expired, func(r *store.Record) bool { return r == nil })
		e.reserveOK(expired, "tok-b", "fp-b", longLease, longTTL)
		e.wantOrigin("Get after an expiry and a reservation without origin", e.get(expired), "")
	}},
	{"an origin longer than MaxOriginLen is refused", func(e *env) {
		long := strings.Repeat("a", store.MaxOriginLen+1)
		rec, err := e.s.Reserve(e.ctx, e.key, store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: longLease, TTL: longTTL, Origin: long})
		if !errors.Is(err, store.ErrOriginTooLong) {
			e.t.Errorf("Reserve with a %d-byte origin = %+v, %v; want ErrOriginTooLong", len(long), rec, err)
		}
		e.wantNoRecord(e.key)
		longest := strings.Repeat("b", store.MaxOriginLen)
		e.reserveOrigin(e.key, longest, longLease)
		e.wantOrigin("Get of a record with the longest origin", e.get(e.key), longest)
	}},
}

// waitForKey polls Get on key until ok accepts the record, within
// eventually.
func (e *env) waitForKey(key string, ok func(*store.Record) bool) *store.Record {
	e.t.Helper()
	deadline := time.Now().Add(eventually)
	for {
		rec := e.getOrNil(key)
		if ok(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Get(%q) = %+v, still not the awaited record after %v", key, rec, eventually)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// originReconcileCases are the reconcile cases of Reservation.Origin, part
// of reconcileCases.
var originReconcileCases = []reconcileCase{
	{"a lookup keeps the origin: scheduled, claimed, retried and applied", func(e *renv) {
		for _, o := range []string{Origin, ""} {
			e.key = newKey("origin lookup " + o)
			e.reserveOrigin(e.key, o, shortLease)
			e.waitFor(func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
			e.schedule(longLease)
			e.wantOrigin("Get of a lapsed record scheduled for a lookup", e.get(e.key), o)
			e.claim("look-1", longLease, true, nil)
			e.wantOrigin("Get of a record whose lookup is claimed", e.get(e.key), o)
			e.resolve("look-1", store.LookupResult{RetryAfter: longLease}, nil)
			e.wantOrigin("Get of a record whose lookup is retried", e.get(e.key), o)
			e.claim("look-2", longLease, true, nil)
			resp := sampleResponse()
			resp.Reconciled = true
			e.resolve("look-2", store.LookupResult{Applied: &resp}, nil)
			rec := e.get(e.key)
			e.wantRecord(rec, store.StateCompleted, "tok-a", "fp-a")
			e.wantOrigin("Get of a record a lookup completed", rec, o)
			e.wantOrigin("Reserve of a record a lookup completed", e.reserve(e.key, "tok-b", "fp-a", longLease, longTTL), o)
		}
	}},
}
