package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// ReconcileStore is a store that can also reconcile in-doubt keys.
type ReconcileStore interface {
	store.Store
	store.ReconcileStore
}

// renv is what a reconcile case gets.
type renv struct {
	*env
	rs store.ReconcileStore
}

type reconcileCase struct {
	name string
	run  func(e *renv)
}

// RunReconcile runs the reconcile cases (the lookup schedule and the
// fenced lookup lease) against the stores newStore returns, like Run.
func RunReconcile(t *testing.T, newStore func(t *testing.T) ReconcileStore) {
	for _, tc := range slices.Concat(reconcileCases, originReconcileCases) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			tc.run(&renv{env: &env{t: t, s: s, ctx: ctx, key: newKey(tc.name)}, rs: s})
		})
	}
}

// inDoubt leaves e.key in doubt under tok-a.
func (e *renv) inDoubt() {
	e.t.Helper()
	e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
	e.markInDoubt(e.key, "tok-a", longTTL, nil)
}

func (e *renv) schedule(after time.Duration) {
	e.t.Helper()
	if err := e.rs.ScheduleLookup(e.ctx, e.key, after); err != nil {
		e.t.Fatalf("ScheduleLookup(%q, %v): %v", e.key, after, err)
	}
}

func (e *renv) claim(token string, lease time.Duration, force bool, want error) {
	e.t.Helper()
	if err := e.rs.ClaimLookup(e.ctx, e.key, token, lease, force); !errors.Is(err, want) || (want == nil && err != nil) {
		e.t.Fatalf("ClaimLookup(%q, %q, force %v) = %v, want %v", e.key, token, force, err, want)
	}
}

func (e *renv) resolve(token string, res store.LookupResult, want error) {
	e.t.Helper()
	if err := e.rs.ResolveLookup(e.ctx, e.key, token, res); !errors.Is(err, want) || (want == nil && err != nil) {
		e.t.Fatalf("ResolveLookup(%q, %q, %+v) = %v, want %v", e.key, token, res, err, want)
	}
}

// listed reports whether list (DueLookups or Unscheduled) holds e.key.
func (e *renv) listed(list func(context.Context, int) ([]string, error)) bool {
	e.t.Helper()
	keys, err := list(e.ctx, 100000)
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	return slices.Contains(keys, e.key)
}

// unscheduled is Unscheduled for the suite's keys ("storetest/...").
func (e *renv) unscheduled(ctx context.Context, limit int) ([]string, error) {
	return e.rs.Unscheduled(ctx, "storetest/", limit)
}

// waitDue polls DueLookups until it lists e.key.
func (e *renv) waitDue() {
	e.t.Helper()
	for deadline := time.Now().Add(eventually); !e.listed(e.rs.DueLookups); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("DueLookups never listed %q within %v", e.key, eventually)
		}
	}
}

