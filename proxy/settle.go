package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
)

// conclude settles a's reservation by an outcome of classify that stores
// no answer: released, or (any other outcome, which never releases
// silently) in doubt.
func (a *attempt) conclude(o Outcome) {
	if o == OutcomeReleased {
		a.release()
		return
	}
	a.markInDoubt()
}

func (a *attempt) commit(status int, header, trailer http.Header, body []byte, stored bool) {
	a.settled = true
	a.outcome = OutcomeCommitted
	resp := store.Response{Status: status, Header: http.Header{}, BodyStored: stored}
	for _, name := range a.rt.cfg.ReplayHeaders {
		if vs := header.Values(name); len(vs) > 0 {
			resp.Header[name] = vs
		}
	}
	if a.in.Method == http.MethodHead {
		// A HEAD answer has no body, but its Content-Length is the size
		// of the body a GET would get: a HEAD replay carries it.
		if cl := header.Get("Content-Length"); validLength(cl) {
			resp.Header["Content-Length"] = []string{cl}
		}
	}
	if stored {
		resp.Body = body
		resp.Trailer = trailer
	}
	key, token, ttl := a.storeKey, a.token, a.rt.cfg.TTL.D()
	at := time.Now()
	ctx, cancel := context.WithTimeout(a.detached(), storeTimeout)
	err := a.p.store.Commit(ctx, key, token, resp, ttl)
	cancel()
	if err != nil {
		// settle's work, but the retry's closure (and a heap copy of the
		// answer) made only for a commit that failed, not for every one.
		resp := resp
		a.settleErr("commit", err, func(ctx context.Context) error { return a.p.store.Commit(ctx, key, token, resp, ttl) })
		return
	}
	a.settleErr("commit", nil, nil) // wakes the key's waiters here
	if a.p.witness != nil {
		a.p.witness.Answered(key, ttl, at)
	}
}

// validLength reports whether s is a Content-Length value: decimal digits
// that fit an int64.
func validLength(s string) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && n >= 0 && s[0] != '+'
}

func (a *attempt) release() {
	a.settled = true
	a.outcome = OutcomeReleased
	key, token := a.storeKey, a.token
	a.settle("release", func(ctx context.Context) error { return a.p.store.Release(ctx, key, token) })
}

func (a *attempt) markInDoubt() {
	a.settled = true
	a.outcome = OutcomeInDoubt
	a.event(tracing.EventInDoubt)
	ctx, cancel := context.WithTimeout(a.detached(), storeTimeout)
	defer cancel()
	err := a.p.store.MarkInDoubt(ctx, a.storeKey, a.token, a.rt.cfg.TTL.D())
	a.settleErr("mark_in_doubt", err, nil)
	if err == nil {
		a.scheduleLookup()
	}
}

// settleUnknown makes sure a reservation is settled, should the reverse
// proxy have returned (or panicked) without settling it: the request may
// have reached the upstream, so the key is in doubt.
func (a *attempt) settleUnknown() {
	if a.token != "" && !a.settled {
		v, _ := classify(upstreamResult{kind: unsettled}, nil)
		a.conclude(v)
	}
}

// settle runs op, the store operation that settles a's reservation. When
// it fails (a stalled store, op_timeout), the proxy's settler retries it in
// the background as long as the reservation's lease holds: giving up at
// once would leave the key in flight and then in doubt for its whole TTL,
// although the outcome is known. It returns the first attempt's error.
func (a *attempt) settle(opName string, op func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(a.detached(), storeTimeout)
	err := op(ctx)
	cancel()
	a.settleErr(opName, err, op)
	return err
}

// settleErr hands the result err of a settling write to the settler, which
// retries retry (nil: not retried) while the lease holds and logs how the
// key was left; a write that succeeded wakes the key's waiters. A write that failed counts as a store error now, retried
// or not: the key is not settled yet.
func (a *attempt) settleErr(op string, err error, retry func(ctx context.Context) error) {
	if err == nil {
		a.p.waiters.settled(a.storeKey) // its waiters here read it now
		return
	}
	j := settle.Job{Key: a.storeKey, Operation: op, Attrs: []any{"route", a.routeName()}}
	if retry != nil {
		j.Until, j.Attempt = a.reservedAt.Add(a.rt.cfg.Lease.D()), retry
	}
	a.p.settling.Settle(j, err)
	if !errors.Is(err, store.ErrNotOwner) {
		a.outcome = OutcomeStoreError
	}
}
