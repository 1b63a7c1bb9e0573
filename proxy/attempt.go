package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/keyextract"
	"github.com/idemproxy/idemproxy/store"
)

// attempt is one request's journey through the proxy.
type attempt struct {
	p      *Proxy
	rt     *route // nil for passthrough
	in     *http.Request
	start  time.Time
	series *routeSeries

	held     int64  // bytes of the buffered-bytes budget held by the body and the answer
	capHeld  int64  // of held, the bytes held by the answer read ahead of the client
	bodyHeld int64  // bytes of the client's share held by the body
	clientID string // the client the body is charged to (admission.ClientOf)
	body     []byte // the buffered request body, once forwarded
	storeKey string
	token    string // empty: the request is not protected by a reservation
	// reservedAt is when the reservation was asked for: its lease runs
	// from (at the earliest) then.
	reservedAt time.Time
	settled    bool

	// client writes the answer to the client, once forwarded.
	client *http.ResponseController

	outcome    Outcome
	status     int
	reason     string // why the proxy refused the request, for the access log (admission.RefusalClient, admission.RefusalBudget); empty: none
	upstreamAt time.Time
	upstream   time.Duration

	// wrote is set once the request's headers were written to the
	// upstream connection: before that, a failure proves it was not sent.
	wrote atomic.Bool
}

// errUpstreamTimeout is the cause of an upstream request cancelled by the
// route's upstream_timeout.
var errUpstreamTimeout = fmt.Errorf("upstream timeout: %w", context.DeadlineExceeded)

// traced returns ctx with a trace that records when a's request headers
// have been written.
func (a *attempt) traced(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { a.wrote.Store(true) }})
}

type attemptKey struct{}

func (a *attempt) routeName() string {
	if a.rt == nil {
		return ""
	}
	return a.rt.cfg.Name
}

// problem answers with a proxy-made error and records the outcome.
func (a *attempt) problem(w http.ResponseWriter, o Outcome, p problem, detail string, retryAfter int, ext map[string]any) {
	a.outcome, a.status = o, p.status
	writeProblem(w, a.in, p, detail, retryAfter, ext)
}

func (p *Proxy) serveRoute(w http.ResponseWriter, r *http.Request, rt *route) {
	a := &attempt{p: p, rt: rt, in: r, start: time.Now(), series: rt.series}
	gauge := rt.series.inFlight
	gauge.Inc()
	defer gauge.Dec()
	defer p.finish(a)
	if !p.active.enter() {
		a.problem(w, OutcomeStoreError, probShuttingDown, "the proxy is shutting down; retry on another instance", 1, nil)
		return
	}
	defer p.active.leave()
	defer func() {
		p.budget.Give(a.held)
		p.budget.Release(a.clientID, a.bodyHeld)
	}()

	body, ok := a.readBody(w, rt.cfg.MaxBodyBytes)
	if !ok {
		return
	}
	if invalidUpgrade(r.Header) {
		// Never forwarded, so in observe mode too.
		a.problem(w, OutcomeBadRequest, probInvalidUpgrade, upgradeDetail, 0, nil)
		return
	}
	id, ok := a.identify(w, body)
	if !ok {
		return
	}
	a.storeKey = store.Key(rt.cfg.Name, id.scope, id.key)
	if rec := a.earlierRecord(body, id.scope, id.key); rec != nil {
		// Stored by a configuration or version that derived this key
		// differently: its answer, not a second forward under the key's
		// new form.
		if a.mismatched(w, body, rec, id.fp, id.target) || a.observeExisting(w, body, rec) {
			return
		}
		a.answerExisting(w, rec)
		return
	}
	a.reserveAndForward(w, body, id)
}

// identity is what identifies a request on its route.
type identity struct {
	key    string // the idempotency key
	scope  string // the scope header's value ("" when the route has none)
	fp     string // the fingerprint ("" when the route disables it)
	target string // the path and the canonical query the fingerprint covers
}

// badRequest is why a request cannot be identified: the problem enforce
// mode answers with, which observe mode counts (WouldBadRequest) and
// forwards instead.
type badRequest struct {
	prob   problem
	detail string
	err    error // the key extractor's error, when that is the cause
}

func (b *badRequest) Error() string { return b.detail }
func (b *badRequest) Unwrap() error { return b.err }

// errKeyBodyOverBudget: the decoded body, read for the key and the
// fingerprint, does not fit the budget of buffered bytes.
var errKeyBodyOverBudget = errors.New("the decoded request body does not fit the buffered-bytes budget")

