package proxy

import (
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/store"
)

// A protected request goes through four phases, in the order serveRoute
// calls them; each phase's methods of *attempt live in its own files:
//
//	phase     what it does                                    files
//	identify  read the body into the buffered-bytes budget,   identify.go, decode.go
//	          refuse a bad upgrade, find the key, the scope
//	          and the fingerprint (readBody, identify)
//	reserve   look for a record under an earlier form of the  reserve.go, replay.go
//	          key, reserve the key, answer a known key (409,
//	          422, a replay) or wait for it (earlierRecord,
//	          reserveAndForward, answerExisting, storeFailed)
//	forward   send the request upstream and classify what     forward.go, outcome.go
//	          happened there (forward, upstreamResponse,
//	          upstreamError, classify)
//	settle    settle the reservation by that outcome: read    settle.go, capture.go
//	          the answer ahead and commit it, release, or
//	          mark in doubt (captureAnswer, commit, conclude)
//
// Observe mode (observe.go) forwards, unprotected, what identify or reserve
// would have answered, and counts it by the outcome it would have had.
// Whichever phase answers sets a.outcome, an Outcome (the one vocabulary,
// outcome.go), which finish (accesslog.go, deferred by serveRoute) counts
// and logs.
// servePassthrough (passthrough.go) only forwards, with no phases.

// attempt is one request's journey through the proxy. Its fields are
// grouped by the phase that sets them.
type attempt struct {
	// The request.
	p      *Proxy
	rt     *route // nil for passthrough
	in     *http.Request
	start  time.Time
	series *routeSeries

	// identify: the body, held in the buffered-bytes budget until
	// serveRoute returns.
	held     int64  // bytes of the buffered-bytes budget held by the body and the answer
	bodyHeld int64  // bytes of the client's share held by the body
	clientID string // the client the body is charged to (admission.ClientOf)

	// reserve: the key in the store and its reservation.
	storeKey string
	token    string // empty: the request is not protected by a reservation
	// reservedAt is when the reservation was asked for: its lease runs
	// from (at the earliest) then.
	reservedAt time.Time

	// forward: the request as sent upstream.
	body       []byte // the buffered request body, once forwarded
	upstreamAt time.Time
	upstream   time.Duration
	// wrote is set once the request's headers were written to the
	// upstream connection: before that, a failure proves it was not sent.
	wrote atomic.Bool
	// trace sets wrote (traced): in a's allocation, not one of its own.
	trace httptrace.ClientTrace
	// client writes the answer to the client, once forwarded.
	client *http.ResponseController

	// settle: the answer read ahead of the client, and the reservation.
	capHeld int64 // of held, the bytes held by the answer read ahead of the client
	settled bool  // the reservation was settled (committed, released or marked in doubt)

	// What finish counts and logs, set by the phase that answers.
	outcome Outcome
	status  int
	// span is the request's server span while tracing is on, nil
	// otherwise (proxy/tracing.go).
	span   trace.Span
	reason string // why the proxy refused the request, for the access log (admission.RefusalClient, admission.RefusalBudget); empty: none
}

// attemptKey is the context key under which a forwarded request carries
// its *attempt to the reverse proxy's hooks (upstreamResponse,
// upstreamError) and the transport.
type attemptKey struct{}

// routeName returns the name of a's route, "" for passthrough.
func (a *attempt) routeName() string {
	if a.rt == nil {
		return ""
	}
	return a.rt.cfg.Name
}

// problem answers with a proxy-made error and records the outcome.
func (a *attempt) problem(w http.ResponseWriter, o Outcome, p problem, detail string, retryAfter int, ext map[string]any) {
	a.outcome, a.status = o, p.Status
	writeProblem(w, a.in, p, detail, retryAfter, ext)
}

// serveRoute serves a request that matched route rt, phase by phase:
// identify, reserve, forward, settle (the map above).
func (p *Proxy) serveRoute(w http.ResponseWriter, r *http.Request, rt *route) {
	a := &attempt{p: p, rt: rt, in: r, start: time.Now(), series: rt.series}
	a.startSpan()
	r = a.in
	gauge := rt.series.inFlight
	gauge.Inc()
	defer gauge.Dec()
	defer p.finish(a)
	if !p.active.enter() {
		a.problem(w, OutcomeStoreError, probShuttingDown, "the proxy is shutting down; retry on another instance", 1, nil)
		return
	}
	defer p.active.leave()
	if a.refuseHeld(w) {
		return
	}
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
	a.storeKey = store.Key(rt.cfg.Keyspace, id.scope, id.key)
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
