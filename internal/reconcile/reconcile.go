package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
)

// Reconcile results, the result label of idemproxy_reconciliations_total.
const (
	ReconcileApplied    = "applied"     // the lookup found the effect: completed
	ReconcileNotApplied = "not_applied" // 404 or 410: released
	ReconcileError      = "error"       // anything else: still in doubt
)

// ReconcileResults lists every result.
var ReconcileResults = []string{ReconcileApplied, ReconcileNotApplied, ReconcileError}

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
		for _, r := range ReconcileResults {
			m.reconciliations.WithLabelValues(rc.Name, r)
		}
		m.discovered.WithLabelValues(rc.Name)
	}
	if rc.Mode == config.ModeObserve {
		for _, w := range Woulds {
			m.observed.WithLabelValues(rc.Name, w)
		}
	}
}

// ReconcilerOptions configures Proxy.NewReconciler.
type ReconcilerOptions struct {
	// Store is the proxy's store seen as a ReconcileStore (its operations
	// are measured like the proxy's). Required.
	Store store.ReconcileStore
	// Concurrency bounds the lookups running at once; zero means 4.
	Concurrency int
	// Tick is how often the reconciler looks for due keys; zero means 1s.
	Tick time.Duration
	// DiscoverEvery is how often it looks for in-doubt keys without a
	// schedule (a scan of the store); zero means one minute.
	DiscoverEvery time.Duration
	// Batch bounds the keys taken per pass; zero means 100.
	Batch int
}

// Reconciler resolves in-doubt keys by asking the upstream, in the
// background: Run it, cancel its context to stop it.
type Reconciler struct {
	p    *Proxy
	st   store.ReconcileStore
	opts ReconcilerOptions
	sem  chan struct{}
	wg   sync.WaitGroup
}

// NewReconciler returns the proxy's reconciler. It needs Run to work in
// the background; Reconcile works without.
func (p *Proxy) NewReconciler(opts ReconcilerOptions) (*Reconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("reconciler: a store is required")
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4
	}
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	if opts.DiscoverEvery <= 0 {
		opts.DiscoverEvery = time.Minute
	}
	if opts.Batch <= 0 {
		opts.Batch = 100
	}
	st := opts.Store
	if _, measured := st.(instrumentedReconcile); !measured {
		st = instrumentedReconcile{ReconcileStore: st, s: p.store.(instrumented)}
	}
	r := &Reconciler{p: p, st: st, opts: opts, sem: make(chan struct{}, opts.Concurrency)}
	return r, nil
}

