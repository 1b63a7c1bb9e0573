// Package reconcile resolves in-doubt keys by asking the upstream: a
// route's reconcile lookup (GET of its lookup path with the key) answers
// whether the request whose outcome is unknown was applied. 2xx completes
// the key with the lookup's answer, 404 or 410 releases it, anything else
// leaves it in doubt until the next lookup.
//
// The reconciler works for a proxy, its Host (proxy.ReconcileHost): the
// proxy's running routes, its transport to the upstream, its logger and
// its metrics. The proxy schedules the first lookup of a key it leaves in
// doubt; the reconciler finds the keys left without one (discovery). This
// package does not import the proxy, so that the admin API can use its
// Outcome and errors without it.
package reconcile

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
)

// Reconcile results, the result label of idemproxy_reconciliations_total.
const (
	ResultApplied    = "applied"     // the lookup found the effect: completed
	ResultNotApplied = "not_applied" // 404 or 410: released
	ResultError      = "error"       // anything else: still in doubt
)

// Results lists every result.
var Results = []string{ResultApplied, ResultNotApplied, ResultError}

// Host is what the reconciler needs of the proxy it works for:
// proxy.ReconcileHost.
type Host interface {
	// Routes returns the running routes that have a reconcile section,
	// none when no route has one.
	Routes() []config.Route
	// Route returns the running route whose keys are stored under
	// keyspace (one with a reconcile section, when several share it);
	// false when there is none.
	Route(keyspace string) (config.Route, bool)
	// Upstream returns the upstream's base URL, without a trailing '/'.
	Upstream() string
	// Transport carries the lookups to the upstream.
	Transport() http.RoundTripper
	// Logger receives the reconciler's errors and warnings.
	Logger() *slog.Logger
	// Store returns rs measured as the proxy's store is.
	Store(rs store.ReconcileStore) store.ReconcileStore
	// Reconciled counts a lookup of a key of route by its result (one of
	// Results); Due reports the keys due at a pass; Discovered counts an
	// in-doubt key of route found without a schedule and scheduled.
	Reconciled(route, result string)
	Due(n int)
	Discovered(route string)
	// Tracer traces the lookups while tracing is on; nil while off.
	Tracer() trace.Tracer
}

// Options configures New.
type Options struct {
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
	p    Host
	st   store.ReconcileStore
	opts Options
	sem  chan struct{}
	wg   sync.WaitGroup
}

// New returns the reconciler of the proxy p (proxy.Proxy.ReconcileHost).
// It needs Run to work in the background; Reconcile works without.
func New(p Host, opts Options) (*Reconciler, error) {
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
	r := &Reconciler{p: p, st: p.Store(opts.Store), opts: opts, sem: make(chan struct{}, opts.Concurrency)}
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
	for _, rc := range r.p.Routes() {
		keys, err := r.st.Unscheduled(ctx, store.Key(rc.Keyspace, "", ""), r.opts.Batch)
		if err != nil {
			if ctx.Err() == nil {
				r.p.Logger().Error("reconciler: find unscheduled in-doubt keys", "route", rc.Name, "err", err)
			}
			continue
		}
		for _, k := range keys {
			if _, scope, _, _ := splitStoreKey(k); scope != "-" {
				continue // see reconcile
			}
			if err := r.st.ScheduleLookup(ctx, k, rc.Reconcile.Grace.D()); err != nil {
				r.p.Logger().Error("reconciler: schedule a lookup", "route", rc.Name, "key_hash", store.KeyHash(k), "err", err)
				continue
			}
			r.p.Discovered(rc.Name)
		}
		if len(keys) > 0 {
			r.p.Logger().Warn("in-doubt keys without a lookup found", "route", rc.Name, "keys", len(keys))
		}
	}
}

