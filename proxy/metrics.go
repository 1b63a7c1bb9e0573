package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
)

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	requests         *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	upstreamDuration *prometheus.HistogramVec
	storeDuration    *prometheus.HistogramVec
	storeErrors      *prometheus.CounterVec
	inFlight         *prometheus.GaugeVec
	rec              *reconcileMetrics        // reconciliation and observe mode
	adm              *admission.BufferMetrics // the buffer budget and request bodies
	answersNotStored *prometheus.CounterVec
	// other holds the latency histograms shared by the routes past
	// metrics.route_histograms (route label config.OtherRoutes).
	other *routeSeries
}

// NewMetrics creates the proxy's collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_requests_total",
			Help: "Requests handled, by route and outcome (route is empty when no route matched).",
		}, []string{"route", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its answer, by route and outcome (route \"(other)\": the routes past metrics.route_histograms).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "outcome"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_upstream_request_duration_seconds",
			Help:    "Time until the upstream's response headers, by route and status code (\"error\" when none came; route \"(other)\": the routes past metrics.route_histograms).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "code"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_operation_duration_seconds",
			Help:    "Duration of key store operations, by store and operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"store", "operation"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_store_errors_total",
			Help: "Key store operations that failed, by store and operation.",
		}, []string{"store", "operation"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemproxy_requests_in_flight",
			Help: "Requests being handled now, by route.",
		}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.duration, m.upstreamDuration, m.storeDuration, m.storeErrors, m.inFlight)
	m.rec = newReconcileMetrics(reg)
	m.adm = admission.NewBufferMetrics(reg)
	m.answersNotStored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_answers_not_stored_total",
		Help: "Answers committed without their body (duplicates get 409 response-not-replayable), by route and reason: too_large (max_stored_body_bytes), over_budget (server.max_buffered_bytes).",
	}, []string{"route", "reason"})
	reg.MustRegister(m.answersNotStored)
	m.other = m.routeSeries(config.OtherRoutes, true)
	return m
}

// watchedOutcomes are the outcomes whose idemproxy_requests_total series
// every route has from the start, whatever metrics.route_histograms says:
// those the shipped alert rules watch (deploy/prometheus/idemproxy-alerts.yaml),
// whose first increase an alert must see. A route with histograms of its
// own has every outcome from the start; the others get the rest at first
// use (a rate then misses only that first request).
var watchedOutcomes = []Outcome{OutcomeInDoubt, OutcomeConflict, OutcomeUnprotected, OutcomeStoreError}

// initRoute creates a route's series at zero, so that rates and alerts see
// them before the first request: with histograms of its own (own), every
// outcome's counter and histogram and the answers-not-stored counters, as
// for a route of a small configuration; without, the counters of
// watchedOutcomes, so that 10,000 routes stay a scrape of a few MB.
func (m *Metrics) initRoute(s *routeSeries, own bool) {
	outcomes := watchedOutcomes
	if own {
		outcomes = Outcomes
	}
	for _, o := range outcomes {
		if o == OutcomePassthrough {
			continue
		}
		s.requests.of(string(o))
		if own {
			s.duration.of(string(o))
		}
	}
	if own {
		for _, reason := range []string{notStoredTooLarge, notStoredOverBudget} {
			m.answersNotStored.WithLabelValues(s.route, reason)
		}
	}
}

// initOtherRoutes creates the shared latency histograms of the routes past
// metrics.route_histograms at zero, for every outcome.
func (m *Metrics) initOtherRoutes() {
	for _, o := range Outcomes {
		if o != OutcomePassthrough {
			m.other.duration.of(string(o))
		}
	}
}

// storeOperations lists the operation label values of the store metrics.
var storeOperations = []string{"reserve", "commit", "release", "mark_in_doubt", "get", "ping",
	"schedule_lookup", "unschedule_lookup", "unscheduled", "due_lookups", "claim_lookup", "resolve_lookup"}

// initStore creates a store's operation and error series at zero, so that
// the store-error alert and the dashboard see them on a healthy proxy.
func (m *Metrics) initStore(store string) {
	for _, op := range storeOperations {
		m.storeDuration.WithLabelValues(store, op)
		m.storeErrors.WithLabelValues(store, op)
	}
}

// instrumented wraps a Store with operation timings and error counts, and,
// under a traced request, a span for each operation.
type instrumented struct {
	store.Store
	series *storeSeries
	name   string // the store's name, for its spans
	// tracing traces the operations of traced requests; nil: never.
	tracing *tracing.Tracing
}

func (s instrumented) observe(op string, start time.Time, err error) {
	s.series.duration.of(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		s.series.errors.of(op).Inc()
	}
}

// begin starts timing op, and its span when ctx's span is recording; done
// ends both.
func (s instrumented) begin(ctx context.Context, op string) (context.Context, storeOp) {
	ctx, span := storeSpan(ctx, s.tracing, s.name, op)
	return ctx, storeOp{s: s, op: op, start: time.Now(), span: span}
}

// storeOp is one measured store operation.
type storeOp struct {
	s     instrumented
	op    string
	start time.Time
	span  trace.Span // nil: not traced
}

func (o storeOp) done(err error) {
	o.s.observe(o.op, o.start, err)
	if errors.Is(err, store.ErrNotOwner) {
		err = nil // an answer, not a failure
	}
	endStoreSpan(o.span, err)
}

func (s instrumented) Reserve(ctx context.Context, key string, res store.Reservation) (rec *store.Record, err error) {
	ctx, o := s.begin(ctx, "reserve")
	defer func() { o.done(err) }()
	return s.Store.Reserve(ctx, key, res)
}

func (s instrumented) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) (err error) {
	ctx, o := s.begin(ctx, "commit")
	defer func() { o.done(err) }()
	return s.Store.Commit(ctx, key, token, resp, ttl)
}

func (s instrumented) Release(ctx context.Context, key, token string) (err error) {
	ctx, o := s.begin(ctx, "release")
	defer func() { o.done(err) }()
	return s.Store.Release(ctx, key, token)
}

func (s instrumented) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) (err error) {
	ctx, o := s.begin(ctx, "mark_in_doubt")
	defer func() { o.done(err) }()
	return s.Store.MarkInDoubt(ctx, key, token, ttl)
}

func (s instrumented) Get(ctx context.Context, key string) (rec *store.Record, err error) {
	ctx, o := s.begin(ctx, "get")
	defer func() { o.done(err) }()
	return s.Store.Get(ctx, key)
}

func (s instrumented) Ping(ctx context.Context) (err error) {
	start := time.Now()
	defer func() { s.observe("ping", start, err) }()
	return s.Store.Ping(ctx)
}