// Run runs passes until ctx is cancelled, then waits for the lookups
// running and returns. A lookup cut by the cancellation leaves its key in
// doubt, to be looked up again after its lookup lease.
func (r *Reconciler) Run(ctx context.Context) {
	defer r.wg.Wait()
	t := time.NewTicker(r.opts.Tick)
	defer t.Stop()
	var lastDiscovery time.Time
	for {
		if time.Since(lastDiscovery) >= r.opts.DiscoverEvery {
			r.Discover(ctx)
			lastDiscovery = time.Now()
		}
		r.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Discover schedules the in-doubt keys without a schedule on the routes
// that reconcile, counting grace from now (never earlier than the grace
// after the key turned in doubt). In-doubt keys of other routes are left
// to an operator or their TTL, and so are scoped keys (see reconcile): the
// store is asked for the route's unscoped keys only, so that a batch full
// of scoped keys, which are never scheduled, cannot hide an unscoped one
// from every discovery.
func (r *Reconciler) Discover(ctx context.Context) {
	for _, rt := range r.p.table.Load().routes {
		if rt.cfg.Reconcile == nil {
			continue
		}
		keys, err := r.st.Unscheduled(ctx, store.Key(rt.cfg.Name, "", ""), r.opts.Batch)
		if err != nil {
			if ctx.Err() == nil {
				r.p.log.Error("reconciler: find unscheduled in-doubt keys", "route", rt.cfg.Name, "err", err)
			}
			continue
		}
		for _, k := range keys {
			if _, scope, _, _ := splitStoreKey(k); scope != "-" {
				continue // see reconcile
			}
			if err := r.st.ScheduleLookup(ctx, k, rt.cfg.Reconcile.Grace.D()); err != nil {
				r.p.log.Error("reconciler: schedule a lookup", "route", rt.cfg.Name, "key_hash", store.KeyHash(k), "err", err)
				continue
			}
			r.p.m.rec.discovered.WithLabelValues(rt.cfg.Name).Inc()
		}
		if len(keys) > 0 {
			r.p.log.Warn("in-doubt keys without a lookup found", "route", rt.cfg.Name, "keys", len(keys))
		}
	}
}

// pass starts the lookups that are due, at most Concurrency at a time, and
// returns once every one has started.
func (r *Reconciler) pass(ctx context.Context) {
	if !r.p.table.Load().reconciles {
		r.p.m.rec.due.Set(0) // no route reconciles (any more): nothing is due
		return
	}
	keys, err := r.st.DueLookups(ctx, r.opts.Batch)
	if err != nil {
		if ctx.Err() == nil {
			r.p.log.Error("reconciler: find due lookups", "err", err)
		}
		return
	}
	r.p.m.rec.due.Set(float64(len(keys)))
	for _, k := range keys {
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		r.wg.Add(1)
		go func() {
			defer func() { <-r.sem; r.wg.Done() }()
			defer func() {
				if e := recover(); e != nil { // a store used without its guard
					r.p.log.Error("reconciler: lookup panicked; the key stays in doubt", "key_hash", store.KeyHash(k), "panic", e)
				}
			}()
			r.reconcile(ctx, k, false)
		}()
	}
}

// RunOnce runs one pass (discovery included) and waits for its lookups.
func (r *Reconciler) RunOnce(ctx context.Context) {
	r.Discover(ctx)
	r.pass(ctx)
	r.wg.Wait()
}

// ReconcileOutcome is the result of one lookup.
type ReconcileOutcome struct {
	// Result is applied, not_applied or error.
	Result string `json:"result"`
	// LookupStatus is the status the lookup answered; 0 when none came.
	LookupStatus int `json:"lookup_status,omitempty"`
	// Error says why the result is error.
	Error string `json:"error,omitempty"`
}

// Reconcile looks up the in-doubt key under storeKey now, whether or not
// its lookup is due (the admin API's POST .../reconcile). It returns
// ErrNotInDoubt, ErrLookupBusy, or an error naming a route without
// reconcile.
func (r *Reconciler) Reconcile(ctx context.Context, storeKey string) (ReconcileOutcome, error) {
	return r.reconcile(ctx, storeKey, true)
}

// ErrNoReconcile is returned by Reconcile for a key of a route without a
// reconcile section, or a scoped key.
var ErrNoReconcile = errors.New("the route has no reconcile lookup")

func (r *Reconciler) reconcile(ctx context.Context, key string, force bool) (ReconcileOutcome, error) {
	rt := r.p.routeOf(key)
	// A scoped key (left by the route's earlier, scoped definition) is
	// never looked up: the answer could be another client's.
	if _, scope, _, _ := splitStoreKey(key); rt == nil || rt.cfg.Reconcile == nil || scope != "-" {
		if !force {
			r.st.UnscheduleLookup(ctx, key)
		}
		return ReconcileOutcome{}, ErrNoReconcile
	}
	cfg := &rt.cfg
	token := rand.Text()
	if err := r.st.ClaimLookup(ctx, key, token, cfg.Lease.D(), force); err != nil {
		return ReconcileOutcome{}, err
	}
	out, res := r.lookup(ctx, rt, key)
	if err := r.st.ResolveLookup(context.WithoutCancel(ctx), key, token, res); err != nil {
		if errors.Is(err, store.ErrNotOwner) {
			return ReconcileOutcome{}, store.ErrNotInDoubt // settled meanwhile
		}
		r.p.log.Error("reconciler: settle a lookup", "route", cfg.Name, "key_hash", store.KeyHash(key), "err", err)
		return ReconcileOutcome{}, err
	}
	r.p.m.rec.reconciliations.WithLabelValues(cfg.Name, out.Result).Inc()
	r.p.log.Warn("in-doubt key reconciled", "route", cfg.Name, "key_hash", store.KeyHash(key),
		"result", out.Result, "lookup_status", out.LookupStatus, "err", out.Error)
	return out, nil
}

// lookup asks the upstream whether the key's request was applied.
func (r *Reconciler) lookup(ctx context.Context, rt *route, key string) (ReconcileOutcome, store.LookupResult) {
	cfg := &rt.cfg
	retry := store.LookupResult{RetryAfter: cfg.Reconcile.Interval.D()}
	fail := func(err error) (ReconcileOutcome, store.LookupResult) {
		return ReconcileOutcome{Result: ReconcileError, Error: err.Error()}, retry
	}
	_, _, idemKey, ok := splitStoreKey(key)
	if !ok {
		return fail(fmt.Errorf("store key %q has no route, scope and key", store.KeyHash(key)))
	}
	target, err := lookupURL(r.p.table.Load().upstream, cfg.Reconcile.LookupPath(), idemKey)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.UpstreamTimeout.D())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return fail(fmt.Errorf("lookup request: %w", err))
	}
	req.Header.Set("Idempotent-Lookup", "true")
	resp, err := r.p.transport.RoundTrip(req)
	if err != nil {
		return fail(fmt.Errorf("lookup: %w", err))
	}
	defer resp.Body.Close()
	out := ReconcileOutcome{LookupStatus: resp.StatusCode}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		out.Result = ReconcileNotApplied
		return out, store.LookupResult{Release: true}
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		limit := cfg.MaxStoredBodyBytes
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			out.Result, out.Error = ReconcileError, fmt.Sprintf("read lookup answer: %v", err)
			return out, retry
		}
		stored := int64(len(body)) <= limit
		ans := store.Response{Status: resp.StatusCode, Header: http.Header{}, BodyStored: stored, Reconciled: true}
		for _, name := range cfg.ReplayHeaders {
			if vs := resp.Header.Values(name); len(vs) > 0 {
				ans.Header[name] = vs
			}
		}
		if stored {
			ans.Body = body
		}
		out.Result = ReconcileApplied
		return out, store.LookupResult{Applied: &ans}
	default:
		out.Result, out.Error = ReconcileError, "the lookup answered "+resp.Status
		return out, retry
	}
}

