package proxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"time"
)

// NewTransport returns the transport used for the upstream: bounded dial
// and TLS handshake, a large idle pool per host, and an idle timeout of 4 s,
// shorter than common upstream keep-alive timeouts (Node's is 5 s), because
// a request written on a connection the upstream is closing is in doubt.
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       4 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// noResend wraps the transport of protected requests so that
// http.Transport never sends one twice. The transport resends a request on
// a reused connection that broke before the answer when it thinks the
// request is replayable: an empty body and an idempotent method, or an
// Idempotency-Key / X-Idempotency-Key header. That is the duplicate the
// proxy exists to prevent, so those headers are stored under a key the
// transport does not look up (header names are case-insensitive on the
// wire), and requests with an idempotent method never reuse a connection.
type noResend struct {
	base  http.RoundTripper
	fresh http.RoundTripper // keep-alives off
}

func newNoResend(base http.RoundTripper) http.RoundTripper {
	nr := &noResend{base: base, fresh: base}
	if t, ok := base.(*http.Transport); ok {
		f := t.Clone()
		f.DisableKeepAlives = true
		nr.fresh = f
	}
	return nr
}

func (n *noResend) RoundTrip(req *http.Request) (*http.Response, error) {
	if a, ok := req.Context().Value(attemptKey{}).(*attempt); ok && len(a.body) > 0 && req.Body != nil {
		// The reverse proxy wraps the body in a reader of its own, which
		// makes the transport send the headers and the body in two
		// writes (two packets, two reads upstream). The body was buffered:
		// given as the in-memory reader it is, it goes out with the
		// headers in one write.
		req = req.WithContext(req.Context()) // a shallow copy: RoundTrip must not change req
		req.Body = io.NopCloser(bytes.NewReader(a.body))
	}
	for _, h := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if vs, ok := req.Header[h]; ok {
			delete(req.Header, h)
			req.Header[lowerASCII(h)] = vs
		}
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return n.fresh.RoundTrip(req)
	}
	return n.base.RoundTrip(req)
}

func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
