// Package proxy is idemproxy's reverse proxy: it matches routes, extracts
// and fingerprints idempotency keys, reserves them in a Store, forwards the
// first request, classifies the upstream's outcome, and commits the answer
// for replay, releases the key or leaves it in doubt (classify, which is
// the table of docs/concepts.md "What the upstream's outcome does to the key").
package proxy

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/keyextract"
	"github.com/idemproxy/idemproxy/store"
)

// storeTimeout bounds the store operations that settle a forwarded request
// (commit, release, in doubt), which run after the upstream's own deadline.
const storeTimeout = 5 * time.Second

// Options configures New.
type Options struct {
	// Store keeps the key records. Required.
	Store store.Store
	// StoreName labels the store metrics ("badger", "redis").
	StoreName string
	// Logger receives errors and warnings, and the access log at level
	// INFO unless AccessLog is set; nil discards them.
	Logger *slog.Logger
	// AccessLog, when set, writes the access log instead of Logger, at a
	// fraction of slog's cost; nil leaves it to Logger.
	AccessLog *AccessLog
	// Metrics receives the proxy's metrics; nil registers them on a
	// private registry.
	Metrics *Metrics
	// Transport carries requests to the upstream; nil means NewTransport()
	// with the configuration's upstream_tls.
	Transport http.RoundTripper
	// Settler retries the writes that settle a key when they fail (the
	// proxy's own in a Group of it); nil: a Settler of the proxy's own.
	Settler *settle.Settler
	// Tracing, while on, traces every request (proxy/tracing.go); nil is
	// never on.
	Tracing *tracing.Tracing
	// Witness remembers the keys this replica answered, and judges a
	// reservation that succeeds on one of them (proxy/witness.go); nil:
	// none.
	Witness *witness.Witness
}

// Proxy is the idempotency proxy, an http.Handler. Reload swaps its routes
// while it serves.
type Proxy struct {
	store     store.Store
	rstore    store.ReconcileStore // nil: the store cannot reconcile
	log       *slog.Logger
	errorLog  *log.Logger // the reverse proxies' error log (log at debug), one for every route
	access    *AccessLog  // nil: the access log goes to log
	m         *Metrics
	transport http.RoundTripper // passthrough
	protected http.RoundTripper // routes: never resends
	table     atomic.Pointer[table]
	budget    admission.Budget // request bytes buffered at once
	tracing   *tracing.Tracing // nil: off
	storeName string           // Options.StoreName
	// held maps the routes held by Hold to why (nil: none).
	held    atomic.Pointer[map[string]string]
	witness *witness.Witness // nil: none

	// life is the parent of every upstream request's context: Abort
	// cancels it, which turns the requests still waiting for an answer in
	// doubt.
	life   context.Context
	abort  context.CancelFunc
	active tracker
	// settling retries settling writes in the background; Wait waits for
	// it, Abort stops it.
	settling *settle.Settler
	// waiters are the duplicates waiting on keys (concurrent: wait), one
	// poll per key (waiters.go).
	waiters waiters
}

// tracker counts the requests that may still write to the store, and
// refuses new ones once Wait has begun.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   sync.Cond
}

func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 {
		t.idle.Broadcast()
	}
}

// close refuses the requests that come from now on.
func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

func (t *tracker) wait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for t.n > 0 {
		t.idle.Wait()
	}
}

// table is one configuration's routing, swapped whole by Reload.
type table struct {
	mux         *http.ServeMux
	routes      map[string]*route
	passthrough *httputil.ReverseProxy
	ptSeries    *routeSeries
	ptTimeout   time.Duration
	upstream    string // the upstream's base URL, without a trailing '/'
	reconciles  bool   // a route has a reconcile section
	// byKeyspace lists the routes of each keyspace (routes[].keyspace):
	// several when routes share one.
	byKeyspace map[string][]*route
	// bodyTimeout bounds the arrival of a protected request's body
	// (server.body_timeout, at most read_timeout); readTimeout is the
	// server's read_timeout.
	bodyTimeout, readTimeout time.Duration
	// bodyReserve is the free budget below which /readyz reports
	// saturation: the largest route's max_body_bytes, at most an eighth of
	// the budget.
	bodyReserve int64
}

// route is one configured route, ready to serve.
type route struct {
	cfg    config.Route
	spec   keyextract.Spec
	ignore *keyextract.Ignore // fingerprint.ignore, compiled once
	rp     *httputil.ReverseProxy
	p      *Proxy
	series *routeSeries
	// httpRoute is the path of the route's pattern, its spans' http.route.
	httpRoute string
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.p.serveRoute(w, r, rt) }

