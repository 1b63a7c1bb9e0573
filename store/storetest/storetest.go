// Package storetest is the conformance suite every store.Store passes: one
// table of state-machine cases (reserve, commit, release, mark in doubt,
// lease and TTL expiry, delete, concurrency), each run as a subtest. A
// backend's own test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return newTestStore(t) })
//	}
//
// Every case works on keys of its own with a random suffix, so a constructor
// may return a fresh store each time or stores sharing one backend. Cases run
// in parallel. Nothing asserts how fast a store is: waits for expiry poll
// until a generous bound.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

const (
	// longLease and longTTL outlast any test.
	longLease = time.Minute
	longTTL   = 10 * time.Minute
	// shortLease is the lease of the expiry cases.
	shortLease = 300 * time.Millisecond
	// shortTTL is the TTL of the expiry cases; stores may round TTLs to
	// whole seconds (Badger does).
	shortTTL = time.Second
	// eventually bounds every wait for something time-driven to happen.
	eventually = 5 * time.Second
	// slack is the tolerance when comparing times a store reports with times
	// the test computed (clocks of another process, rounding to seconds).
	slack = 2 * time.Second
)

// env is what a case gets: a store, a key of its own, and helpers that fail
// the test on unexpected errors.
type env struct {
	t   *testing.T
	s   store.Store
	ctx context.Context
	key string
}

type testCase struct {
	name string
	run  func(e *env)
}

// Run runs the conformance suite against the stores newStore returns. It is
// called once per case, with the case's *testing.T.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	for _, tc := range slices.Concat(cases, originCases) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			if s == nil {
				t.Fatal("newStore returned nil")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			tc.run(&env{t: t, s: s, ctx: ctx, key: newKey(tc.name)})
		})
	}
}

