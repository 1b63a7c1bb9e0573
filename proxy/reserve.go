package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/keyextract"
	"github.com/idemproxy/idemproxy/store"
)

// earlierRecord returns the record stored under a key that an earlier
// configuration or version derived for this request, when that key is not
// key and a record is there, and makes a.storeKey that record's:
//   - under key.normalize: nfc, the key as sent (the route's rules without
//     NFC), where a record stored before the option was turned on by a
//     reload is;
//   - the key of a version before the key rules of issue 16 (keyextract's
//     LegacyExtract: a quoted header key with its quotes, a number as
//     written).
//
// Both are looked up in this route's key space and this request's scope
// only, and each costs one Get only when it differs from key and from the
// one before (an ASCII key, or one sent in NFC, costs no Get for the
// first). nil when none is found, a store failure included (the
// reservation that follows meets it).
func (a *attempt) earlierRecord(body []byte, scope, key string) *store.Record {
	tried := key
	lookup := func(k string, err error) *store.Record {
		if err != nil || k == key || k == tried {
			return nil
		}
		tried = k
		storeKey := store.Key(a.rt.cfg.Keyspace, scope, k)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(a.in.Context()), storeTimeout)
		defer cancel()
		rec, err := a.p.store.Get(ctx, storeKey)
		if err != nil || rec == nil {
			return nil
		}
		a.storeKey = storeKey
		return rec
	}
	if a.rt.spec.NFC {
		asSent := a.rt.spec
		asSent.NFC = false
		if rec := lookup(asSent.Extract(a.in, body)); rec != nil {
			return rec
		}
	}
	return lookup(a.rt.spec.LegacyExtract(a.in, body))
}

// reserveAndForward reserves the request's key and forwards it. When the
// key is known, the request is answered from its record (or, under
// concurrent: wait, waits for the request that holds it to settle, and
// asks again).
func (a *attempt) reserveAndForward(w http.ResponseWriter, body []byte, id identity) {
	cfg := &a.rt.cfg
	res := store.Reservation{Token: rand.Text(), Fingerprint: id.fp, Lease: cfg.Lease.D(), TTL: cfg.TTL.D(), Origin: a.origin()}
	waitUntil := time.Now().Add(cfg.WaitTimeout.D())
	for {
		rec, err := a.reserve(res)
		if err != nil {
			// The reservation may have been applied with its reply lost:
			// take it back, so the key is not left in flight (and then in
			// doubt) for a request that was never forwarded.
			if !errors.Is(err, store.ErrKeysLost) && !errors.Is(err, store.ErrUnsafeSettings) { // refused before the store was written
				a.p.releaseLater(a.storeKey, res.Token, a.reservedAt.Add(cfg.TTL.D()))
			}
			a.storeFailed(w, body, "reserve", err)
			return
		}
		if rec == nil {
			a.token = res.Token
			if a.witnessLost(w, body) {
				return
			}
			a.p.forward(w, a, body)
			return
		}
		if again, answered := a.takeBackUnforwarded(w, body, rec); again {
			continue
		} else if answered {
			return
		}
		if a.mismatched(w, body, rec, id.fp, id.target) || a.observeExisting(w, body, rec) {
			return
		}
		if rec.State != store.StateInFlight || cfg.Concurrent != config.ConcurrentWait || !time.Now().Before(waitUntil) {
			a.answerExisting(w, rec)
			return
		}
		if !a.awaitSettled(w, body, rec, waitUntil) {
			return
		}
		// Settled, released or still in flight at the deadline: ask
		// again, so the answer is checked against this request's
		// fingerprint (another request may have taken the key).
	}
}

// reserve asks the store for the reservation res of the request's key: nil
// when it was reserved, the key's record when it is known.
func (a *attempt) reserve(res store.Reservation) (*store.Record, error) {
	// A client that hangs up now does not undo its request: the
	// reservation and the forward run to the end, and the answer is
	// stored for its retry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.in.Context()), storeTimeout)
	defer cancel()
	a.reservedAt = time.Now()
	return a.p.store.Reserve(ctx, a.storeKey, res)
}

// awaitSettled waits until the record rec, in flight, has settled or the
// deadline until, and reports whether to ask for the key again; when not,
// it has answered the request.
func (a *attempt) awaitSettled(w http.ResponseWriter, body []byte, rec *store.Record, until time.Time) bool {
	ctx := a.in.Context()
	poll := ctx
	if a.span != nil {
		a.event(tracing.EventWait, attribute.String("idemproxy.wait_until", until.UTC().Format(time.RFC3339Nano)))
		// The polls are not traced one by one (up to one every 100 ms
		// until wait_timeout, shared by the waiters of the key:
		// waiters.go): the two events say what the wait was.
		poll = trace.ContextWithSpanContext(ctx, a.span.SpanContext())
	}
	got, err := a.p.waitSettled(poll, a.storeKey, rec, until)
	if a.span != nil {
		state := "released"
		if got != nil {
			state = string(got.State)
		}
		if err != nil {
			state = "error"
		}
		a.event(tracing.EventWaitEnd, attribute.String("idemproxy.state", state))
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// The client stopped waiting: answered as without waiting. A
		// client that went away never reads it; one that only
		// half-closed its connection, or whose read_timeout passed,
		// would otherwise get the server's empty 200 OK for a request
		// still in flight.
		a.answerExisting(w, rec)
		return false
	case err != nil:
		a.storeFailed(w, body, "get", err)
		return false
	}
	return true
}

