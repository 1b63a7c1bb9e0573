package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// The reconciler (package internal/reconcile) resolves in-doubt keys by
// asking the upstream. It lives outside the proxy, but the proxy holds what
// it works with: the running routes, the transport to the upstream, the
// store's metrics and the reconciliation metrics (registered with the
// proxy's, their series created as routes load). ReconcileHost hands them
// out; the proxy itself schedules the first lookup of a key it leaves in
// doubt (scheduleLookup).

// reconcileMetrics are the collectors of reconciliation and observe mode.
type reconcileMetrics struct {
	reconciliations *prometheus.CounterVec
	due             prometheus.Gauge
	discovered      *prometheus.CounterVec
	observed        *prometheus.CounterVec
}

func newReconcileMetrics(reg prometheus.Registerer) *reconcileMetrics {
	m := &reconcileMetrics{
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_reconciliations_total",
			Help: "Lookups of in-doubt keys, by route and result (applied: completed with the lookup's answer; not_applied: released; error: still in doubt).",
		}, []string{"route", "result"}),
		due: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_reconcile_due_keys",
			Help: "In-doubt keys whose lookup was due at the reconciler's last pass (at most one batch).",
		}),
		discovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_reconcile_discovered_total",
			Help: "In-doubt keys found without a scheduled lookup (left by a crash, or a lease that lapsed) and scheduled, by route.",
		}, []string{"route"}),
		observed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_observed_total",
			Help: "Requests forwarded by routes in observe mode that enforce mode would have answered itself, by route and what it would have done.",
		}, []string{"route", "would"}),
	}
	reg.MustRegister(m.reconciliations, m.due, m.discovered, m.observed)
	return m
}

func (m *reconcileMetrics) initRoute(rc config.Route) {
	if rc.Reconcile != nil {
		for _, r := range reconcile.Results {
			m.reconciliations.WithLabelValues(rc.Name, r)
		}
		m.discovered.WithLabelValues(rc.Name)
	}
	if rc.Mode == config.ModeObserve {
		for _, w := range Woulds {
			m.observed.WithLabelValues(rc.Name, string(w))
		}
	}
}

// ReconcileHost is the part of a Proxy its reconciler works with: a
// reconcile.Host. The zero value is not usable: get one from
// Proxy.ReconcileHost.
type ReconcileHost struct{ p *Proxy }

var _ reconcile.Host = ReconcileHost{}

// ReconcileHost returns the proxy as its reconciler sees it.
func (p *Proxy) ReconcileHost() ReconcileHost { return ReconcileHost{p} }

// Routes returns the routes of the running configuration that have a
// reconcile section, in no particular order; none when no route has one
// (after a reload, perhaps).
func (h ReconcileHost) Routes() []config.Route {
	var out []config.Route
	for _, rt := range h.p.table.Load().routes {
		if rt.cfg.Reconcile != nil {
			out = append(out, rt.cfg)
		}
	}
	return out
}

// Route returns the running configuration of the route whose keys are
// stored under keyspace, as the proxy serves it: of the routes that share
// the keyspace, one with a reconcile section if there is one (they make
// their keys alike: config's validation). False when no route claims it.
func (h ReconcileHost) Route(keyspace string) (config.Route, bool) {
	var (
		found config.Route
		ok    bool
	)
	for _, rt := range h.p.table.Load().byKeyspace[keyspace] {
		if !ok || (found.Reconcile == nil && rt.cfg.Reconcile != nil) {
			found, ok = rt.cfg, true
		}
	}
	return found, ok
}

// Upstream returns the running configuration's upstream URL, without a
// trailing '/'.
func (h ReconcileHost) Upstream() string { return h.p.table.Load().upstream }

// Transport returns the transport that carries the proxy's requests to the
// upstream (Options.Transport), for requests that may be sent again, such
// as lookups.
func (h ReconcileHost) Transport() http.RoundTripper { return h.p.transport }

// Tracer returns the proxy's tracer while tracing is on, nil while off.
func (h ReconcileHost) Tracer() trace.Tracer { return h.p.tracing.Tracer() }

// Logger returns the proxy's logger (Options.Logger; never nil).
func (h ReconcileHost) Logger() *slog.Logger { return h.p.log }

