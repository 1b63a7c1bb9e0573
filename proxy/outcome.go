package proxy

import (
	"net/http"
	"slices"

	"github.com/idemproxy/idemproxy/config"
)

// Outcome is what the proxy did with a request: the proxy's one
// vocabulary of outcomes. Its values are the outcome label of
// idemproxy_requests_total and idemproxy_request_duration_seconds and the
// outcome field of the access log; classify's result (committed, released,
// in_doubt) is what the upstream's answer does to the key; and Woulds, the
// would label of idemproxy_observed_total, is a subset.
type Outcome string

// The outcomes.
const (
	OutcomeCommitted   Outcome = "committed"   // forwarded, answer committed for replay
	OutcomeReplayed    Outcome = "replayed"    // a duplicate got the stored answer
	OutcomeReleased    Outcome = "released"    // forwarded, key released (429, release set, not sent)
	OutcomeInDoubt     Outcome = "in_doubt"    // forwarded, no answer: key in doubt
	OutcomeConflict    Outcome = "conflict"    // 409: key in flight or in doubt
	OutcomeDuplicate   Outcome = "duplicate"   // 409 under duplicate: reject (or answer not replayable)
	OutcomeMismatch    Outcome = "mismatch"    // 422: same key, other request
	OutcomeBadRequest  Outcome = "bad_request" // 400, 413 or 415
	OutcomeUnprotected Outcome = "unprotected" // forwarded without a key (on_missing_key: forward)
	OutcomeStoreError  Outcome = "store_error" // the store failed: 503, or forwarded under on_store_error: forward
	OutcomeOverloaded  Outcome = "overloaded"  // 503: the body did not fit the buffered-bytes budget
	OutcomePassthrough Outcome = "passthrough" // no route matched
)

// Outcomes lists every outcome, in documentation order.
var Outcomes = []Outcome{OutcomeCommitted, OutcomeReplayed, OutcomeReleased, OutcomeInDoubt, OutcomeConflict,
	OutcomeDuplicate, OutcomeMismatch, OutcomeBadRequest, OutcomeUnprotected, OutcomeStoreError, OutcomeOverloaded, OutcomePassthrough}

// Woulds is the subset of Outcomes that observe mode counts: the outcome
// enforce mode would have had for a request that a route in observe mode
// forwarded instead (the would label of idemproxy_observed_total). The
// request's own outcome is then unprotected, or store_error.
var Woulds = []Outcome{OutcomeReplayed, OutcomeConflict, OutcomeMismatch, OutcomeDuplicate, OutcomeBadRequest}

// upstreamKind is what happened upstream to a request the proxy forwarded
// (or was about to forward): with the rest of an upstreamResult, the input
// of classify, whose output is the request's Outcome. It is not an outcome
// itself, and never a label. A client that goes away is none of them: the
// upstream request runs on, and its answer is read and settled as if the
// client were still there.
type upstreamKind int

const (
	// answered: the upstream answered with a status. An answer that is
	// committed is committed once its whole body is in; one whose body
	// breaks off first is brokeOff.
	answered upstreamKind = iota + 1
	// notSent: the request never reached the upstream: connection
	// refused, DNS failure, no connection in time, or the upstream's TLS
	// refusing the proxy (see refusedByTLS).
	notSent
	// shutDown: the proxy was past its shutdown deadline before the
	// request was sent.
	shutDown
	// timedOut: the request was sent, but no whole answer came within
	// the route's upstream_timeout.
	timedOut
	// connLost: the request was sent, but the connection was lost (a
	// reset, the upstream closing it, the proxy stopping) before a whole
	// answer came.
	connLost
	// brokeOff: the answer's body broke off (the connection lost or
	// upstream_timeout passed) before it was whole. Classified, it has no
	// problem: one whose status was passed on to the client cannot be
	// answered with one any more, and for one whose status was not, the
	// error handler answers as for a timeout or a lost connection.
	brokeOff
	// unsettled: the reverse proxy returned, or panicked, without any of
	// the above.
	unsettled
)