// identify returns the request's identity. When it has none it answers
// the request and reports false: a bad request is answered with its
// problem (or forwarded in observe mode), a request without a key under
// on_missing_key: forward is forwarded unprotected, and one whose decoded
// body does not fit the budget is answered 503.
func (a *attempt) identify(w http.ResponseWriter, body []byte) (identity, bool) {
	id, err := a.readIdentity(body)
	var bad *badRequest
	switch {
	case err == nil:
		return id, true
	case errors.Is(err, keyextract.ErrMissing) && a.rt.cfg.OnMissingKey == config.MissingKeyForward:
		a.outcome = OutcomeUnprotected
		a.p.forward(w, a, body)
	case errors.Is(err, errKeyBodyOverBudget):
		a.overloaded(w, admission.RefusalBudget)
	case errors.As(err, &bad):
		if !a.observe(w, body, WouldBadRequest) {
			a.problem(w, OutcomeBadRequest, bad.prob, bad.detail, 0, nil)
		}
	}
	return id, false
}

// readIdentity finds the request's identity, in order: the body as the key
// reads it, the fingerprint, the key, the scope. The error is a
// *badRequest or errKeyBodyOverBudget.
func (a *attempt) readIdentity(body []byte) (id identity, err error) {
	keyBody, err := a.keyBody(body)
	if err != nil {
		return id, err
	}
	if id.fp, id.target, err = a.fingerprint(keyBody); err != nil {
		return id, err
	}
	if id.key, err = a.key(keyBody); err != nil {
		return id, err
	}
	id.scope, err = a.scope()
	return id, err
}

// keyBody returns the body as the key and the fingerprint read it: a
// compressed body decoded (a retry may compress it otherwise). The body is
// forwarded as sent.
func (a *attempt) keyBody(body []byte) ([]byte, error) {
	if len(body) == 0 || (!a.rt.spec.NeedsJSON() && a.rt.cfg.Fingerprint.Disabled) {
		return body, nil
	}
	keyBody, prob, detail := a.decodeBody(body)
	switch {
	case prob != nil:
		return nil, &badRequest{prob: *prob, detail: detail}
	case keyBody == nil:
		return nil, errKeyBodyOverBudget
	}
	return keyBody, nil
}

// fingerprint returns the request's fingerprint ("" when the route
// disables it) and the target it covers: the (cleaned) path and the query,
// parameters sorted, so that the same key with another query is another
// request. A body that is not JSON is a bad request on a route that reads
// its key from the body.
func (a *attempt) fingerprint(keyBody []byte) (fp, target string, err error) {
	r := a.in
	target = r.URL.Path
	if raw := r.URL.RawQuery; raw != "" {
		target += "?" + canonicalQuery(raw)
	}
	fp, jsonErr := keyextract.FingerprintIgnoring(r.Method, target, keyBody, a.rt.ignore)
	if a.rt.spec.NeedsJSON() && jsonErr != nil {
		return "", "", &badRequest{prob: probInvalidJSON, detail: jsonErr.Error()}
	}
	if a.rt.cfg.Fingerprint.Disabled {
		fp = ""
	}
	return fp, target, nil
}

// key returns the request's idempotency key. A missing key is a bad
// request that wraps keyextract.ErrMissing.
func (a *attempt) key(keyBody []byte) (string, error) {
	key, err := a.rt.spec.Extract(a.in, keyBody)
	if err == nil {
		return key, nil
	}
	prob := probInvalidKey
	switch {
	case errors.Is(err, keyextract.ErrMissing):
		prob = probMissingKey
	case errors.Is(err, keyextract.ErrBadJSON):
		prob = probInvalidJSON
	}
	return "", &badRequest{prob: prob, detail: err.Error(), err: err}
}

// scope returns the value of the route's scope header ("" when it has
// none). On a route with one, each client is one key space: the header
// missing, empty or repeated is a bad request.
func (a *attempt) scope() (string, error) {
	h := a.rt.cfg.Scope.Header
	if h == "" {
		return "", nil
	}
	vs := a.in.Header.Values(h)
	if len(vs) > 1 {
		// Scoped by which one? Each client must be one key space.
		return "", &badRequest{prob: probInvalidScope, detail: "the " + h + " header is repeated"}
	}
	if len(vs) == 0 || vs[0] == "" {
		return "", &badRequest{prob: probMissingScope, detail: "this route keeps one key space per " + h + " header"}
	}
	return vs[0], nil
}