// pass starts the lookups that are due, at most Concurrency at a time, and
// returns once every one has started.
func (r *Reconciler) pass(ctx context.Context) {
	if len(r.p.Routes()) == 0 {
		r.p.Due(0) // no route reconciles (any more): nothing is due
		return
	}
	keys, err := r.st.DueLookups(ctx, r.opts.Batch)
	if err != nil {
		if ctx.Err() == nil {
			r.p.Logger().Error("reconciler: find due lookups", "err", err)
		}
		return
	}
	r.p.Due(len(keys))
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
					r.p.Logger().Error("reconciler: lookup panicked; the key stays in doubt", "key_hash", store.KeyHash(k), "panic", e)
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

// Outcome is the result of one lookup.
type Outcome struct {
	// Result is applied, not_applied or error (Results).
	Result string `json:"result"`
	// LookupStatus is the status the lookup answered; 0 when none came.
	LookupStatus int `json:"lookup_status,omitempty"`
	// Error says why the result is error.
	Error string `json:"error,omitempty"`
}

// Reconcile looks up the in-doubt key under storeKey now, whether or not
// its lookup is due (the admin API's POST .../reconcile). It returns
// store.ErrNotInDoubt, store.ErrLookupBusy, ErrNoLookup, or the store's
// error.
func (r *Reconciler) Reconcile(ctx context.Context, storeKey string) (Outcome, error) {
	return r.reconcile(ctx, storeKey, true)
}

// ErrNoLookup is returned by Reconcile for a key of a route without a
// reconcile section, or a scoped key.
var ErrNoLookup = errors.New("the route has no reconcile lookup")

func (r *Reconciler) reconcile(ctx context.Context, key string, force bool) (Outcome, error) {
	keyspace, scope, _, ok := splitStoreKey(key)
	rc, found := r.p.Route(keyspace)
	// A scoped key (left by the route's earlier, scoped definition) is
	// never looked up: the answer could be another client's.
	if !ok || !found || rc.Reconcile == nil || scope != "-" {
		if !force {
			r.st.UnscheduleLookup(ctx, key)
		}
		return Outcome{}, ErrNoLookup
	}
	cfg := &rc
	ctx, span := r.startSpan(ctx, cfg.Name, key, force)
	out, err := r.claimAndLookup(ctx, cfg, key, force)
	endSpan(span, out, err)
	return out, err
}

// startSpan starts the span of a key's lookup while tracing is on (nil
// otherwise): the child of the admin request that asked for it, or a trace
// of its own for the background reconciler's.
func (r *Reconciler) startSpan(ctx context.Context, route, key string, force bool) (context.Context, trace.Span) {
	tr := r.p.Tracer()
	if tr == nil {
		return ctx, nil
	}
	return tr.Start(ctx, "reconcile "+route, trace.WithAttributes(
		tracing.AttrRoute.String(route), tracing.AttrKeyHash.String(store.KeyHash(key)),
		attribute.Bool("idemproxy.reconcile.forced", force)))
}

// endSpan ends a lookup's span (nil: none) with its outcome.
func endSpan(span trace.Span, out Outcome, err error) {
	if span == nil {
		return
	}
	switch {
	case err != nil:
		span.SetAttributes(attribute.String("idemproxy.reconcile.result", "refused"))
		if failure := !errors.Is(err, store.ErrNotInDoubt) && !errors.Is(err, store.ErrLookupBusy) && !errors.Is(err, store.ErrNotDue); failure {
			tracing.RecordError(span, err)
		}
	default:
		span.SetAttributes(attribute.String("idemproxy.reconcile.result", out.Result))
		if out.LookupStatus != 0 {
			span.SetAttributes(attribute.Int("idemproxy.reconcile.lookup_status", out.LookupStatus))
		}
		if out.Error != "" {
			tracing.SetError(span, out.Error) // may quote the upstream's reason phrase
		}
	}
	span.End()
}

// claimAndLookup takes the key's lookup lease, asks the upstream and
// settles the key by its answer.
func (r *Reconciler) claimAndLookup(ctx context.Context, cfg *config.Route, key string, force bool) (Outcome, error) {
	token := rand.Text()
	if err := r.st.ClaimLookup(ctx, key, token, cfg.Lease.D(), force); err != nil {
		return Outcome{}, err
	}
	out, res := r.lookup(ctx, cfg, key)
	if err := r.st.ResolveLookup(context.WithoutCancel(ctx), key, token, res); err != nil {
		if errors.Is(err, store.ErrNotOwner) {
			return Outcome{}, store.ErrNotInDoubt // settled meanwhile
		}
		r.p.Logger().Error("reconciler: settle a lookup", "route", cfg.Name, "key_hash", store.KeyHash(key), "err", err)
		return Outcome{}, err
	}
	r.p.Reconciled(cfg.Name, out.Result)
	r.p.Logger().Warn("in-doubt key reconciled", "route", cfg.Name, "key_hash", store.KeyHash(key),
		"result", out.Result, "lookup_status", out.LookupStatus, "err", out.Error)
	return out, nil
}

// lookup asks the upstream whether the key's request was applied.
func (r *Reconciler) lookup(ctx context.Context, cfg *config.Route, key string) (Outcome, store.LookupResult) {
	retry := store.LookupResult{RetryAfter: cfg.Reconcile.Interval.D()}
	fail := func(err error) (Outcome, store.LookupResult) {
		return Outcome{Result: ResultError, Error: err.Error()}, retry
	}
	_, _, idemKey, ok := splitStoreKey(key)
	if !ok {
		return fail(fmt.Errorf("store key %q has no route, scope and key", store.KeyHash(key)))
	}
	target, err := lookupURL(r.p.Upstream(), cfg.Reconcile.LookupPath(), idemKey)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.UpstreamTimeout.D())
	defer cancel()
	if trace.SpanFromContext(ctx).IsRecording() {
		// The lookup's span names the URL as configured: the key is in
		// the URL sent, and the traces name it only by its hash (nor
		// the upstream's credentials, nor the query).
		base := ""
		if u, err := url.Parse(r.p.Upstream()); err == nil {
			u.User = nil
			base = u.String()
		}
		path, _, _ := strings.Cut(cfg.Reconcile.LookupPath(), "?")
		ctx = tracing.WithURL(ctx, base+path)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return fail(fmt.Errorf("lookup request: %w", err))
	}
	req.Header.Set("Idempotent-Lookup", "true")
	resp, err := r.p.Transport().RoundTrip(req)
	if err != nil {
		return fail(fmt.Errorf("lookup: %w", err))
	}
	defer resp.Body.Close()
	out := Outcome{LookupStatus: resp.StatusCode}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		out.Result = ResultNotApplied
		return out, store.LookupResult{Release: true}
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		limit := cfg.MaxStoredBodyBytes
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			out.Result, out.Error = ResultError, fmt.Sprintf("read lookup answer: %v", err)
			return out, retry
		}
		stored := int64(len(body)) <= limit
		// The route's status for an applied request, not the lookup's:
		// the retry of a POST that created expects its 201, not a GET's 200.
		ans := store.Response{Status: cfg.Reconcile.AppliedStatus, Header: http.Header{}, BodyStored: stored, Reconciled: true}
		for _, name := range cfg.ReplayHeaders {
			if vs := resp.Header.Values(name); len(vs) > 0 {
				ans.Header[name] = vs
			}
		}
		if stored {
			ans.Body = body
		}
		out.Result = ResultApplied
		return out, store.LookupResult{Applied: &ans}
	default:
		out.Result, out.Error = ResultError, "the lookup answered "+resp.Status
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

// splitStoreKey undoes store.Key: keyspaces and the scope part hold no
// '/', the key may.
func splitStoreKey(k string) (keyspace, scope, key string, ok bool) {
	keyspace, rest, ok1 := strings.Cut(k, "/")
	scope, key, ok2 := strings.Cut(rest, "/")
	return keyspace, scope, key, ok1 && ok2 && key != ""
}
