package proxy

import (
	"net/http"
	"strconv"

	rfc9457 "github.com/idemproxy/idemproxy/internal/problem"
)

// problem is a kind of proxy-made error answer: an rfc9457.Type under
// the field names the request code reads (name, status). rfc9457.Write
// writes it (writeProblem).
type problem struct {
	name   string
	status int
	title  string
}

// of is the proxy's problem of a type declared in internal/problem.
func of(t rfc9457.Type) problem { return problem{t.Name, t.Status, t.Title} }

// typ is p as rfc9457 takes it.
func (p problem) typ() rfc9457.Type {
	return rfc9457.Type{Name: p.name, Status: p.status, Title: p.title}
}

// The proxy's own error answers. This table is the one place where a
// domain error becomes an HTTP status; the problems others answer with
// too are declared in internal/problem.
var (
	probMissingKey        = problem{"missing-key", http.StatusBadRequest, "Idempotency key missing"}
	probInvalidKey        = problem{"invalid-key", http.StatusBadRequest, "Idempotency key invalid"}
	probInvalidJSON       = problem{"invalid-json", http.StatusBadRequest, "Request body is not valid JSON"}
	probMissingScope      = problem{"missing-scope", http.StatusBadRequest, "Scope header missing"}
	probInvalidScope      = problem{"invalid-scope", http.StatusBadRequest, "Scope header invalid"}
	probUnreadableBody    = problem{"unreadable-body", http.StatusBadRequest, "Request body could not be read"}
	probInvalidUpgrade    = problem{"invalid-upgrade", http.StatusBadRequest, "Upgrade protocol invalid"}
	probBodyTooLarge      = problem{"body-too-large", http.StatusRequestEntityTooLarge, "Request body too large"}
	probUnsupportedCoding = problem{"unsupported-content-encoding", http.StatusUnsupportedMediaType,
		"Request content encoding not supported"}
	probHeaderFields     = of(rfc9457.TooManyHeaderFields)
	probBodyTimeout      = problem{"body-timeout", http.StatusRequestTimeout, "Request body not received in time"}
	probInFlight         = problem{"request-in-flight", http.StatusConflict, "A request with this key is being processed"}
	probInDoubt          = problem{"outcome-in-doubt", http.StatusConflict, "The outcome of an earlier request with this key is unknown"}
	probDuplicate        = problem{"duplicate-request", http.StatusConflict, "Duplicate request"}
	probNotReplayable    = problem{"response-not-replayable", http.StatusConflict, "Duplicate request whose answer was too large to store"}
	probMismatch         = problem{"fingerprint-mismatch", http.StatusUnprocessableEntity, "Idempotency key reused with a different request"}
	probUpstreamDown     = problem{"upstream-unreachable", http.StatusBadGateway, "Upstream not reached"}
	probUpstreamReset    = problem{"upstream-reset", http.StatusBadGateway, "Upstream connection lost before an answer"}
	probUpstreamTimeout  = problem{"upstream-timeout", http.StatusGatewayTimeout, "Upstream did not answer in time"}
	probStoreUnavailable = of(rfc9457.StoreUnavailable)
	probStoreLostKeys    = problem{"store-lost-keys", http.StatusServiceUnavailable, "Idempotency store lost its keys"}
	probOverloaded       = of(rfc9457.Overloaded)
	probShuttingDown     = problem{"shutting-down", http.StatusServiceUnavailable, "Proxy shutting down"}
)

// Problems lists every problem the proxy can answer with, for the docs and
// tests: name, status and title.
func Problems() []rfc9457.Type {
	all := []problem{probMissingKey, probInvalidKey, probInvalidJSON, probMissingScope, probInvalidScope, probUnreadableBody,
		probInvalidUpgrade, probBodyTooLarge, probHeaderFields, probBodyTimeout, probInFlight, probInDoubt, probDuplicate, probNotReplayable, probMismatch,
		probUpstreamDown, probUpstreamReset, probUpstreamTimeout, probStoreUnavailable, probStoreLostKeys, probOverloaded, probShuttingDown,
		probUnsupportedCoding}
	out := make([]rfc9457.Type, len(all))
	for i, p := range all {
		out[i] = p.typ()
	}
	return out
}

// writeProblem answers with an RFC 9457 problem body (rfc9457.Write). ext
// adds extension members; retryAfter > 0 sets Retry-After in seconds.
func writeProblem(w http.ResponseWriter, r *http.Request, p problem, detail string, retryAfter int, ext map[string]any) {
	rfc9457.Write(w, r, p.typ(), detail, retryAfter, ext)
}

// WriteOverloaded answers 503 overloaded, with Retry-After: 1, for a
// request refused before it reaches the proxy (an HTTP/2 stream beyond the
// server's bound on requests in flight, or its client's); detail names the
// bound, ext (nil: none) adds extension members.
func WriteOverloaded(w http.ResponseWriter, r *http.Request, detail string, ext map[string]any) {
	rfc9457.Write(w, r, rfc9457.Overloaded, detail, 1, ext)
}

// HeaderFieldsAnswer is the whole HTTP/1.1 answer, 431
// too-many-header-fields with Connection: close, to a request whose header
// was cut after max lines, before any handler saw it.
func HeaderFieldsAnswer(max int) []byte {
	return rfc9457.Raw(rfc9457.TooManyHeaderFields,
		"the request header has more than "+strconv.Itoa(max)+" lines (request line and fields); send fewer header fields")
}