// reserveAndForward reserves the request's key and forwards it. When the
// key is known, the request is answered from its record (or, under
// concurrent: wait, waits for the request that holds it to settle, and
// asks again).
func (a *attempt) reserveAndForward(w http.ResponseWriter, body []byte, id identity) {
	cfg := &a.rt.cfg
	res := store.Reservation{Token: rand.Text(), Fingerprint: id.fp, Lease: cfg.Lease.D(), TTL: cfg.TTL.D()}
	waitUntil := time.Now().Add(cfg.WaitTimeout.D())
	for {
		rec, err := a.reserve(res)
		if err != nil {
			// The reservation may have been applied with its reply lost:
			// take it back, so the key is not left in flight (and then in
			// doubt) for a request that was never forwarded.
			if !errors.Is(err, store.ErrKeysLost) { // refused before the store was written
				a.p.releaseLater(a.storeKey, res.Token, a.reservedAt.Add(cfg.Lease.D()))
			}
			a.storeFailed(w, body, "reserve", err)
			return
		}
		if rec == nil {
			a.token = res.Token
			a.p.forward(w, a, body)
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
	_, err := a.p.waitSettled(ctx, a.storeKey, until)
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
		storeKey := store.Key(a.rt.cfg.Name, scope, k)
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

// legacyMatch reports whether stored is the fingerprint a version that
// hashed numbers as written (before issue 16) gave this request: a record
// it stored is still this request's, for its TTL after an upgrade.
func legacyMatch(stored, method, target string, body []byte, ignore *keyextract.Ignore) bool {
	legacy, _ := keyextract.LegacyFingerprintIgnoring(method, target, body, ignore)
	return stored == legacy
}

// canonicalQuery sorts the parameters of a query string. A query Go cannot
// parse (a ';', a bad escape) is sorted as raw pairs, so that no part of it
// is left out of the fingerprint.
func canonicalQuery(raw string) string {
	if q, err := url.ParseQuery(raw); err == nil {
		return q.Encode()
	}
	pairs := strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' })
	slices.Sort(pairs)
	return "raw:" + strings.Join(pairs, "&")
}

// readBody buffers the request body up to limit bytes. The budget is
// charged as the bytes arrive, in doubling steps (admission.BodyChunk), never for
// what Content-Length announces alone; the body must arrive within the
// server's body_timeout. Nothing has been reserved yet: a body refused or
// cut here leaves no key behind.
func (a *attempt) readBody(w http.ResponseWriter, limit int64) (_ []byte, ok bool) {
	r := a.in
	tooLarge := func() ([]byte, bool) {
		a.problem(w, OutcomeBadRequest, probBodyTooLarge,
			fmt.Sprintf("this route accepts bodies of at most %d bytes", limit), 0, map[string]any{"max_body_bytes": limit})
		return nil, false
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, true
	}
	if r.Context().Err() != nil {
		return a.clientGone()
	}
	src := io.Reader(http.MaxBytesReader(w, r.Body, limit))
	if t := a.p.table.Load(); t.bodyTimeout > 0 && r.ProtoMajor == 2 {
		// Over HTTP/2 a deadline set through the ResponseController is a
		// message to the connection's serving goroutine, which a handler
		// waits to hand over: under a flood of frames, or on a stream
		// already reset, that wait held the handler, and its slot. A timer
		// that closes the body cuts it without that goroutine (the stream
		// ends, the connection serves on); read_timeout still applies.
		d := &deadlineBody{r: src}
		timer := time.AfterFunc(t.bodyTimeout, func() { d.expire(); r.Body.Close() })
		defer timer.Stop()
		src = d
	} else if t.bodyTimeout > 0 {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(t.bodyTimeout)) == nil {
			// Once the body is in, back to the server's whole-request
			// deadline (read_timeout), as if the body deadline had never
			// been set. A body that failed keeps it: what the server
			// discards of its rest after the answer (up to 256 KiB) must
			// not hold the connection longer.
			defer func() {
				if ok {
					rc.SetReadDeadline(a.start.Add(t.readTimeout))
				}
			}()
		}
	}
	end := limit // the most the buffer grows to
	if r.ContentLength >= 0 {
		end = r.ContentLength
	}
	client := admission.ClientOf(r.RemoteAddr)
	// The body arrives into chunks, each taken from the budget when the
	// one before is full: what a body holds is what arrived, plus at most
	// one chunk (never past its Content-Length).
	var chunks [][]byte
	var cur []byte
	var got int64
	for {
		if len(cur) == cap(cur) {
			if cur != nil {
				chunks = append(chunks, cur)
			}
			if got == end {
				if r.ContentLength >= 0 {
					break // all of it: the reader says no more
				}
				// As far as limit allows: one more byte is a 413, the
				// end of the body is the body.
				var one [1]byte
				n, err := src.Read(one[:])
				if n > 0 || (err != nil && err != io.EOF) {
					return a.bodyFailed(w, err, tooLarge)
				}
				if err == io.EOF {
					break
				}
				continue
			}
			size := min(end-got, admission.BodyChunk(a.bodyHeld))
			if why := a.p.budget.TakeFor(client, a.bodyHeld, size); why != "" {
				return a.overloaded(w, why)
			}
			a.held += size
			a.bodyHeld += size
			a.clientID = client
			cur = make([]byte, 0, size)
		}
		n, err := src.Read(cur[len(cur):cap(cur)])
		cur = cur[:len(cur)+n]
		got += int64(n)
		if err == io.EOF {
			if r.ContentLength > 0 && got < r.ContentLength {
				err = io.ErrUnexpectedEOF
			} else {
				chunks = append(chunks, cur)
				break
			}
		}
		if err != nil {
			return a.bodyFailed(w, err, tooLarge)
		}
	}
	if len(chunks) == 1 {
		return chunks[0], true // most bodies: one chunk, no copy
	}
	// One copy into one slice: for the moment of the copy the chunks and
	// the slice are both alive, the chunks' charge covering the slice.
	body := make([]byte, 0, got)
	for _, c := range chunks {
		body = append(body, c...)
	}
	return body, true
}

// bodyFailed answers a request whose body could not be read.
func (a *attempt) bodyFailed(w http.ResponseWriter, err error, tooLarge func() ([]byte, bool)) ([]byte, bool) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), err == nil: // err == nil: a byte past the limit
		return tooLarge()
	case a.in.Context().Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded):
		return a.clientGone()
	case errors.Is(err, os.ErrDeadlineExceeded):
		// A stalled or trickling body: cut, and the connection with it
		// (HTTP/1; an HTTP/2 stream ends alone), so that it holds neither
		// the budget nor a connection any longer.
		a.p.m.adm.BodyTimedOut()
		a.p.log.Warn("request body not received within body_timeout: cut", "route", a.routeName())
		if a.in.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		a.problem(w, OutcomeBadRequest, probBodyTimeout,
			fmt.Sprintf("the request body did not arrive within %s; nothing was stored or forwarded, the request may be retried",
				a.p.table.Load().bodyTimeout), 0, nil)
		return nil, false
	}
	a.problem(w, OutcomeBadRequest, probUnreadableBody, err.Error(), 0, nil)
	return nil, false
}