var cases = []testCase{
	{"reserve on empty key", func(e *env) {
		before := time.Now()
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		after := time.Now()
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateInFlight, "tok-a", "fp-a")
		if rec.CreatedAt.Before(before.Add(-slack)) || rec.CreatedAt.After(after.Add(slack)) {
			e.t.Errorf("CreatedAt = %v, want between %v and %v", rec.CreatedAt, before, after)
		}
		if d := rec.LeaseExpiresAt.Sub(rec.CreatedAt); d < longLease-slack || d > longLease+slack {
			e.t.Errorf("LeaseExpiresAt - CreatedAt = %v, want about the lease %v", d, longLease)
		}
		e.wantExpiresWithin(rec, before, after, longTTL)
		if rec.Response != nil {
			e.t.Errorf("Response = %+v, want nil for an in-flight record", rec.Response)
		}
	}},
	{"reserve conflict returns the in-flight record", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		rec := e.reserve(e.key, "tok-b", "fp-b", longLease, longTTL)
		e.wantRecord(rec, store.StateInFlight, "tok-a", "fp-a")
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-a", "fp-a")
	}},
	{"reserve again with the same token is the caller's own (lost reply)", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		first := e.get(e.key)
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		again := e.get(e.key)
		e.wantRecord(again, store.StateInFlight, "tok-a", "fp-a")
		if !again.CreatedAt.Equal(first.CreatedAt) {
			e.t.Errorf("CreatedAt changed from %v to %v by the retried reservation", first.CreatedAt, again.CreatedAt)
		}
		// Another token still conflicts.
		e.wantRecord(e.reserve(e.key, "tok-b", "fp-b", longLease, longTTL), store.StateInFlight, "tok-a", "fp-a")
	}},
	{"commit by the owner", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		resp := sampleResponse()
		e.commit(e.key, "tok-a", resp, time.Hour, nil)
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateCompleted, "tok-a", "fp-a")
		e.wantResponse(rec, resp)
		if !rec.LeaseExpiresAt.IsZero() {
			e.t.Errorf("LeaseExpiresAt = %v, want zero for a completed record", rec.LeaseExpiresAt)
		}
		// The commit's TTL replaces the reservation's.
		if !rec.ExpiresAt.IsZero() && rec.ExpiresAt.Before(time.Now().Add(longTTL+slack)) {
			e.t.Errorf("ExpiresAt = %v, want about now + %v (the commit's TTL)", rec.ExpiresAt, time.Hour)
		}
		for _, tok := range []string{"tok-b", "tok-a"} {
			rec := e.reserve(e.key, tok, "fp-a", longLease, longTTL)
			e.wantRecord(rec, store.StateCompleted, "tok-a", "fp-a")
			e.wantResponse(rec, resp)
		}
	}},
	{"commit with a wrong token", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.commit(e.key, "tok-b", sampleResponse(), time.Hour, store.ErrNotOwner)
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateInFlight, "tok-a", "fp-a")
		if rec.Response != nil {
			e.t.Errorf("Response = %+v after a refused commit, want nil", rec.Response)
		}
	}},
	{"fenced operations on a missing key", func(e *env) {
		e.commit(e.key, "tok-a", sampleResponse(), time.Hour, store.ErrNotOwner)
		e.release(e.key, "tok-a", store.ErrNotOwner)
		e.markInDoubt(e.key, "tok-a", time.Hour, store.ErrNotOwner)
		e.wantNoRecord(e.key)
	}},
	{"release by the owner frees the key", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.release(e.key, "tok-a", nil)
		e.wantNoRecord(e.key)
		e.reserveOK(e.key, "tok-b", "fp-b", longLease, longTTL)
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-b", "fp-b")
	}},
	{"release with a wrong token", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.release(e.key, "tok-b", store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-a", "fp-a")
	}},
	{"a former owner cannot touch a newer owner's record", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.release(e.key, "tok-a", nil)
		e.reserveOK(e.key, "tok-b", "fp-b", longLease, longTTL)
		e.commit(e.key, "tok-a", sampleResponse(), time.Hour, store.ErrNotOwner)
		e.markInDoubt(e.key, "tok-a", time.Hour, store.ErrNotOwner)
		e.release(e.key, "tok-a", store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-b", "fp-b")
		// B still owns it.
		e.commit(e.key, "tok-b", sampleResponse(), time.Hour, nil)
		e.wantRecord(e.get(e.key), store.StateCompleted, "tok-b", "fp-b")
	}},
	{"mark in doubt", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.markInDoubt(e.key, "tok-a", time.Hour, nil)
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateInDoubt, "tok-a", "fp-a")
		if !rec.LeaseExpiresAt.IsZero() {
			e.t.Errorf("LeaseExpiresAt = %v, want zero for an in-doubt record", rec.LeaseExpiresAt)
		}
		if !rec.ExpiresAt.IsZero() && rec.ExpiresAt.Before(time.Now().Add(longTTL+slack)) {
			e.t.Errorf("ExpiresAt = %v, want about now + %v (mark in doubt's TTL)", rec.ExpiresAt, time.Hour)
		}
		for _, tok := range []string{"tok-b", "tok-a"} {
			e.wantRecord(e.reserve(e.key, tok, "fp-a", longLease, longTTL), store.StateInDoubt, "tok-a", "fp-a")
		}
	}},
	{"mark in doubt with a wrong token", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.markInDoubt(e.key, "tok-b", time.Hour, store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-a", "fp-a")
	}},
	{"lease expiry turns the reservation in doubt", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", shortLease, longTTL)
		rec := e.waitFor(func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
		e.wantRecord(rec, store.StateInDoubt, "tok-a", "fp-a")
		if !rec.LeaseExpiresAt.IsZero() {
			e.t.Errorf("LeaseExpiresAt = %v, want zero for an in-doubt record", rec.LeaseExpiresAt)
		}
		// Neither another request nor the former owner's retry may forward.
		for _, tok := range []string{"tok-b", "tok-a"} {
			e.wantRecord(e.reserve(e.key, tok, "fp-a", longLease, longTTL), store.StateInDoubt, "tok-a", "fp-a")
		}
		// The record is kept for its TTL, not dropped with the lease.
		if !rec.ExpiresAt.IsZero() && rec.ExpiresAt.Before(time.Now().Add(longTTL/2)) {
			e.t.Errorf("ExpiresAt = %v, want the reservation's TTL %v to still hold", rec.ExpiresAt, longTTL)
		}
	}},
	{"late commit after the lease ran out stores the known answer", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", shortLease, longTTL)
		e.waitFor(func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
		resp := sampleResponse()
		e.commit(e.key, "tok-a", resp, time.Hour, nil)
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateCompleted, "tok-a", "fp-a")
		e.wantResponse(rec, resp)
	}},
	{"TTL expiry forgets the record", func(e *env) {
		type step struct {
			name   string
			settle func(key string) // brings key into the state under test
		}
		steps := []step{
			{"in_flight", func(string) {}},
			{"completed", func(key string) { e.commit(key, "tok-a", sampleResponse(), shortTTL, nil) }},
			{"in_doubt", func(key string) { e.markInDoubt(key, "tok-a", shortTTL, nil) }},
		}
		for _, st := range steps {
			key := e.key + "/" + st.name
			e.reserveOK(key, "tok-a", "fp-a", shortLease, shortTTL)
			st.settle(key)
		}
		deadline := time.Now().Add(eventually)
		for _, st := range steps {
			key := e.key + "/" + st.name
			for e.getOrNil(key) != nil {
				if time.Now().After(deadline) {
					e.t.Fatalf("%s: record of %s still there %v after its TTL of %v", st.name, key, eventually, shortTTL)
				}
				time.Sleep(50 * time.Millisecond)
			}
			e.reserveOK(key, "tok-b", "fp-b", longLease, longTTL)
		}
	}},
	{"release by the owner token in every state (operator release)", func(e *env) {
		type step struct {
			name   string
			settle func(key string)
			want   store.State
		}
		steps := []step{
			{"in_flight", func(string) {}, store.StateInFlight},
			{"completed", func(key string) { e.commit(key, "tok-a", sampleResponse(), time.Hour, nil) }, store.StateCompleted},
			{"in_doubt", func(key string) { e.markInDoubt(key, "tok-a", time.Hour, nil) }, store.StateInDoubt},
		}
		for _, st := range steps {
			key := e.key + "/" + st.name
			e.reserveOK(key, "tok-a", "fp-a", longLease, longTTL)
			st.settle(key)
			e.wantRecord(e.get(key), st.want, "tok-a", "fp-a")
			e.release(key, "tok-b", store.ErrNotOwner)
			e.release(key, "tok-a", nil)
			e.wantNoRecord(key)
			// The former owner is fenced off, and the key is free.
			e.commit(key, "tok-a", sampleResponse(), time.Hour, store.ErrNotOwner)
			e.reserveOK(key, "tok-b", "fp-b", longLease, longTTL)
		}
	}},
	{"response without a stored body round-trips", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		resp := store.Response{
			Status:     http.StatusOK,
			Header:     http.Header{"Content-Type": {"application/json"}},
			BodyStored: false,
		}
		e.commit(e.key, "tok-a", resp, time.Hour, nil)
		rec := e.get(e.key)
		e.wantResponse(rec, resp)
		if rec.Response != nil && rec.Response.BodyStored {
			e.t.Errorf("BodyStored = true, want false")
		}
	}},
	{"large body round-trips", func(e *env) {
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		body := make([]byte, 1<<20)
		_, _ = rand.Read(body)
		resp := store.Response{Status: http.StatusCreated, Body: body, BodyStored: true}
		e.commit(e.key, "tok-a", resp, time.Hour, nil)
		e.wantResponse(e.get(e.key), resp)
		e.wantResponse(e.reserve(e.key, "tok-b", "fp-a", longLease, longTTL), resp)
	}},
	{"concurrent reservations of one key: exactly one wins", func(e *env) {
		const n = 64
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			recs    = make([]*store.Record, n)
			errs    = make([]error, n)
			winners []int
		)
		for i := range n {
			wg.Go(func() {
				<-start
				recs[i], errs[i] = e.s.Reserve(e.ctx, e.key, store.Reservation{
					Token: fmt.Sprintf("tok-%d", i), Fingerprint: "fp", Lease: longLease, TTL: longTTL,
				})
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				e.t.Fatalf("Reserve #%d: %v", i, errs[i])
			}
			if recs[i] == nil {
				winners = append(winners, i)
			}
		}
		if len(winners) != 1 {
			e.t.Fatalf("%d reservations won (%v), want exactly 1", len(winners), winners)
		}
		winner := fmt.Sprintf("tok-%d", winners[0])
		for i, rec := range recs {
			if rec != nil {
				e.wantRecord(rec, store.StateInFlight, winner, "fp")
				if e.t.Failed() {
					e.t.Fatalf("loser #%d saw %+v", i, rec)
				}
			}
		}
		e.wantRecord(e.get(e.key), store.StateInFlight, winner, "fp")
	}},
	{"concurrent reservations of different keys all win", func(e *env) {
		const n = 64
		var wg sync.WaitGroup
		recs := make([]*store.Record, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				recs[i], errs[i] = e.s.Reserve(e.ctx, fmt.Sprintf("%s/%d", e.key, i), store.Reservation{
					Token: fmt.Sprintf("tok-%d", i), Fingerprint: "fp", Lease: longLease, TTL: longTTL,
				})
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || recs[i] != nil {
				e.t.Errorf("Reserve of key #%d = %+v, %v; want nil, nil", i, recs[i], errs[i])
			}
		}
		for i := range n {
			e.wantRecord(e.get(fmt.Sprintf("%s/%d", e.key, i)), store.StateInFlight, fmt.Sprintf("tok-%d", i), "fp")
		}
	}},
}