// Store returns rs measured by the proxy's store metrics, as the proxy's
// own store is; rs is returned as it is when it already is.
func (h ReconcileHost) Store(rs store.ReconcileStore) store.ReconcileStore {
	if _, measured := rs.(instrumentedReconcile); measured {
		return rs
	}
	return instrumentedReconcile{ReconcileStore: rs, s: h.p.store.(instrumented)}
}

// Reconciled counts one lookup of a key of route, by its result (one of
// reconcile.Results), in idemproxy_reconciliations_total.
func (h ReconcileHost) Reconciled(route, result string) {
	h.p.m.rec.reconciliations.WithLabelValues(route, result).Inc()
}

// Due sets idemproxy_reconcile_due_keys, the keys due at the last pass.
func (h ReconcileHost) Due(n int) { h.p.m.rec.due.Set(float64(n)) }

// Discovered counts an in-doubt key of route found without a schedule and
// scheduled, in idemproxy_reconcile_discovered_total.
func (h ReconcileHost) Discovered(route string) { h.p.m.rec.discovered.WithLabelValues(route).Inc() }

// scheduleLookup schedules the first lookup of a key that just turned in
// doubt, on a route that reconciles.
func (a *attempt) scheduleLookup() {
	rc := a.rt.cfg.Reconcile
	st := a.p.rstore
	if rc == nil || st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(a.detached(), storeTimeout)
	defer cancel()
	if err := st.ScheduleLookup(ctx, a.storeKey, rc.Grace.D()); err != nil {
		// Discovery finds it later.
		a.p.log.Error("schedule the lookup of an in-doubt key", "route", a.routeName(), "key_hash", store.KeyHash(a.storeKey), "err", err)
	}
}

// instrumentedReconcile adds the store metrics to a ReconcileStore, as
// instrumented does for Store; the refusals of ClaimLookup and
// ResolveLookup are answers, not errors.
type instrumentedReconcile struct {
	store.ReconcileStore
	s instrumented
}

// failure is err unless it is one of the store's answers (the record is
// not in doubt, busy, not due, or no longer the caller's), for a span's
// status.
func failure(err error) error {
	for _, answer := range []error{store.ErrNotInDoubt, store.ErrLookupBusy, store.ErrNotDue, store.ErrNotOwner} {
		if errors.Is(err, answer) {
			return nil
		}
	}
	return err
}

func (r instrumentedReconcile) observe(op string, start time.Time, err error) {
	for _, answer := range []error{store.ErrNotInDoubt, store.ErrLookupBusy, store.ErrNotDue} {
		if errors.Is(err, answer) {
			err = nil
		}
	}
	r.s.observe(op, start, err)
}

func (r instrumentedReconcile) ScheduleLookup(ctx context.Context, key string, after time.Duration) (err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "schedule_lookup")
	defer func(start time.Time) { r.observe("schedule_lookup", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.ScheduleLookup(ctx, key, after)
}

func (r instrumentedReconcile) Unscheduled(ctx context.Context, prefix string, limit int) (keys []string, err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "unscheduled")
	defer func(start time.Time) { r.observe("unscheduled", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.Unscheduled(ctx, prefix, limit)
}

func (r instrumentedReconcile) DueLookups(ctx context.Context, limit int) (keys []string, err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "due_lookups")
	defer func(start time.Time) { r.observe("due_lookups", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.DueLookups(ctx, limit)
}

func (r instrumentedReconcile) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) (err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "claim_lookup")
	defer func(start time.Time) { r.observe("claim_lookup", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.ClaimLookup(ctx, key, token, lease, force)
}

func (r instrumentedReconcile) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) (err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "resolve_lookup")
	defer func(start time.Time) { r.observe("resolve_lookup", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.ResolveLookup(ctx, key, token, res)
}

func (r instrumentedReconcile) UnscheduleLookup(ctx context.Context, key string) (err error) {
	ctx, span := storeSpan(ctx, r.s.tracing, r.s.name, "unschedule_lookup")
	defer func(start time.Time) { r.observe("unschedule_lookup", start, err); endStoreSpan(span, failure(err)) }(time.Now())
	return r.ReconcileStore.UnscheduleLookup(ctx, key)
}