// overloaded answers a request whose body does not fit the budget of
// buffered bytes (why is admission.RefusalBudget or
// admission.RefusalClient): nothing was stored or forwarded, the retry may
// fit.
func (a *attempt) overloaded(w http.ResponseWriter, why string) ([]byte, bool) {
	a.reason = why
	if why == admission.RefusalClient {
		client := admission.ClientOf(a.in.RemoteAddr)
		share := a.p.budget.PerClient()
		a.p.log.Warn("request refused: this client's request bodies hold its share of the buffers",
			"route", a.routeName(), "reason", why, "client", client,
			"setting", "server.max_buffered_bytes_per_client", "limit", share)
		a.problem(w, OutcomeOverloaded, probOverloaded, fmt.Sprintf("this client's requests buffered now (client %s) "+
			"hold its share of the proxy's buffers, server.max_buffered_bytes_per_client (%d bytes); retry later, "+
			"or raise server.max_buffered_bytes_per_client if every request comes from this address (a mesh, a gateway)",
			client, share), 1,
			map[string]any{"client": client, "setting": "server.max_buffered_bytes_per_client", "limit": share})
		return nil, false
	}
	limit := a.p.budget.Limit()
	a.p.log.Warn("request refused: too many request bytes buffered at once", "route", a.routeName(), "reason", why,
		"setting", "server.max_buffered_bytes", "limit", limit)
	a.problem(w, OutcomeOverloaded, probOverloaded, fmt.Sprintf("the proxy is buffering too many requests at once "+
		"(server.max_buffered_bytes, %d bytes); retry later", limit), 1,
		map[string]any{"setting": "server.max_buffered_bytes", "limit": limit})
	return nil, false
}