func (e *env) reserve(key, token, fp string, lease, ttl time.Duration) *store.Record {
	e.t.Helper()
	rec, err := e.s.Reserve(e.ctx, key, store.Reservation{Token: token, Fingerprint: fp, Lease: lease, TTL: ttl})
	if err != nil {
		e.t.Fatalf("Reserve(%q, token %q): %v", key, token, err)
	}
	if rec == nil {
		e.t.Fatalf("Reserve(%q, token %q) = nil (reserved), want an existing record", key, token)
	}
	return rec
}

func (e *env) reserveOK(key, token, fp string, lease, ttl time.Duration) {
	e.t.Helper()
	rec, err := e.s.Reserve(e.ctx, key, store.Reservation{Token: token, Fingerprint: fp, Lease: lease, TTL: ttl})
	if err != nil || rec != nil {
		e.t.Fatalf("Reserve(%q, token %q) = %+v, %v; want nil, nil (reserved)", key, token, rec, err)
	}
}

func (e *env) commit(key, token string, resp store.Response, ttl time.Duration, want error) {
	e.t.Helper()
	if err := e.s.Commit(e.ctx, key, token, resp, ttl); !errors.Is(err, want) || (want == nil && err != nil) {
		e.t.Fatalf("Commit(%q, token %q) = %v, want %v", key, token, err, want)
	}
}

