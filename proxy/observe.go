package proxy

import (
	"net/http"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
)

// observing reports whether a's route is in observe mode.
func (a *attempt) observing() bool { return a.rt != nil && a.rt.cfg.Mode == config.ModeObserve }

// observe forwards a request that enforce mode would have answered itself
// with the outcome would (one of Woulds), when a's route is in observe
// mode, and counts it; it reports whether it did. The request holds no
// reservation: the key's record, if any, is left as it is, and the answer
// is not stored.
func (a *attempt) observe(w http.ResponseWriter, body []byte, would Outcome) bool {
	if !a.observing() {
		return false
	}
	a.p.m.rec.observed.WithLabelValues(a.rt.cfg.Name, string(would)).Inc()
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
	would := OutcomeConflict
	if rec.State == store.StateCompleted {
		would = OutcomeReplayed
		if a.rt.cfg.Duplicate == config.DuplicateReject || rec.Response == nil || !rec.Response.BodyStored {
			would = OutcomeDuplicate
		}
	}
	return a.observe(w, body, would)
}