// lookupURL fills key into the lookup path: path-escaped in the path,
// query-escaped in the query, so that no key can add a path segment or a
// parameter. A key that is "." or ".." is refused: upstreams clean dot
// segments, so the lookup would ask about another resource, and its 404
// would release a key whose request may have been applied.
func lookupURL(base, lookupPath, key string) (*url.URL, error) {
	if key == "." || key == ".." {
		return nil, fmt.Errorf("the key %q cannot be looked up: it is a dot segment", key)
	}
	i := strings.Index(lookupPath, config.LookupKeyPlaceholder)
	esc := url.PathEscape(key)
	if q := strings.IndexByte(lookupPath, '?'); q >= 0 && q < i {
		esc = url.QueryEscape(key)
	}
	u, err := url.Parse(base + lookupPath[:i] + esc + lookupPath[i+len(config.LookupKeyPlaceholder):])
	if err != nil {
		return nil, fmt.Errorf("lookup url: %w", err)
	}
	return u, nil
}

// scheduleLookup schedules the first lookup of a key that just turned in
// doubt, on a route that reconciles.
func (a *attempt) scheduleLookup() {
	rc := a.rt.cfg.Reconcile
	st := a.p.rstore
	if rc == nil || st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := st.ScheduleLookup(ctx, a.storeKey, rc.Grace.D()); err != nil {
		// Discovery finds it later.
		a.p.log.Error("schedule the lookup of an in-doubt key", "route", a.routeName(), "key_hash", store.KeyHash(a.storeKey), "err", err)
	}
}

// routeOf returns the current route of a store key, or nil.
func (p *Proxy) routeOf(storeKey string) *route {
	name, _, _, ok := splitStoreKey(storeKey)
	if !ok {
		return nil
	}
	return p.table.Load().routes[name]
}

// splitStoreKey undoes store.Key: route names and the scope part hold no
// '/', the key may.
func splitStoreKey(k string) (route, scope, key string, ok bool) {
	route, rest, ok1 := strings.Cut(k, "/")
	scope, key, ok2 := strings.Cut(rest, "/")
	return route, scope, key, ok1 && ok2 && key != ""
}

// instrumentedReconcile adds the store metrics to a ReconcileStore, as
// instrumented does for Store; the refusals of ClaimLookup and
// ResolveLookup are answers, not errors.
type instrumentedReconcile struct {
	store.ReconcileStore
	s instrumented
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
	defer func(start time.Time) { r.observe("schedule_lookup", start, err) }(time.Now())
	return r.ReconcileStore.ScheduleLookup(ctx, key, after)
}

func (r instrumentedReconcile) Unscheduled(ctx context.Context, prefix string, limit int) (keys []string, err error) {
	defer func(start time.Time) { r.observe("unscheduled", start, err) }(time.Now())
	return r.ReconcileStore.Unscheduled(ctx, prefix, limit)
}

func (r instrumentedReconcile) DueLookups(ctx context.Context, limit int) (keys []string, err error) {
	defer func(start time.Time) { r.observe("due_lookups", start, err) }(time.Now())
	return r.ReconcileStore.DueLookups(ctx, limit)
}

func (r instrumentedReconcile) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) (err error) {
	defer func(start time.Time) { r.observe("claim_lookup", start, err) }(time.Now())
	return r.ReconcileStore.ClaimLookup(ctx, key, token, lease, force)
}

func (r instrumentedReconcile) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) (err error) {
	defer func(start time.Time) { r.observe("resolve_lookup", start, err) }(time.Now())
	return r.ReconcileStore.ResolveLookup(ctx, key, token, res)
}

func (r instrumentedReconcile) UnscheduleLookup(ctx context.Context, key string) (err error) {
	defer func(start time.Time) { r.observe("unschedule_lookup", start, err) }(time.Now())
	return r.ReconcileStore.UnscheduleLookup(ctx, key)
}