func (e *env) release(key, token string, want error) {
	e.t.Helper()
	if err := e.s.Release(e.ctx, key, token); !errors.Is(err, want) || (want == nil && err != nil) {
		e.t.Fatalf("Release(%q, token %q) = %v, want %v", key, token, err, want)
	}
}

func (e *env) markInDoubt(key, token string, ttl time.Duration, want error) {
	e.t.Helper()
	if err := e.s.MarkInDoubt(e.ctx, key, token, ttl); !errors.Is(err, want) || (want == nil && err != nil) {
		e.t.Fatalf("MarkInDoubt(%q, token %q) = %v, want %v", key, token, err, want)
	}
}

func (e *env) getOrNil(key string) *store.Record {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, key)
	if err != nil {
		e.t.Fatalf("Get(%q): %v", key, err)
	}
	return rec
}

func (e *env) get(key string) *store.Record {
	e.t.Helper()
	rec := e.getOrNil(key)
	if rec == nil {
		e.t.Fatalf("Get(%q) = nil, want a record", key)
	}
	return rec
}

func (e *env) wantNoRecord(key string) {
	e.t.Helper()
	if rec := e.getOrNil(key); rec != nil {
		e.t.Fatalf("Get(%q) = %+v, want nil", key, rec)
	}
}

// waitFor polls Get on e.key until ok accepts the record, within eventually.
func (e *env) waitFor(ok func(*store.Record) bool) *store.Record {
	e.t.Helper()
	return e.waitForKey(e.key, ok)
}

