package proxy

import (
	"net/http"
	"sync/atomic"
	"time"

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
	clientID string // the client the body is charged to (clientOf)
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
	reason     string // why the proxy refused the request, for the access log (refusalClient, refusalBudget); empty: none
	upstreamAt time.Time
	upstream   time.Duration

	// wrote is set once the request's headers were written to the
	// upstream connection: before that, a failure proves it was not sent.
	wrote atomic.Bool
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
		p.budget.give(a.held)
		p.budget.release(a.clientID, a.bodyHeld)
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