var reconcileCases = []reconcileCase{
	{"an in-doubt key is unscheduled until scheduled, then due after the delay", func(e *renv) {
		e.inDoubt()
		if !e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled does not list a key marked in doubt")
		}
		other := func(ctx context.Context, limit int) ([]string, error) { return e.rs.Unscheduled(ctx, "other/", limit) }
		if e.listed(other) {
			e.t.Errorf("Unscheduled with another route's prefix lists the key")
		}
		e.schedule(shortLease)
		if e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled still lists a scheduled key")
		}
		e.claim("look-1", longLease, false, store.ErrNotDue)
		e.waitDue()
		// Scheduling again does not move the lookup.
		e.schedule(longTTL)
		if !e.listed(e.rs.DueLookups) {
			e.t.Errorf("a second ScheduleLookup moved the due lookup")
		}
		e.claim("look-1", longLease, false, nil)
		if e.listed(e.rs.DueLookups) {
			e.t.Errorf("DueLookups lists a key whose lookup is claimed")
		}
	}},
	{"applied completes the record with the lookup's answer, marked reconciled", func(e *renv) {
		e.inDoubt()
		e.claim("look-1", longLease, true, nil)
		resp := sampleResponse()
		resp.Reconciled = true
		e.resolve("look-1", store.LookupResult{Applied: &resp}, nil)
		rec := e.get(e.key)
		e.wantRecord(rec, store.StateCompleted, "tok-a", "fp-a")
		e.wantResponse(rec, resp)
		if !rec.Response.Reconciled {
			e.t.Errorf("Response.Reconciled = false after an applied lookup")
		}
		if rec.ExpiresAt.IsZero() == false && rec.ExpiresAt.Before(time.Now().Add(longTTL-slack)) {
			e.t.Errorf("ExpiresAt = %v, want the in-doubt record's expiry kept", rec.ExpiresAt)
		}
		e.claim("look-2", longLease, true, store.ErrNotInDoubt)
		e.resolve("look-1", store.LookupResult{Release: true}, store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateCompleted, "tok-a", "fp-a")
	}},
	{"release deletes the record, and a new reservation goes through", func(e *renv) {
		e.inDoubt()
		e.claim("look-1", longLease, true, nil)
		e.resolve("look-1", store.LookupResult{Release: true}, nil)
		e.wantNoRecord(e.key)
		e.reserveOK(e.key, "tok-b", "fp-a", longLease, longTTL)
		// A late resolve of the old lookup cannot touch the new owner.
		e.resolve("look-1", store.LookupResult{Release: true}, store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateInFlight, "tok-b", "fp-a")
	}},
	{"one lookup at a time: a live lookup lease refuses another claim", func(e *renv) {
		e.inDoubt()
		e.claim("look-1", longLease, true, nil)
		e.claim("look-2", longLease, true, store.ErrLookupBusy)
		e.resolve("look-2", store.LookupResult{Release: true}, store.ErrNotOwner)
		e.wantRecord(e.get(e.key), store.StateInDoubt, "tok-a", "fp-a")
	}},
	{"a lapsed lookup lease can be taken over, fencing the old one", func(e *renv) {
		e.inDoubt()
		e.claim("look-1", shortLease, true, nil)
		deadline := time.Now().Add(eventually)
		for e.rs.ClaimLookup(e.ctx, e.key, "look-2", longLease, true) != nil {
			if time.Now().After(deadline) {
				e.t.Fatalf("the lapsed lookup lease was never taken over")
			}
			time.Sleep(50 * time.Millisecond)
		}
		e.resolve("look-1", store.LookupResult{Release: true}, store.ErrNotOwner)
		e.resolve("look-2", store.LookupResult{RetryAfter: longLease}, nil)
		e.wantRecord(e.get(e.key), store.StateInDoubt, "tok-a", "fp-a")
	}},
	{"retry keeps the key in doubt and reschedules it", func(e *renv) {
		e.inDoubt()
		e.claim("look-1", longLease, true, nil)
		e.resolve("look-1", store.LookupResult{RetryAfter: shortLease}, nil)
		e.wantRecord(e.get(e.key), store.StateInDoubt, "tok-a", "fp-a")
		e.claim("look-2", longLease, false, store.ErrNotDue)
		e.waitDue()
		e.claim("look-2", longLease, false, nil)
	}},
	{"a lapsed reservation is in doubt for reconciliation; its owner can still commit", func(e *renv) {
		e.reserveOK(e.key, "tok-a", "fp-a", shortLease, longTTL)
		e.claim("look-1", longLease, true, store.ErrNotInDoubt)
		if e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled lists a live reservation")
		}
		e.waitFor(func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
		if !e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled does not list a lapsed reservation")
		}
		e.schedule(longTTL)
		e.wantRecord(e.get(e.key), store.StateInDoubt, "tok-a", "fp-a")
		e.commit(e.key, "tok-a", sampleResponse(), time.Hour, nil)
		e.wantRecord(e.get(e.key), store.StateCompleted, "tok-a", "fp-a")
		e.claim("look-1", longLease, true, store.ErrNotInDoubt)
	}},
	{"completed and missing records are never scheduled or claimed", func(e *renv) {
		e.schedule(0)
		e.claim("look-1", longLease, true, store.ErrNotInDoubt)
		e.wantNoRecord(e.key)
		e.reserveOK(e.key, "tok-a", "fp-a", longLease, longTTL)
		e.commit(e.key, "tok-a", sampleResponse(), time.Hour, nil)
		e.schedule(0)
		if e.listed(e.rs.DueLookups) || e.listed(e.unscheduled) {
			e.t.Errorf("a completed record is listed for reconciliation")
		}
		e.claim("look-1", longLease, true, store.ErrNotInDoubt)
	}},
	{"a due key settled by its owner, or released and reserved again, is no longer due", func(e *renv) {
		e.inDoubt()
		e.schedule(0)
		e.waitDue()
		e.commit(e.key, "tok-a", sampleResponse(), time.Hour, nil)
		if e.listed(e.rs.DueLookups) {
			e.t.Errorf("DueLookups lists a key its owner committed")
		}
		e.release(e.key, "tok-a", nil)
		e.reserveOK(e.key, "tok-b", "fp-b", shortLease, longTTL)
		e.waitFor(func(r *store.Record) bool { return r != nil && r.State == store.StateInDoubt })
		if e.listed(e.rs.DueLookups) {
			e.t.Errorf("DueLookups lists a new, unscheduled reservation under a key once due")
		}
		if !e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled does not list the new lapsed reservation")
		}
	}},
	{"unschedule takes the key off the schedule", func(e *renv) {
		e.inDoubt()
		e.schedule(0)
		e.waitDue()
		if err := e.rs.UnscheduleLookup(e.ctx, e.key); err != nil {
			e.t.Fatal(err)
		}
		if e.listed(e.rs.DueLookups) {
			e.t.Errorf("DueLookups lists an unscheduled key")
		}
		if !e.listed(e.unscheduled) {
			e.t.Errorf("Unscheduled does not list the unscheduled key")
		}
	}},
}