func (e *env) wantRecord(rec *store.Record, state store.State, token, fp string) {
	e.t.Helper()
	if rec == nil {
		e.t.Fatalf("record = nil, want %s", state)
	}
	if rec.State != state {
		e.t.Errorf("State = %q, want %q", rec.State, state)
	}
	if rec.Token != token {
		e.t.Errorf("Token = %q, want %q", rec.Token, token)
	}
	if rec.Fingerprint != fp {
		e.t.Errorf("Fingerprint = %q, want %q", rec.Fingerprint, fp)
	}
	if rec.CreatedAt.IsZero() {
		e.t.Errorf("CreatedAt is zero")
	}
	if state == store.StateInFlight && !rec.LeaseExpiresAt.After(rec.CreatedAt) {
		e.t.Errorf("LeaseExpiresAt = %v, want after CreatedAt %v", rec.LeaseExpiresAt, rec.CreatedAt)
	}
	if state != store.StateCompleted && rec.Response != nil {
		e.t.Errorf("Response = %+v, want nil for a %s record", rec.Response, state)
	}
}

func (e *env) wantResponse(rec *store.Record, want store.Response) {
	e.t.Helper()
	if rec == nil || rec.Response == nil {
		e.t.Fatalf("record %+v has no response, want one", rec)
	}
	got := rec.Response
	if got.Status != want.Status {
		e.t.Errorf("Response.Status = %d, want %d", got.Status, want.Status)
	}
	if len(got.Header) != 0 || len(want.Header) != 0 {
		if !reflect.DeepEqual(got.Header, want.Header) {
			e.t.Errorf("Response.Header = %v, want %v", got.Header, want.Header)
		}
	}
	if !bytes.Equal(got.Body, want.Body) {
		e.t.Errorf("Response.Body = %d bytes %.40q, want %d bytes %.40q", len(got.Body), got.Body, len(want.Body), want.Body)
	}
	if got.BodyStored != want.BodyStored {
		e.t.Errorf("Response.BodyStored = %v, want %v", got.BodyStored, want.BodyStored)
	}
	if (len(got.Trailer) != 0 || len(want.Trailer) != 0) && !reflect.DeepEqual(got.Trailer, want.Trailer) {
		e.t.Errorf("Response.Trailer = %v, want %v", got.Trailer, want.Trailer)
	}
}

// wantExpiresWithin checks a reported ExpiresAt (zero: not reported) against
// a record written between before and after with ttl.
func (e *env) wantExpiresWithin(rec *store.Record, before, after time.Time, ttl time.Duration) {
	e.t.Helper()
	if rec.ExpiresAt.IsZero() {
		return
	}
	lo, hi := before.Add(ttl-slack), after.Add(ttl+slack)
	if rec.ExpiresAt.Before(lo) || rec.ExpiresAt.After(hi) {
		e.t.Errorf("ExpiresAt = %v, want between %v and %v", rec.ExpiresAt, lo, hi)
	}
}

func sampleResponse() store.Response {
	return store.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/charges/42"},
			"X-Multi":      {"one", "two"},
		},
		Body:       []byte(`{"id":42,"amount":"12.50"}`),
		BodyStored: true,
		Trailer:    http.Header{"X-Checksum": {"sha256=abc"}, "Server-Timing": {"db;dur=5", "app;dur=9"}},
	}
}

// newKey returns a key shaped like the proxy's (route/scope/key) that no
// other case or run uses.
func newKey(name string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return fmt.Sprintf("storetest/%x/%s", b, hex.EncodeToString([]byte(name))[:16])
}
