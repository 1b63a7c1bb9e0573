package app

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxHeaderBytes bounds a request's header: the request line and header
// fields in HTTP/1.1, the decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE)
// in HTTP/2.
const maxHeaderBytes = 64 << 10

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

// serverProtocols is what the client-facing listener speaks: HTTP/1.1 and
// cleartext HTTP/2 with prior knowledge (a connection that opens with the
// HTTP/2 preface, as service-mesh sidecars and curl --http2-prior-knowledge
// send). Go's server does not implement the HTTP/1.1 Upgrade to h2c; see
// withoutH2CUpgrade.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// serverHTTP2 bounds what one HTTP/2 connection may hold. The idle timeout,
// the header size (maxHeaderBytes) and the request read timeout are the
// http.Server's, as for HTTP/1.1.
func serverHTTP2() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          h2MaxStreams,
		MaxReceiveBufferPerStream:     h2StreamWindow,
		MaxReceiveBufferPerConnection: h2ConnWindow,
	}
}

// withoutH2CUpgrade takes "h2c" out of a request's Upgrade header (and
// drops HTTP2-Settings): the request is served as the HTTP/1.1 request it
// also is, and never passed on as a protocol switch. Passed on, an
// upstream that accepts h2c would turn the client's connection into a
// tunnel to itself, and every later request on it, those of protected
// routes included, would reach the upstream without the proxy. Other
// protocols (WebSocket) are left as they are.
func withoutH2CUpgrade(next http.Handler) http.Handler {
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

// The admin listener's own timeouts. Its requests are small and its
// clients (probes, scrapes, operators) send them at once; an idle
// keep-alive connection (a Prometheus scrape's between scrapes) may stay,
// and is the first to go when connections run short.
const (
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 30 * time.Second
	adminIdleTimeout       = 2 * time.Minute
	adminMaxHeaderBytes    = 16 << 10
)

// registerAdminConnMetrics exports the admin listener's connections and
// what its bound (admin.max_connections) did to them.
func registerAdminConnMetrics(reg prometheus.Registerer, l *connLimiter) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_admin_connections_open",
			Help: "Connections open on the admin listener.",
		}, func() float64 { a, i := l.Counts(); return float64(a + i) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_admin_connections_max",
			Help: "The bound on the admin listener's connections open at once (admin.max_connections).",
		}, func() float64 { return float64(l.max) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_admin_connections_shed_total",
			Help: "Admin connections not serving a request closed at admin.max_connections to admit a client holding fewer connections, or the same client's newer one.",
		}, func() float64 { return float64(l.shed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_admin_connections_refused_total",
			Help: "New admin connections closed at once at admin.max_connections: their client address already held as many as any other.",
		}, func() float64 { return float64(l.refused.Load()) }),
	)
}

// registerConnMetrics exports the client connections' state and what the
// limit did to them.
func registerConnMetrics(reg prometheus.Registerer, l *connLimiter) {
	for i, reason := range clientRefusalReasons {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemproxy_client_streams_refused_total",
			Help:        "Requests or connections refused by a per-client limit: streams (server.max_requests_per_client in flight), resets (server.max_client_resets_per_second passed: connections closed or refused), shed (a client's connections closed so that another's stream fits server.max_connections).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(l.clients.refused[i].Load()) }))
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_connections_active",
			Help: "Client connections reading or serving a request (HTTP/2: with an open stream), or hijacked.",
		}, func() float64 { a, _ := l.Counts(); return float64(a) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_connections_idle",
			Help: "Client connections waiting for a request: keep-alive between requests, new, or HTTP/2 without an open stream.",
		}, func() float64 { _, i := l.Counts(); return float64(i) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_connections_max",
			Help: "The bound on client connections open at once (server.max_connections).",
		}, func() float64 { return float64(l.max) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_connections_shed_total",
			Help: "Idle client connections closed to admit a new one at server.max_connections.",
		}, func() float64 { return float64(l.shed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_connections_waited_total",
			Help: "New client connections that found no connection to shed at server.max_connections (every one serving or reading a request) and waited.",
		}, func() float64 { return float64(l.waited.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_http2_streams_refused_total",
			Help: "HTTP/2 streams answered 503 overloaded because server.max_connections requests were in flight.",
		}, func() float64 { return float64(l.h2Refused.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_client_stream_resets_total",
			Help: "HTTP/2 streams reset by their client (RST_STREAM frames received), counted against server.max_client_resets_per_second.",
		}, func() float64 { return float64(l.clients.resets.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_http2_continuation_floods_total",
			Help: "HTTP/2 connections closed for a run of CONTINUATION frames that adds no header bytes.",
		}, func() float64 { return float64(l.emptyContinuations.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_request_headers_refused_total",
			Help: "HTTP/1 requests answered 431 too-many-header-fields: a header of more than 256 lines, cut as it was read.",
		}, func() float64 { return float64(l.headerRefused.Load()) }),
	)
}
