package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypePrefix starts the type URI of every problem the proxy answers
// with; the rest is the problem's stable name (see Problems).
const ProblemTypePrefix = "urn:idemproxy:problem:"

// problem is a kind of proxy-made error answer.
type problem struct {
	name   string
	status int
	title  string
}

// The proxy's own error answers. This table is the one place where a
// domain error becomes an HTTP status.
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
	probHeaderFields     = problem{"too-many-header-fields", http.StatusRequestHeaderFieldsTooLarge, "Too many request header fields"}
	probBodyTimeout      = problem{"body-timeout", http.StatusRequestTimeout, "Request body not received in time"}
	probInFlight         = problem{"request-in-flight", http.StatusConflict, "A request with this key is being processed"}
	probInDoubt          = problem{"outcome-in-doubt", http.StatusConflict, "The outcome of an earlier request with this key is unknown"}
	probDuplicate        = problem{"duplicate-request", http.StatusConflict, "Duplicate request"}
	probNotReplayable    = problem{"response-not-replayable", http.StatusConflict, "Duplicate request whose answer was too large to store"}
	probMismatch         = problem{"fingerprint-mismatch", http.StatusUnprocessableEntity, "Idempotency key reused with a different request"}
	probUpstreamDown     = problem{"upstream-unreachable", http.StatusBadGateway, "Upstream not reached"}
	probUpstreamReset    = problem{"upstream-reset", http.StatusBadGateway, "Upstream connection lost before an answer"}
	probUpstreamTimeout  = problem{"upstream-timeout", http.StatusGatewayTimeout, "Upstream did not answer in time"}
	probStoreUnavailable = problem{"store-unavailable", http.StatusServiceUnavailable, "Idempotency store unavailable"}
	probStoreLostKeys    = problem{"store-lost-keys", http.StatusServiceUnavailable, "Idempotency store lost its keys"}
	probOverloaded       = problem{"overloaded", http.StatusServiceUnavailable, "Proxy overloaded"}
	probShuttingDown     = problem{"shutting-down", http.StatusServiceUnavailable, "Proxy shutting down"}
)

// Problems lists every problem the proxy can answer with, for the docs and
// tests: name, status and title.
func Problems() []struct {
	Name   string
	Status int
	Title  string
} {
	all := []problem{probMissingKey, probInvalidKey, probInvalidJSON, probMissingScope, probInvalidScope, probUnreadableBody,
		probInvalidUpgrade, probBodyTooLarge, probHeaderFields, probBodyTimeout, probInFlight, probInDoubt, probDuplicate, probNotReplayable, probMismatch,
		probUpstreamDown, probUpstreamReset, probUpstreamTimeout, probStoreUnavailable, probStoreLostKeys, probOverloaded, probShuttingDown,
		probUnsupportedCoding}
	out := make([]struct {
		Name   string
		Status int
		Title  string
	}, len(all))
	for i, p := range all {
		out[i].Name, out[i].Status, out[i].Title = p.name, p.status, p.title
	}
	return out
}

// writeProblem answers with an RFC 9457 problem body. ext adds extension
// members; retryAfter > 0 sets Retry-After in seconds.
func writeProblem(w http.ResponseWriter, r *http.Request, p problem, detail string, retryAfter int, ext map[string]any) {
	body := map[string]any{
		"type":     ProblemTypePrefix + p.name,
		"title":    p.title,
		"status":   p.status,
		"instance": r.URL.Path,
	}
	if detail != "" {
		body["detail"] = detail
	}
	for k, v := range ext {
		body[k] = v
	}
	b, _ := json.Marshal(body) // only strings and numbers: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(p.status)
	w.Write(b)
}

// WriteOverloaded answers 503 overloaded, with Retry-After: 1, for a
// request refused before it reaches the proxy (an HTTP/2 stream beyond the
// server's bound on requests in flight, or its client's); detail names the
// bound, ext (nil: none) adds extension members.
func WriteOverloaded(w http.ResponseWriter, r *http.Request, detail string, ext map[string]any) {
	writeProblem(w, r, probOverloaded, detail, 1, ext)
}

// HeaderFieldsAnswer is the whole HTTP/1.1 answer, 431
// too-many-header-fields with Connection: close, to a request whose header
// was cut after max lines, before any handler saw it.
func HeaderFieldsAnswer(max int) []byte {
	b, _ := json.Marshal(map[string]any{
		"type":   ProblemTypePrefix + probHeaderFields.name,
		"title":  probHeaderFields.title,
		"status": probHeaderFields.status,
		"detail": "the request header has more than " + strconv.Itoa(max) + " lines (request line and fields); send fewer header fields",
	})
	return []byte("HTTP/1.1 431 Request Header Fields Too Large\r\n" +
		"Content-Type: application/problem+json\r\n" +
		"Content-Length: " + strconv.Itoa(len(b)) + "\r\n" +
		"Cache-Control: no-store\r\n" +
		"Connection: close\r\n\r\n" + string(b))
}
