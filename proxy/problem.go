package proxy

import (
	"net/http"

	rfc9457 "github.com/idemproxy/idemproxy/internal/problem"
)

// problem is a kind of proxy-made error answer: the one problem type,
// declared in internal/problem.
type problem = rfc9457.Type

// The proxy's own error answers. This table is the one place where a
// domain error becomes an HTTP status; the problems others answer with
// too are declared in internal/problem.
var (
	probMissingKey          = problem{Name: "missing-key", Status: http.StatusBadRequest, Title: "Idempotency key missing"}
	probInvalidKey          = problem{Name: "invalid-key", Status: http.StatusBadRequest, Title: "Idempotency key invalid"}
	probInvalidJSON         = problem{Name: "invalid-json", Status: http.StatusBadRequest, Title: "Request body is not valid JSON"}
	probMissingScope        = problem{Name: "missing-scope", Status: http.StatusBadRequest, Title: "Scope header missing"}
	probInvalidScope        = problem{Name: "invalid-scope", Status: http.StatusBadRequest, Title: "Scope header invalid"}
	probUnreadableBody      = problem{Name: "unreadable-body", Status: http.StatusBadRequest, Title: "Request body could not be read"}
	probInvalidUpgrade      = problem{Name: "invalid-upgrade", Status: http.StatusBadRequest, Title: "Upgrade protocol invalid"}
	probBodyTooLarge        = problem{Name: "body-too-large", Status: http.StatusRequestEntityTooLarge, Title: "Request body too large"}
	probUnsupportedCoding   = problem{Name: "unsupported-content-encoding", Status: http.StatusUnsupportedMediaType, Title: "Request content encoding not supported"}
	probHeaderFields        = rfc9457.TooManyHeaderFields
	probBodyTimeout         = problem{Name: "body-timeout", Status: http.StatusRequestTimeout, Title: "Request body not received in time"}
	probInFlight            = problem{Name: "request-in-flight", Status: http.StatusConflict, Title: "A request with this key is being processed"}
	probInDoubt             = problem{Name: "outcome-in-doubt", Status: http.StatusConflict, Title: "The outcome of an earlier request with this key is unknown"}
	probDuplicate           = problem{Name: "duplicate-request", Status: http.StatusConflict, Title: "Duplicate request"}
	probNotReplayable       = problem{Name: "response-not-replayable", Status: http.StatusConflict, Title: "Duplicate request whose answer was too large to store"}
	probMismatch            = problem{Name: "fingerprint-mismatch", Status: http.StatusUnprocessableEntity, Title: "Idempotency key reused with a different request"}
	probUpstreamDown        = problem{Name: "upstream-unreachable", Status: http.StatusBadGateway, Title: "Upstream not reached"}
	probUpstreamReset       = problem{Name: "upstream-reset", Status: http.StatusBadGateway, Title: "Upstream connection lost before an answer"}
	probUpstreamTimeout     = problem{Name: "upstream-timeout", Status: http.StatusGatewayTimeout, Title: "Upstream did not answer in time"}
	probStoreUnavailable    = rfc9457.StoreUnavailable
	probStoreLostKeys       = problem{Name: "store-lost-keys", Status: http.StatusServiceUnavailable, Title: "Idempotency store lost its keys"}
	probStoreUnsafeSettings = problem{Name: "store-unsafe-settings", Status: http.StatusServiceUnavailable, Title: "Idempotency store runs with a setting that may lose keys"}
	probKeyspaceHeld        = problem{Name: "keyspace-held", Status: http.StatusServiceUnavailable, Title: "The route's keys are held until an operator decides"}
	probOverloaded          = rfc9457.Overloaded
	probShuttingDown        = problem{Name: "shutting-down", Status: http.StatusServiceUnavailable, Title: "Proxy shutting down"}
)

// Problems lists every problem the proxy can answer with, for the docs and
// tests: name, status and title.
func Problems() []rfc9457.Type {
	all := []problem{probMissingKey, probInvalidKey, probInvalidJSON, probMissingScope, probInvalidScope, probUnreadableBody,
		probInvalidUpgrade, probBodyTooLarge, probHeaderFields, probBodyTimeout, probInFlight, probInDoubt, probDuplicate, probNotReplayable, probMismatch,
		probUpstreamDown, probUpstreamReset, probUpstreamTimeout, probStoreUnavailable, probStoreLostKeys, probStoreUnsafeSettings, probKeyspaceHeld, probOverloaded, probShuttingDown,
		probUnsupportedCoding}
	return all
}

// writeProblem answers with an RFC 9457 problem body (rfc9457.Write). ext
// adds extension members; retryAfter > 0 sets Retry-After in seconds.
func writeProblem(w http.ResponseWriter, r *http.Request, p problem, detail string, retryAfter int, ext map[string]any) {
	rfc9457.Write(w, r, p, detail, retryAfter, ext)
}