// upstreamResult is what happened upstream to a forwarded request, with
// what its outcome depends on.
type upstreamResult struct {
	kind upstreamKind
	// status is the answer's status (answered).
	status int
	// cleaned: the request was matched in cleaned form ("/charges/" for
	// "/charges") and forwarded as sent.
	cleaned bool
	// toCanonical: the answer's Location is the request's path in
	// canonical form.
	toCanonical bool
}

// classify is the one place where what happened upstream to a forwarded
// request becomes what it does to the request's key, on route r: its
// Outcome, one of OutcomeCommitted (the answer is stored and replayed to
// duplicates), OutcomeReleased (a retry is forwarded) and OutcomeInDoubt
// (retries get 409 outcome-in-doubt); and the problem the proxy answers
// instead of the upstream (nil when the upstream's answer is passed on, or
// when nothing can be answered any more). It is the table of
// docs/concepts.md "What the upstream's outcome does to the key":
//
//   - An answer whose status is in the route's release set is released:
//     the route's release_statuses when set, otherwise the client errors
//     that mean "refused before any work" (config.DefaultReleaseStatuses),
//     plus every 5xx under release-on-5xx. Any other answer is committed.
//   - An answer to a request matched in cleaned form shows that the
//     upstream did not serve the route for the path as sent when it is a
//     404, a 405, or a redirect that keeps the method or is permanent
//     (301, 307, 308: what routers and servers answer a path in another
//     spelling; Go's ServeMux sends a POST to the cleaned path with a 307)
//     to the path in canonical form. Stored, it would be replayed to the
//     correct request under the same key for the whole TTL, so it is
//     released whatever the release set. Any other redirect is the
//     upstream's own answer (frameworks answer a POST they processed with
//     a redirect to the new resource or back to the list: 303, or 302 by
//     default in Rails and Express) and is committed: releasing it would
//     let the retry be charged again.
//   - 101 Switching Protocols is no answer (a route never asks for a
//     switch): processed with an unknown outcome, the key is in doubt, as
//     for a lost connection.
//   - A request that never reached the upstream is released (502
//     upstream-unreachable; 503 shutting-down when the proxy did not
//     send it).
//   - A request that may have reached the upstream without a whole answer
//     coming back is in doubt, never released silently: 504
//     upstream-timeout or 502 upstream-reset, or no problem once the
//     answer's status was passed on.
//
// r is read only for answered outcomes; it may be nil for others.
func classify(o upstreamResult, r *config.Route) (Outcome, *problem) {
	switch o.kind {
	case answered:
		switch s := o.status; {
		case s == http.StatusSwitchingProtocols:
			return classify(upstreamResult{kind: connLost}, r)
		case releases(r, s):
			return OutcomeReleased, nil
		case o.cleaned && (s == http.StatusNotFound || s == http.StatusMethodNotAllowed):
			return OutcomeReleased, nil
		case o.cleaned && o.toCanonical && (s == http.StatusMovedPermanently ||
			s == http.StatusTemporaryRedirect || s == http.StatusPermanentRedirect):
			return OutcomeReleased, nil
		}
		return OutcomeCommitted, nil
	case notSent:
		return OutcomeReleased, &probUpstreamDown
	case shutDown:
		return OutcomeReleased, &probShuttingDown
	case timedOut:
		return OutcomeInDoubt, &probUpstreamTimeout
	case connLost:
		return OutcomeInDoubt, &probUpstreamReset
	}
	return OutcomeInDoubt, nil // brokeOff, unsettled
}

// releases reports whether an answer with status is in route r's release
// set: its release_statuses when set, otherwise the policy's set
// (config.DefaultReleaseStatuses, plus every 5xx under release-on-5xx).
func releases(r *config.Route, status int) bool {
	if r.ReleaseStatuses != nil {
		return slices.Contains(r.ReleaseStatuses, status)
	}
	if slices.Contains(config.DefaultReleaseStatuses, status) {
		return true
	}
	return r.Policy == config.PolicyReleaseOn5xx && status >= 500 && status <= 599
}
