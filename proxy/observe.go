package proxy

import (
	"net/http"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
)

// What enforce mode would have done with a request that a route in observe
// mode forwarded: the would label of idemproxy_observed_total.
const (
	WouldReplayed   = "replayed"    // the stored answer, replayed
	WouldConflict   = "conflict"    // 409: the key was in flight or in doubt
	WouldMismatch   = "mismatch"    // 422: the key was first used with another request
	WouldDuplicate  = "duplicate"   // 409 under duplicate: reject, or an answer not replayable
	WouldBadRequest = "bad_request" // 400: no valid key, JSON or scope
)

// Woulds lists every would label.
var Woulds = []string{WouldReplayed, WouldConflict, WouldMismatch, WouldDuplicate, WouldBadRequest}

// observing reports whether a's route is in observe mode.
func (a *attempt) observing() bool { return a.rt != nil && a.rt.cfg.Mode == config.ModeObserve }

// observe forwards a request that enforce mode would have answered itself
// (would), when a's route is in observe mode, and counts it; it reports
// whether it did. The request holds no reservation: the key's record, if
// any, is left as it is, and the answer is not stored.
func (a *attempt) observe(w http.ResponseWriter, body []byte, would string) bool {
	if !a.observing() {
		return false
	}
	a.p.m.rec.observed.WithLabelValues(a.rt.cfg.Name, would).Inc()
	a.outcome = OutcomeUnprotected
	a.p.forward(w, a, body)
	return true
}

// observeExisting is observe for a request whose key has a record: what
// answerExisting would have answered.
func (a *attempt) observeExisting(w http.ResponseWriter, body []byte, rec *store.Record) bool {
	if !a.observing() {
		return false
	}
	would := WouldConflict
	if rec.State == store.StateCompleted {
		would = WouldReplayed
		if a.rt.cfg.Duplicate == config.DuplicateReject || rec.Response == nil || !rec.Response.BodyStored {
			would = WouldDuplicate
		}
	}
	return a.observe(w, body, would)
}
