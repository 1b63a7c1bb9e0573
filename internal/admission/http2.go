package admission

import (
	"net/http"
	"strings"
)

// MaxHeaderBytes bounds a request's header (http.Server's MaxHeaderBytes):
// the request line and header fields in HTTP/1.1, the decoded header list
// (SETTINGS_MAX_HEADER_LIST_SIZE) in HTTP/2.
const MaxHeaderBytes = 64 << 10

// maxHeaderLines bounds the lines of an HTTP/1 request's header (its
// request line and header fields): more is answered 431
// too-many-header-fields. Go's server allocates per field, so the count,
// not only the bytes, sets what a header costs while it is read; proxies
// allow about as many (Envoy 100 fields by default, nginx a few KiB).
// HTTP/2 bounds the decoded list instead, counting 32 bytes a field.
const maxHeaderLines = 256

// HTTP/2 limits, per connection. A stream is a request: at most
// h2MaxStreams of them run at once on one connection, and request bytes the
// proxy has not read yet wait in flow-control windows of h2StreamWindow per
// stream and h2ConnWindow per connection (so at most h2ConnWindow ×
// server.max_connections in all).
const (
	h2MaxStreams   = 100
	h2StreamWindow = 64 << 10
	h2ConnWindow   = 256 << 10
)

// ServerProtocols is what the client-facing listener speaks: HTTP/1.1 and
// cleartext HTTP/2 with prior knowledge (a connection that opens with the
// HTTP/2 preface, as service-mesh sidecars and curl --http2-prior-knowledge
// send). Go's server does not implement the HTTP/1.1 Upgrade to h2c; see
// WithoutH2CUpgrade.
func ServerProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// ServerHTTP2 bounds what one HTTP/2 connection may hold. The idle timeout,
// the header size (MaxHeaderBytes) and the request read timeout are the
// http.Server's, as for HTTP/1.1.
func ServerHTTP2() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          h2MaxStreams,
		MaxReceiveBufferPerStream:     h2StreamWindow,
		MaxReceiveBufferPerConnection: h2ConnWindow,
	}
}

// WithoutH2CUpgrade takes "h2c" out of a request's Upgrade header (and
// drops HTTP2-Settings): the request is served as the HTTP/1.1 request it
// also is, and never passed on as a protocol switch. Passed on, an
// upstream that accepts h2c would turn the client's connection into a
// tunnel to itself, and every later request on it, those of protected
// routes included, would reach the upstream without the proxy. Other
// protocols (WebSocket) are left as they are.
func WithoutH2CUpgrade(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if vs, ok := r.Header["Upgrade"]; ok {
			var keep []string
			dropped := false
			for _, v := range vs {
				for tok := range strings.SplitSeq(v, ",") {
					name, _, _ := strings.Cut(strings.Trim(tok, " \t"), "/")
					if strings.EqualFold(name, "h2c") {
						dropped = true
						continue
					}
					if t := strings.Trim(tok, " \t"); t != "" {
						keep = append(keep, t)
					}
				}
			}
			if dropped {
				r.Header.Del("HTTP2-Settings")
				if len(keep) == 0 {
					r.Header.Del("Upgrade")
				} else {
					r.Header["Upgrade"] = []string{strings.Join(keep, ", ")}
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}