// New returns a proxy serving cfg.
func New(cfg *config.Config, opts Options) (*Proxy, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("proxy: a store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if opts.Transport == nil {
		tlsConf, err := cfg.UpstreamTLS.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		t := NewTransport()
		t.TLSClientConfig = tlsConf
		opts.Transport = t
	}
	if opts.StoreName == "" {
		opts.StoreName = "store"
	}
	opts.Metrics.initStore(opts.StoreName)
	p := &Proxy{
		store:     instrumented{Store: opts.Store, series: opts.Metrics.storeSeries(opts.StoreName), name: opts.StoreName, tracing: opts.Tracing},
		log:       opts.Logger,
		errorLog:  slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
		access:    opts.AccessLog,
		m:         opts.Metrics,
		transport: tracedTransport{next: opts.Transport, tracing: opts.Tracing},
		protected: tracedTransport{next: newNoResend(opts.Transport), tracing: opts.Tracing},
		tracing:   opts.Tracing,
		storeName: opts.StoreName,
		witness:   opts.Witness,
	}
	if rs, ok := opts.Store.(store.ReconcileStore); ok {
		p.rstore = instrumentedReconcile{ReconcileStore: rs, s: p.store.(instrumented)}
	}
	p.active.idle.L = &p.active.mu
	if opts.Settler == nil {
		opts.Settler = settle.New(opts.Logger)
	}
	p.settling = opts.Settler.Group()
	p.m.adm.Watch(&p.budget)
	p.life, p.abort = context.WithCancel(context.Background())
	if err := p.Reload(cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// Reload builds the routing of cfg and swaps it in atomically; requests
// already being handled finish under the configuration they started with.
// The store is not changed by a reload.
func (p *Proxy) Reload(cfg *config.Config) error {
	up, err := url.Parse(cfg.Upstream)
	if err != nil {
		return fmt.Errorf("proxy: upstream: %w", err)
	}
	t := &table{
		mux:        http.NewServeMux(),
		routes:     make(map[string]*route, len(cfg.Routes)),
		byKeyspace: make(map[string][]*route, len(cfg.Routes)),
		ptTimeout:  cfg.Server.PassthroughTimeout.D(),
		upstream:   strings.TrimSuffix(up.String(), "/"),
		ptSeries:   p.m.routeSeries("", true),
	}
	t.passthrough = p.reverseProxy(up, nil)
	own := ownHistograms(cfg)
	if own < len(cfg.Routes) {
		p.m.initOtherRoutes()
		p.log.Info("latency histograms of the routes past metrics.route_histograms share one route label",
			"routes", len(cfg.Routes), "with_own_histograms", own, "sharing", len(cfg.Routes)-own, "route_label", config.OtherRoutes)
	}
	for i, rc := range cfg.Routes {
		rc.ReplayHeaders = replayable(rc.ReplayHeaders, rc.Scope.Header)
		rt := &route{cfg: rc, spec: rc.Key.Spec(), ignore: keyextract.CompileIgnore(rc.Fingerprint.Ignore),
			p: p, series: p.m.routeSeries(rc.Name, i < own), httpRoute: patternPath(rc.Match)}
		rt.rp = p.reverseProxy(up, rt)
		if err := register(t.mux, rc.Match, rt); err != nil {
			return fmt.Errorf("proxy: route %s: %w", rc.Name, err)
		}
		t.routes[rc.Name] = rt
		t.byKeyspace[rc.Keyspace] = append(t.byKeyspace[rc.Keyspace], rt)
		p.m.initRoute(rt.series, i < own)
		p.m.rec.initRoute(rc)
		t.reconciles = t.reconciles || rc.Reconcile != nil
	}
	t.readTimeout = cfg.Server.ReadTimeout.D()
	t.bodyTimeout = cfg.Server.BodyTimeout.D()
	if t.readTimeout > 0 && (t.bodyTimeout <= 0 || t.bodyTimeout > t.readTimeout) {
		t.bodyTimeout = t.readTimeout
	}
	for _, rc := range cfg.Routes {
		t.bodyReserve = max(t.bodyReserve, rc.MaxBodyBytes)
	}
	if l := cfg.Server.MaxBufferedBytes; l > 0 {
		t.bodyReserve = min(t.bodyReserve, l/8)
	}
	p.budget.SetLimits(cfg.Server.MaxBufferedBytes, cfg.Server.MaxBufferedBytesPerClient)
	p.table.Store(t)
	return nil
}

// ownHistograms is how many of cfg's routes, the first ones, have latency
// histograms of their own (metrics.route_histograms; -1 is none).
func ownHistograms(cfg *config.Config) int {
	n := cfg.Metrics.RouteHistograms
	if n == 0 {
		n = config.DefaultRouteHistograms // a configuration built without config.Load
	}
	return max(0, min(n, len(cfg.Routes)))
}

// replayable returns the headers of allow that may be stored and replayed:
// config.Validate refuses the others, and a configuration that bypassed it
// still never stores a credential.
func replayable(allow []string, scopeHeader string) []string {
	out := make([]string, 0, len(allow))
	for _, h := range allow {
		if config.ReplayRefusal(h, scopeHeader) == "" {
			out = append(out, h)
		}
	}
	return out
}

func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("%v", e)
		}
	}()
	mux.Handle(config.CanonicalPattern(pattern), h)
	return nil
}

