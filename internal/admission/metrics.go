package admission

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterAdminMetrics exports the admin listener's connections and
// what its bound (admin.max_connections) did to them, on reg.
func RegisterAdminMetrics(reg prometheus.Registerer, l *Limiter) {
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

// RegisterMetrics exports, on reg, the client connections' state and what
// the limits did to them: server.max_connections, the per-client limits,
// the HTTP/2 frame guard and the header-line bound.
func RegisterMetrics(reg prometheus.Registerer, l *Limiter) {
	for i, reason := range clientRefusalReasons {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemproxy_client_streams_refused_total",
			Help:        "Requests or connections refused by a per-client limit: streams (server.max_requests_per_client in flight), resets (server.max_client_resets_per_second passed: connections closed or refused), shed (a client's connections closed so that another's stream fits server.max_connections).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(l.clients.refused[i].Load()) }))
	}
	for i, a := range overloadActions {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemproxy_overload_actions_total",
			Help:        "What the bounds over all clients did, by action (close_connection, refuse_connection, refuse_stream) and reason (resets: server.max_resets_per_second passed; memory: the heap past its share of memory_limit).",
			ConstLabels: prometheus.Labels{"action": a[0], "reason": a[1]},
		}, func() float64 { return float64(l.over.actions[i].Load()) }))
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_overload_state",
			Help: "What the proxy sheds for now: 0 nothing, 1 connections that reset more than they are served (server.max_resets_per_second passed), 2 new connections and HTTP/2 streams (the heap past its share of memory_limit), 3 both.",
		}, l.over.state),
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
			Name: "idemproxy_http2_ping_floods_total",
			Help: "HTTP/2 connections closed for PING frames past 64 at once or 10 a second.",
		}, func() float64 { return float64(l.pingFloods.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_request_headers_refused_total",
			Help: "HTTP/1 requests answered 431 too-many-header-fields: a header of more than 256 lines, cut as it was read.",
		}, func() float64 { return float64(l.headerRefused.Load()) }),
	)
}

// BufferMetrics show the buffer budget (server.max_buffered_bytes) and
// the request bodies it admits.
type BufferMetrics struct {
	budget       atomic.Pointer[Budget] // the proxy's; nil: none yet, the gauges read 0
	refusals     *prometheus.CounterVec
	bodyTimeouts prometheus.Counter
}

// NewBufferMetrics creates the buffer budget's collectors and registers
// them on reg; their gauges read 0 until Watch names the budget.
func NewBufferMetrics(reg prometheus.Registerer) *BufferMetrics {
	m := &BufferMetrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_buffer_refusals_total",
			Help: "Buffers refused by server.max_buffered_bytes, by reason: budget (a request body, 503), client (a request body over its client's share, 503), answer (a copy of an answer, not stored).",
		}, []string{"reason"}),
		bodyTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_request_body_timeouts_total",
			Help: "Request bodies of protected routes cut by server.body_timeout (408).",
		}),
	}
	held := func(f func(*Budget) int64) func() float64 {
		return func() float64 {
			if b := m.budget.Load(); b != nil {
				return float64(f(b))
			}
			return 0
		}
	}
	reg.MustRegister(m.refusals, m.bodyTimeouts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_buffered_bytes",
			Help: "Bytes of server.max_buffered_bytes held now by request bodies and copies of answers.",
		}, held(func(b *Budget) int64 { return b.used.Load() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_buffered_bytes_limit",
			Help: "server.max_buffered_bytes, as applied.",
		}, held(func(b *Budget) int64 { return b.limit.Load() })))
	for _, r := range bufferRefusalReasons {
		m.refusals.WithLabelValues(r)
	}
	return m
}

// Watch makes b the budget the gauges read and counts b's refusals. Call
// it once, before b is used.
func (m *BufferMetrics) Watch(b *Budget) {
	b.refused = func(reason string) { m.refusals.WithLabelValues(reason).Inc() }
	m.budget.Store(b)
}

// BodyTimedOut counts a request body cut by server.body_timeout.
func (m *BufferMetrics) BodyTimedOut() { m.bodyTimeouts.Inc() }