// mismatched answers 422 (or, in observe mode, forwards) when rec was
// stored for another request than this one (fingerprint fp of target and
// body), and reports whether it did. A fingerprint of a version before
// the number rule (legacyMatch) is the same request.
func (a *attempt) mismatched(w http.ResponseWriter, body []byte, rec *store.Record, fp, target string) bool {
	if fp == "" || rec.Fingerprint == "" || rec.Fingerprint == fp || legacyMatch(rec.Fingerprint, a.in.Method, target, body, a.rt.ignore) {
		return false
	}
	a.event(tracing.EventFingerprintMismatch)
	a.linkOrigin(rec)
	if !a.observe(w, body, OutcomeMismatch) {
		a.problem(w, OutcomeMismatch, probMismatch,
			"this key was first used with another request (method, path or body); a new request needs a new key", 0, nil)
	}
	return true
}

// legacyMatch reports whether stored is the fingerprint a version that
// hashed numbers as written (before issue 16) gave this request: a record
// it stored is still this request's, for its TTL after an upgrade.
func legacyMatch(stored, method, target string, body []byte, ignore *keyextract.Ignore) bool {
	legacy, _ := keyextract.LegacyFingerprintIgnoring(method, target, body, ignore)
	return stored == legacy
}

// answerExisting answers a request whose key is already known.
func (a *attempt) answerExisting(w http.ResponseWriter, rec *store.Record) {
	a.linkOrigin(rec)
	switch rec.State {
	case store.StateInFlight:
		a.problem(w, OutcomeConflict, probInFlight,
			"a request with this key is being forwarded now; retry after it has been answered", 1, nil)
	case store.StateCompleted:
		resp := rec.Response
		if resp == nil {
			resp = &store.Response{}
		}
		switch {
		case a.rt.cfg.Duplicate == config.DuplicateReject:
			a.problem(w, OutcomeDuplicate, probDuplicate, "this key was already processed", 0,
				map[string]any{"stored_status": resp.Status})
		case !resp.BodyStored:
			a.problem(w, OutcomeDuplicate, probNotReplayable,
				"this key was already processed, but its answer was larger than the route's max_stored_body_bytes", 0,
				map[string]any{"stored_status": resp.Status})
		default:
			a.replay(w, resp)
		}
	default:
		ext := map[string]any{}
		if !rec.ExpiresAt.IsZero() {
			ext["expires_at"] = rec.ExpiresAt.UTC().Format(time.RFC3339)
		}
		if rc := a.rt.cfg.Reconcile; rc != nil {
			detail, first, retryAfter := reconcileSchedule(rec, &a.rt.cfg, rc, time.Now())
			ext["reconcile_after"] = first.UTC().Format(time.RFC3339)
			a.problem(w, OutcomeConflict, probInDoubt, detail, retryAfter, ext)
			return
		}
		a.problem(w, OutcomeConflict, probInDoubt,
			"an earlier request with this key may have reached the upstream, but its answer was lost; "+
				"check the upstream, then release the key through the admin API, or wait for it to expire", 0, ext)
	}
}

// reconcileSchedule is the in-doubt 409's detail on a route with
// reconcile, and its Retry-After in seconds: when the upstream is asked
// about the key. The first lookup is due grace after the key turned in
// doubt, which is at most the lease after its reservation (sooner after a
// timeout), then one every interval until the upstream answers.
func reconcileSchedule(rec *store.Record, cfg *config.Route, rc *config.Reconcile, now time.Time) (detail string, first time.Time, retryAfter int) {
	created := rec.CreatedAt
	if created.IsZero() { // a store that did not say: the grace from now
		created = now.Add(-cfg.Lease.D())
	}
	first = created.Add(cfg.Lease.D() + rc.Grace.D())
	const lost = "an earlier request with this key may have reached the upstream, but its answer was lost; "
	if wait := first.Sub(now); wait > 0 {
		return fmt.Sprintf(lost+"this route reconciles it: the upstream is asked about the key by %s (in %s, its grace "+
			"after the key turned in doubt), then every %s until it answers; retry after that, or an operator "+
			"releases or reconciles the key now through the admin API",
			first.UTC().Format(time.RFC3339), wait.Round(time.Second), rc.Interval.D()), first, int(wait.Seconds()) + 1
	}
	return fmt.Sprintf(lost+"this route reconciles it: the upstream has been asked about the key since %s, and is "+
		"asked again every %s until it answers; retry after that, or an operator releases or reconciles the key "+
		"now through the admin API", first.UTC().Format(time.RFC3339), rc.Interval.D()), first, int(rc.Interval.D().Seconds())
}