// ServeHTTP routes r: a request that matches a route is protected, any
// other is proxied untouched, without touching the store.
//
// A path that is not in canonical form ("/charges/", "//charges",
// "/a/../charges", "/v1%2Fcharges") is matched in its cleaned form, first
// with its escapes kept ("/orders/A%2FB/charges/" is order A/B's), then
// decoded (with and without a trailing slash each), since many upstreams
// treat them as one endpoint: the request is protected by that route and
// forwarded as sent. Paths are matched case-sensitively.
//
// Host names are matched as DNS names are: case-insensitively, with a final
// dot ignored and on any port ("API.Example.COM.:8080" is api.example.com).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := p.table.Load()
	orig := r
	if h := canonicalHost(r.Host); h != r.Host {
		r = r.Clone(context.WithValue(r.Context(), sentHostKey{}, r.Host))
		r.Host = h
	}
	if t.matches(r) {
		t.mux.ServeHTTP(w, r) // sets the path wildcards, then serveRoute
		return
	}
	// The cleaned path with its escapes kept ("/orders/A%2FB/charges/" is
	// order A/B's charges to upstreams that route on the escaped path and
	// ignore a trailing slash), then the cleaned, decoded path
	// ("/v1%2Fcharges" is /v1/charges to many upstreams), each also with a
	// trailing slash for patterns that end in one.
	type candidate struct{ path, raw string }
	var cands []candidate
	if r.URL.RawPath != "" {
		esc := cleanPath(r.URL.EscapedPath())
		if dec, err := url.PathUnescape(esc); err == nil && esc != r.URL.EscapedPath() {
			cands = append(cands, candidate{dec, esc}, candidate{dec + "/", esc + "/"})
		}
	}
	clean := cleanPath(r.URL.Path)
	cands = append(cands, candidate{clean, ""}, candidate{clean + "/", ""})
	for _, c := range cands {
		if c.path == "//" || (c.path == r.URL.Path && r.URL.RawPath == "") {
			continue // the root twice, or the match already tried
		}
		u := *r.URL
		u.Path, u.RawPath = c.path, c.raw
		rc := r.WithContext(context.WithValue(r.Context(), sentURLKey{}, r.URL))
		rc.URL = &u
		if t.matches(rc) {
			t.mux.ServeHTTP(w, rc)
			return
		}
	}
	p.servePassthrough(w, orig, t)
}

// canonicalHost returns a Host header as a host pattern is written: lower
// case, without a port and without the final dot of a fully qualified name.
func canonicalHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i] // a port ("[::1]:80" keeps "[::1]")
	}
	h = strings.TrimRight(h, ".") // "api.example.com.." is no other name either
	return strings.ToLower(h)
}

// sentURLKey carries the URL a request was sent with when it was matched
// in cleaned form.
type sentURLKey struct{}

// sentHostKey carries the Host header a request was sent with when it was
// matched in canonical form (lower case, no port, no final dot).
type sentHostKey struct{}

// matches reports whether r matches a route as it is.
func (t *table) matches(r *http.Request) bool {
	h, _ := t.mux.Handler(r)
	_, ok := h.(*route)
	return ok
}

// patternPath returns the path of a ServeMux pattern: "/charges" for
// "POST api.example.com/charges".
func patternPath(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i+1:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return pattern
}

// cleanPath is path.Clean without a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean(p)
	if c == "." {
		return "/"
	}
	return c
}

// Store returns the proxy's store with its metrics: other users of the
// store (the admin API, readiness) go through it so that their operations
// are measured and their failures counted too.
func (p *Proxy) Store() store.Store { return p.store }

// BuffersSaturated reports why the buffer budget (server.max_buffered_bytes)
// cannot take a request body of the largest route's max_body_bytes now (at
// most an eighth of the budget), for /readyz; nil when it can.
func (p *Proxy) BuffersSaturated() error {
	t := p.table.Load()
	if t == nil || !p.budget.Saturated(t.bodyReserve) {
		return nil
	}
	return fmt.Errorf("buffers saturated: %d of server.max_buffered_bytes (%d) in use", p.budget.Used(), p.budget.Limit())
}

// HasRoute reports whether the current configuration has a route named name.
func (p *Proxy) HasRoute(name string) bool {
	_, ok := p.table.Load().routes[name]
	return ok
}

// Abort cancels every upstream request still waiting for its answer, and
// stops the settling retries; their keys become in doubt. Call it when the
// shutdown deadline has passed.
func (p *Proxy) Abort() {
	p.abort()
	p.settling.Abort()
}

// Wait blocks until every protected request has settled its key in the
// store, retries included, so the store can be closed. Protected requests
// that arrive after Wait has begun are answered 503 without touching the
// store, and settling writes that fail from then on are not retried.
func (p *Proxy) Wait() {
	// Refused first: the settling retries can keep Wait until Abort, and
	// a request forwarded meanwhile could not have its own retried.
	p.active.close()
	p.settling.Close(context.Background()) // until Abort
	p.active.wait()
}