// clientGone ends a request whose client went away (over HTTP/2: reset its
// stream) before its body was in: nothing was reserved or forwarded, and
// nothing is written, since no one reads it. The handler returns at once,
// and the request's slot with it. The access log says 499, as nginx does.
func (a *attempt) clientGone() ([]byte, bool) {
	a.outcome, a.status, a.reason = OutcomeBadRequest, statusClientClosed, "client_gone"
	return nil, false
}

// statusClientClosed is the status the access log gives a request whose
// client went away before it was answered; nothing is sent.
const statusClientClosed = 499

// deadlineBody reads an HTTP/2 request body until expire (body_timeout),
// after which its reads fail with os.ErrDeadlineExceeded, as a read
// deadline's do.
type deadlineBody struct {
	r       io.Reader
	expired atomic.Bool
}

func (d *deadlineBody) expire() { d.expired.Store(true) }

func (d *deadlineBody) Read(p []byte) (int, error) {
	if d.expired.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	n, err := d.r.Read(p)
	if err != nil && d.expired.Load() {
		err = os.ErrDeadlineExceeded
	}
	return n, err
}

// mismatched answers 422 (or, in observe mode, forwards) when rec was
// stored for another request than this one (fingerprint fp of target and
// body), and reports whether it did. A fingerprint of a version before
// the number rule (legacyMatch) is the same request.
func (a *attempt) mismatched(w http.ResponseWriter, body []byte, rec *store.Record, fp, target string) bool {
	if fp == "" || rec.Fingerprint == "" || rec.Fingerprint == fp || legacyMatch(rec.Fingerprint, a.in.Method, target, body, a.rt.ignore) {
		return false
	}
	if !a.observe(w, body, WouldMismatch) {
		a.problem(w, OutcomeMismatch, probMismatch,
			"this key was first used with another request (method, path or body); a new request needs a new key", 0, nil)
	}
	return true
}

// releaseLater releases a reservation that may or may not exist, in the
// background; the owner token makes that safe. A release that fails
// otherwise than by finding no reservation of token is retried by the
// settler until until (the end of the reservation's lease): the store that
// lost the reservation's reply is often still unreachable at the first
// attempt, and a reservation left behind is a key in doubt for its whole
// TTL, for a request that was never forwarded. Once the proxy is shutting
// down (its settler takes no more jobs), it releases at once: the store
// closes soon.
func (p *Proxy) releaseLater(key, token string, until time.Time) {
	j := settle.Job{Key: key, Operation: "release", Until: until, Attempt: func(ctx context.Context) error {
		return p.store.Release(ctx, key, token)
	}}
	first := settle.Job{Key: key, Operation: "release", Attempt: func(ctx context.Context) error {
		err := j.Attempt(ctx)
		if err != nil && !errors.Is(err, store.ErrNotOwner) {
			p.settling.Settle(j, err)
		}
		return err
	}}
	if !p.settling.Go(first) {
		p.settling.Once(j)
	}
}

// storeFailed answers a store failure: 503, or the request forwarded
// unprotected under on_store_error: forward (and in mode observe). A store
// that lost its keys (store.ErrKeysLost: the replica's epoch watcher
// refused the reservation) is 503 store-lost-keys; it was logged once, at
// the transition, so each refusal is logged at debug level only.
func (a *attempt) storeFailed(w http.ResponseWriter, body []byte, op string, err error) {
	lost := errors.Is(err, store.ErrKeysLost)
	if lost {
		a.p.log.Debug("store lost its keys: reservation refused", "route", a.routeName(), "key_hash", store.KeyHash(a.storeKey), "err", err)
	} else {
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
	a.problem(w, OutcomeStoreError, probStoreUnavailable, "the idempotency store cannot be reached; retry later", 1, nil)
}

// waitSettled polls the record under key until it is no longer in flight,
// the deadline passes or the client goes away, and returns it (nil when it
// was released).
func (p *Proxy) waitSettled(ctx context.Context, key string, until time.Time) (*store.Record, error) {
	delay := 5 * time.Millisecond
	for {
		t := time.NewTimer(min(delay, time.Until(until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		rec, err := p.store.Get(ctx, key)
		if err != nil || rec == nil || rec.State != store.StateInFlight || !time.Now().Before(until) {
			return rec, err
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// answerExisting answers a request whose key is already known.
func (a *attempt) answerExisting(w http.ResponseWriter, rec *store.Record) {
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
		a.problem(w, OutcomeConflict, probInDoubt,
			"an earlier request with this key may have reached the upstream, but its answer was lost; "+
				"check the upstream, then release the key through the admin API, or wait for it to expire", 0, ext)
	}
}
