// Package problem writes idemproxy's error answers: RFC 9457
// application/problem+json bodies whose type is TypePrefix followed by a
// stable name. The proxy, the admin API and the connection admission (the
// 431 and 503 answered before a handler) each keep their own table of the
// problems they answer with; a problem more than one of them answers with
// is declared here, once.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// TypePrefix starts the type URI of every problem idemproxy answers with;
// the rest is the problem's stable name (Type.Name).
const TypePrefix = "urn:idemproxy:problem:"

// Type is a kind of error answer: its stable name (lower-case words joined
// by '-'), its HTTP status and its title. Tables of them are the one place
// where an error becomes a status.
type Type struct {
	Name   string
	Status int
	Title  string
}

// The problems more than one part of idemproxy answers with.
var (
	// StoreUnavailable: the store did not answer (the proxy and the admin
	// API).
	StoreUnavailable = Type{"store-unavailable", http.StatusServiceUnavailable, "Idempotency store unavailable"}
	// Overloaded: a bound on requests or buffered bytes refused the request
	// (the proxy, and the connection admission before it).
	Overloaded = Type{"overloaded", http.StatusServiceUnavailable, "Proxy overloaded"}
	// TooManyHeaderFields: the request header was cut after the bound on
	// its lines, before any handler saw it (the connection admission; the
	// proxy lists it among its problems).
	TooManyHeaderFields = Type{"too-many-header-fields", http.StatusRequestHeaderFieldsTooLarge, "Too many request header fields"}
)

// Write answers r with a problem of type t: its status, and a body with
// type, title, status, the request's path as instance, detail when not
// empty, and the members of ext (nil: none), ended by a newline. retryAfter > 0 sets
// Retry-After in seconds. The answer is never stored by caches.
func Write(w http.ResponseWriter, r *http.Request, t Type, detail string, retryAfter int, ext map[string]any) {
	b := body(t, r, detail, ext)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(t.Status)
	w.Write(b)
}

// Raw returns the whole HTTP/1.1 answer, with Connection: close, of a
// problem of type t answered on a connection before any request was read
// whole (there is no path to name as instance): the status line, the
// headers Write sets, and a body with type, title, status and detail,
// ended by a newline as Write's.
func Raw(t Type, detail string) []byte {
	b := body(t, nil, detail, nil)
	return []byte("HTTP/1.1 " + strconv.Itoa(t.Status) + " " + http.StatusText(t.Status) + "\r\n" +
		"Content-Type: application/problem+json\r\n" +
		"Content-Length: " + strconv.Itoa(len(b)) + "\r\n" +
		"Cache-Control: no-store\r\n" +
		"Connection: close\r\n\r\n" + string(b))
}

// body is the JSON of a problem, ended by a newline (a terminal shows the
// prompt after curl's output on a line of its own, as for any JSON API
// that ends its bodies with one); instance is r's path, none when r is
// nil. The members come out sorted by name, ext's among them.
func body(t Type, r *http.Request, detail string, ext map[string]any) []byte {
	m := map[string]any{
		"type":   TypePrefix + t.Name,
		"title":  t.Title,
		"status": t.Status,
	}
	if r != nil {
		m["instance"] = r.URL.Path
	}
	if detail != "" {
		m["detail"] = detail
	}
	for k, v := range ext {
		m[k] = v
	}
	b, _ := json.Marshal(m) // the callers' members are strings and numbers: cannot fail
	return append(b, '\n')
}