// storeFailed answers a store failure: 503, or the request forwarded
// unprotected under on_store_error: forward (and in mode observe). A store
// that lost its keys (store.ErrKeysLost: the replica's epoch watcher
// refused the reservation) is 503 store-lost-keys; it was logged once, at
// the transition, so each refusal is logged at debug level only.
func (a *attempt) storeFailed(w http.ResponseWriter, body []byte, op string, err error) {
	lost := errors.Is(err, store.ErrKeysLost)
	var unsafe *store.SettingError
	switch {
	case lost:
		a.p.log.Debug("store lost its keys: reservation refused", "route", a.routeName(), "key_hash", store.KeyHash(a.storeKey), "err", err)
	case errors.As(err, &unsafe):
		a.p.log.Debug("store runs with a setting that may lose keys: reservation refused", "route", a.routeName(), "key_hash", store.KeyHash(a.storeKey), "err", err)
	default:
		a.p.log.Error("store failed", "route", a.routeName(), "operation", op, "key_hash", store.KeyHash(a.storeKey), "err", err)
	}
	a.outcome = OutcomeStoreError
	if a.rt.cfg.OnStoreError == config.StoreErrorForward || a.observing() {
		a.p.forward(w, a, body)
		return
	}
	if lost {
		a.problem(w, OutcomeStoreError, probStoreLostKeys, "the idempotency store no longer has the keys it had "+
			"(restarted empty, flushed or truncated), or a new store waits for the other replicas to object: "+
			"nothing was forwarded; retry later (an operator must accept a loss)", 5, nil)
		return
	}
	if unsafe != nil {
		a.problem(w, OutcomeStoreError, probStoreUnsafeSettings, "the idempotency store's "+unsafe.Setting+" is "+unsafe.Seen+
			" ("+unsafe.Why+"): nothing was forwarded; retry later (an operator must "+unsafe.Fix+")", 5,
			map[string]any{"setting": unsafe.Setting})
		return
	}
	a.problem(w, OutcomeStoreError, probStoreUnavailable, "the idempotency store cannot be reached; retry later", 1, nil)
}

// releaseLater releases a reservation that may or may not exist, in the
// background; the owner token makes that safe. A release that fails
// otherwise than by finding no reservation of token is retried by the
// settler until until: the store that lost the reservation's reply is
// often still unreachable at the first attempt (a stalled Badger writer, a
// store reopening, a flood: issue 36), and a reservation left behind is a
// key in doubt for its whole TTL, for a request that was never forwarded.
// The caller passes the end of the reservation's TTL, not of its lease:
// the request was never forwarded, so releasing it after the lease is as
// safe as before (the token names this reservation only, and a key read in
// doubt is taken by no other request), and a store that recovers only
// after the lease still frees the key instead of answering 409 for the
// whole TTL. The settler's bound on retries (settle.MaxRetrying) keeps a
// store down for long from piling them up. Once the proxy is shutting
// down (its settler takes no more jobs), it releases at once: the store
// closes soon.
//
// While it is retried, the key and token are in p.unforwarded, so that a
// retry of the key on this replica releases it in its own time
// (takeBackUnforwarded) rather than reading this reservation in flight, or
// in doubt once its lease has passed: a 409 that says the request may have
// reached the upstream, for one that never did.
func (p *Proxy) releaseLater(key, token string, until time.Time) {
	p.unforwarded.Store(key, token)
	forget := func(error) { p.unforwarded.CompareAndDelete(key, token) }
	j := settle.Job{Key: key, Operation: "release", Until: until, StopAtClose: true, Done: forget, Attempt: func(ctx context.Context) error {
		return p.store.Release(ctx, key, token)
	}}
	first := settle.Job{Key: key, Operation: "release", Attempt: func(ctx context.Context) error {
		err := j.Attempt(ctx)
		if err == nil || errors.Is(err, store.ErrNotOwner) || !p.settling.Settle(j, err) {
			forget(err)
		}
		return err
	}}
	if !p.settling.Go(first) {
		p.settling.Once(j)
	}
}

// takeBackUnforwarded handles rec, the key's record, when it is this
// replica's own reservation of a request that was never forwarded, its
// release still being retried (releaseLater): it releases it now and
// reports whether to ask for the key again. When the release fails it
// answers 503, as the reservation's own request was (the store is not
// writable yet), and reports false with answered true. Any other record
// is left to the caller (false, false).
func (a *attempt) takeBackUnforwarded(w http.ResponseWriter, body []byte, rec *store.Record) (again, answered bool) {
	token, ok := a.p.unforwarded.Load(a.storeKey)
	if !ok || rec.Token == "" || rec.Token != token {
		return false, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.in.Context()), storeTimeout)
	defer cancel()
	err := a.p.store.Release(ctx, a.storeKey, rec.Token)
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		a.storeFailed(w, body, "release", err)
		return false, true
	}
	a.p.unforwarded.CompareAndDelete(a.storeKey, rec.Token)
	return true, false
}
