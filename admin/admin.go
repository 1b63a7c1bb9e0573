// Package admin serves idemproxy's admin listener: Prometheus metrics,
// liveness and readiness, configuration reload, and the key API that lets
// an operator list, inspect and release idempotency keys, and the console:
// the same in a browser, under /ui/ (console.go).
//
// Every error it answers, a failed reload included, is an RFC 9457
// application/problem+json body typed like the proxy's (see Problems),
// but the console's, which are HTML pages for a person.
// /livez and /readyz answer plain text, a 503 from /readyz included: that
// is the probe's answer, not an error.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
)

// Store is what the admin API needs of the key store.
type Store interface {
	Get(ctx context.Context, key string) (*store.Record, error)
	// Release deletes the record under key if it still carries token;
	// otherwise it returns store.ErrNotOwner.
	Release(ctx context.Context, key, token string) error
	Ping(ctx context.Context) error
}

// Reconciler runs the reconcile lookup of an in-doubt key now.
type Reconciler interface {
	Reconcile(ctx context.Context, storeKey string) (reconcile.Outcome, error)
}

// Routes tells the admin API which routes exist and which header scopes
// them ("" for an unscoped route).
type Routes interface {
	RouteScope(name string) (header string, ok bool)
}

// RouteKeyspaces is implemented by the Routes whose routes may store their
// keys under a keyspace other than their name (routes[].keyspace): the
// key API addresses a key by its route, and finds it in the route's
// keyspace. Without it, a route's keyspace is its name.
type RouteKeyspaces interface {
	RouteKeyspace(name string) string
}

// keyspace returns the keyspace of route, as the running configuration
// says (RouteKeyspaces).
func (h *Handler) keyspace(route string) string {
	if ks, ok := h.opts.Routes.(RouteKeyspaces); ok {
		if k := ks.RouteKeyspace(route); k != "" {
			return k
		}
	}
	return route
}

// Options configures NewHandler.
type Options struct {
	// Store is the key store. Required.
	Store Store
	// Lister lists keys for GET /v1/keys/{route}; nil: Store, if it is a
	// store.Lister, else that endpoint answers 404 listing-unavailable.
	Lister store.Lister
	// Routes resolves route names. Required.
	Routes Routes
	// Gatherer is exposed on /metrics; nil means prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Token is the bearer token of /v1/keys and POST /-/reload. Empty
	// disables both over HTTP (403): they are never open.
	Token string
	// TokenEnv names the variable the token comes from (the program passes
	// admin.token_env, which package config defaults), for the answer that
	// tells how to enable the key API; empty: the answer names none.
	TokenEnv string
	// Reload re-reads the configuration; nil disables POST /-/reload.
	Reload func() error
	// StoreOptional reports whether every route forwards when the store
	// fails (on_store_error: forward); then /readyz stays ready through a
	// store outage, so that fail-open routes keep their traffic. Nil means
	// the store is required.
	StoreOptional func() bool
	// Reconciler serves POST /v1/keys/{route}/{key}/reconcile; nil
	// answers 404 there.
	Reconciler Reconciler
	// Logger receives the audit log of releases; nil discards it.
	Logger *slog.Logger
	// Pprof serves Go's runtime profiles under /debug/pprof/, behind the
	// token like the key API; false leaves them out (404).
	Pprof bool
	// ReadyChecks are further conditions of /readyz, asked before the
	// store is: the first that returns an error makes it 503 with the
	// error as the reason, whether or not the store is optional. Nil or
	// empty adds none.
	ReadyChecks []func() error
	// StoreProbe is a background write probe of the store
	// (store.WriteProbe). Once its first probe has ended, /readyz reads
	// its verdict instead of pinging the store: it never waits on a
	// stalled store, and a store that answers pings but refuses or
	// stalls writes is not ready. Nil, and before the first probe has
	// ended: /readyz pings the store, waiting at most 2 seconds.
	StoreProbe Prober
	// Registerer receives the admin API's own metrics (failed
	// authentications); nil registers none.
	Registerer prometheus.Registerer
	// AcceptLoss serves POST /v1/store/accept-loss, behind the token: it
	// accepts that the store lost its keys by writing a new epoch marker
	// (every replica adopts it and serves again), and returns the marker
	// it replaced (nil: none) and the new one. Nil: that endpoint is 404.
	AcceptLoss func(ctx context.Context, operator, reason string) (old, accepted *store.Epoch, err error)
	// DropKeyspace serves POST /v1/keyspaces/{keyspace}/drop, behind the
	// token: it removes the keyspace from the store's registry (its keys
	// are left to expire, unclaimed), so that a configuration that leaves
	// it, or makes its keys otherwise, is accepted; it returns the entry
	// it removed, or ErrNoKeyspace when the registry has none of that
	// name. Nil: that endpoint is 404.
	DropKeyspace func(ctx context.Context, keyspace string) (store.Keyspace, error)

	// MarkReleased, when set, writes a release mark of a store key in the
	// store before an operator's release (API, CLI or console) deletes
	// it: a replica whose witness remembers answering the key
	// (internal/witness) reads it and knows that the key was released on
	// purpose, not lost. A mark that cannot be written fails the release.
	// Nil: no mark.
	MarkReleased func(ctx context.Context, storeKey string) error
	// Tracing, while on, traces the operators' actions (the key API,
	// accept-loss, reload); nil is never on.
	Tracing *tracing.Tracing
}

// Prober is the verdict of a background probe.
type Prober interface {
	// Ready reports whether a probe has ended.
	Ready() bool
	// Err returns the last verdict: nil for ready.
	Err() error
}

// Handler is the admin listener's http.Handler.
type Handler struct {
	mux      *http.ServeMux
	opts     Options
	token    [sha256.Size]byte
	stopping atomic.Bool

	limiter      *authLimiter
	authFailures prometheus.Counter
	throttled    prometheus.Counter
}

// NewHandler returns the admin handler.
func NewHandler(opts Options) *Handler {
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.DefaultGatherer
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{mux: http.NewServeMux(), opts: opts, token: sha256.Sum256([]byte(opts.Token)), limiter: newAuthLimiter(),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_admin_auth_failures_total",
			Help: "Admin API requests refused 401 for a missing or wrong bearer token.",
		}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_admin_auth_throttled_total",
			Help: "Admin API requests refused 429 because their client address failed to authenticate too often.",
		}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(h.authFailures, h.throttled)
	}
	h.mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	h.mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) { writeText(w, http.StatusOK, "ok") })
	h.mux.HandleFunc("GET /readyz", h.readyz)
	h.mux.Handle("POST /-/reload", h.auth(h.reload)) // a reload is an operator's act too
	h.mux.Handle("GET /v1/keys/{route}", h.auth(h.listKeys))
	h.mux.Handle("GET "+keyPattern, h.auth(h.getKey))
	h.mux.Handle("DELETE "+keyPattern, h.auth(h.deleteKey))
	h.mux.Handle("POST "+keyPattern, postKey(h.auth(h.reconcileKey)))
	// The console: pages for operators, behind a login with the token.
	h.mux.Handle("/ui/", newConsole(h))
	if opts.AcceptLoss != nil {
		h.mux.Handle("POST /v1/store/accept-loss", h.auth(h.acceptLoss))
	}
	if opts.DropKeyspace != nil {
		h.mux.Handle("POST /v1/keyspaces/{keyspace}/drop", h.auth(h.dropKeyspace))
	}
	if opts.Pprof {
		// A profile shows the process's internals and costs CPU while it
		// runs: an operator's tool, behind the token.
		h.mux.Handle("GET /debug/pprof/", h.auth(pprof.Index))
		h.mux.Handle("GET /debug/pprof/cmdline", h.auth(pprof.Cmdline))
		h.mux.Handle("GET /debug/pprof/profile", h.auth(pprof.Profile))
		h.mux.Handle("GET /debug/pprof/symbol", h.auth(pprof.Symbol))
		h.mux.Handle("GET /debug/pprof/trace", h.auth(pprof.Trace))
	}
	return h
}

// ServeHTTP serves the admin API. A request that matches no endpoint, or
// none with its method, is answered with a problem, not ServeMux's text.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isConsolePath(r.URL.Path) {
		setConsoleHeaders(w.Header()) // on the router's redirects too
	}
	if handler, pattern := h.mux.Handler(r); pattern == "" {
		// ServeMux's own answer: 404, 405 with the Allow header, or a
		// redirect to the cleaned path.
		rec := &statusRecorder{header: http.Header{}}
		handler.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			problem.Write(w, r, probNotFound, "", 0, nil)
			return
		case http.StatusMethodNotAllowed:
			allow := rec.header.Get("Allow")
			if allow == keyMethods+", POST" && !strings.HasSuffix(r.URL.EscapedPath(), reconcileSuffix) {
				allow = keyMethods // a key's path takes POST only as its reconcile (postKey)
			}
			w.Header().Set("Allow", allow)
			problem.Write(w, r, probMethod, r.Method+" is not allowed here; allowed: "+allow, 0, nil)
			return
		}
	} else if h.serveTraced(w, r, pattern) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// statusRecorder keeps the status and header of an answer, and drops its
// body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(status int)      { s.status = status }

// SetStopping turns /readyz to 503 for good: the process is shutting down.
func (h *Handler) SetStopping() { h.stopping.Store(true) }

func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	if h.stopping.Load() {
		writeText(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	for _, check := range h.opts.ReadyChecks {
		if err := check(); err != nil {
			writeText(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	var err error
	if p := h.opts.StoreProbe; p != nil && p.Ready() {
		err = p.Err()
	} else {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err = h.opts.Store.Ping(ctx)
	}
	if err != nil {
		if h.opts.StoreOptional != nil && h.opts.StoreOptional() {
			writeText(w, http.StatusOK, "ready (store unavailable, every route fails open): "+err.Error())
			return
		}
		writeText(w, http.StatusServiceUnavailable, "store unavailable: "+err.Error())
		return
	}
	writeText(w, http.StatusOK, "ready")
}

func (h *Handler) reload(w http.ResponseWriter, r *http.Request) {
	if h.opts.Reload == nil {
		problem.Write(w, r, probNoReload, "this admin listener does not reload the configuration", 0, nil)
		return
	}
	if err := h.opts.Reload(); err != nil {
		problem.Write(w, r, probReloadFailed, err.Error(), 0, nil)
		return
	}
	writeText(w, http.StatusOK, "reloaded")
}

// auth guards the key API and reload: 403 when no token is configured, 401 for a
// missing or wrong token (compared in constant time: both are hashed and
// the hashes compared with subtle.ConstantTimeCompare), 429 with
// Retry-After for a client address that failed too often (authLimiter),
// whatever its token. The scheme name is case-insensitive (RFC 9110,
// section 11.1).
func (h *Handler) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := admission.ClientOf(r.RemoteAddr)
		if h.opts.Token != "" {
			if wait := h.authWait(client); wait > 0 {
				secs := retrySeconds(wait)
				problem.Write(w, r, probAuthThrottled, "too many failed authentications from this address: retry in "+
					strconv.Itoa(secs)+" s; until then every request that needs the token is refused, a correct one included", secs, nil)
				return
			}
		}
		if h.opts.Token == "" {
			problem.Write(w, r, probDisabled, h.disabledDetail(), 0, nil)
			return
		}
		const prefix = "Bearer "
		got := r.Header.Get("Authorization")
		wellFormed := len(got) >= len(prefix) && strings.EqualFold(got[:len(prefix)], prefix)
		if !h.checkToken(r, client, got[min(len(got), len(prefix)):], wellFormed, got != "") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemproxy admin"`)
			problem.Write(w, r, probUnauthorized, "a valid bearer token is required", 0, nil)
			return
		}
		next(w, r)
	})
}

// disabledDetail is the detail of the answer of an endpoint that needs the
// token when none is configured.
func (h *Handler) disabledDetail() string {
	if h.opts.TokenEnv != "" {
		return "the key API is disabled: set the environment variable " + h.opts.TokenEnv + " to enable it"
	}
	return "the key API is disabled: no admin token is configured"
}

// authWait returns how long client is refused from now on because it
// failed to authenticate too often (authLimiter), counting the refusal in
// idemproxy_admin_auth_throttled_total; 0: it may try. The key API and
// the console's login both ask it first.
func (h *Handler) authWait(client string) time.Duration {
	wait := h.limiter.wait(client, time.Now())
	if wait > 0 {
		h.throttled.Inc()
	}
	return wait
}

// retrySeconds is wait in whole seconds, rounded up, for Retry-After.
func retrySeconds(wait time.Duration) int { return int((wait + time.Second - 1) / time.Second) }

// checkToken reports whether secret is the admin token, comparing them in
// constant time (both are hashed and the hashes compared with
// subtle.ConstantTimeCompare); wellFormed false fails whatever secret is.
// A failure is counted (idemproxy_admin_auth_failures_total), logged
// with the endpoint's pattern (never the path, which can hold a key, nor
// the secret; sent says whether one came) and counted against client by
// the limiter; a success forgets client's failures. The key API's bearer
// token and the console's login form both go through it.
func (h *Handler) checkToken(r *http.Request, client, secret string, wellFormed, sent bool) bool {
	sum := sha256.Sum256([]byte(secret))
	if !wellFormed || subtle.ConstantTimeCompare(sum[:], h.token[:]) != 1 {
		h.authFailures.Inc()
		penalty := h.limiter.fail(client, time.Now())
		h.opts.Logger.Warn("admin authentication failed", "remote_addr", r.RemoteAddr, "endpoint", r.Pattern,
			"token_sent", sent, "throttled", penalty)
		return false
	}
	h.limiter.succeed(client)
	return true
}

// storeKey resolves the route, scope and key of a key API request.
func (h *Handler) storeKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	route, key := r.PathValue("route"), r.PathValue("key")
	header, ok := h.opts.Routes.RouteScope(route)
	if !ok {
		problem.Write(w, r, probUnknownRoute, "no route named "+strconv.Quote(route), 0, nil)
		return "", false
	}
	scope := r.URL.Query().Get("scope")
	if header != "" && scope == "" {
		problem.Write(w, r, probScopeRequired, "route "+route+" is scoped by the "+header+" header: pass its value as ?scope=", 0, nil)
		return "", false
	}
	if header == "" && scope != "" {
		problem.Write(w, r, probScopeNotAllowed, "route "+route+" is not scoped: drop ?scope=", 0, nil)
		return "", false
	}
	return store.Key(h.keyspace(route), scope, key), true
}

// keyView is a record as the key API shows it: never the stored body.
type keyView struct {
	Route          string      `json:"route"`
	Key            string      `json:"key"`
	State          store.State `json:"state"`
	CreatedAt      time.Time   `json:"created_at"`
	ExpiresAt      *time.Time  `json:"expires_at,omitempty"`
	LeaseExpiresAt *time.Time  `json:"lease_expires_at,omitempty"`
	Fingerprint    string      `json:"fingerprint,omitempty"`
	StoredStatus   int         `json:"stored_status,omitempty"`
	StoredBytes    *int        `json:"stored_body_bytes,omitempty"`
	// Reconciled: the stored answer came from a reconcile lookup.
	Reconciled bool `json:"reconciled,omitempty"`
	// Origin is the trace span that forwarded the key's request
	// ("<trace ID>-<span ID>"), when it was traced.
	Origin string `json:"origin,omitempty"`
}

// record reads the record of a key API request; it answers the request
// itself (404, 503, a bad route or scope) when there is none to work on.
func (h *Handler) record(w http.ResponseWriter, r *http.Request) (string, *store.Record, bool) {
	sk, ok := h.storeKey(w, r)
	if !ok {
		return "", nil, false
	}
	rec, err := h.opts.Store.Get(r.Context(), sk)
	if err != nil {
		problem.Write(w, r, problemFor(err), err.Error(), 0, nil)
		return "", nil, false
	}
	if rec == nil {
		problem.Write(w, r, probNoRecord, noRecord, 0, nil)
		return "", nil, false
	}
	return sk, rec, true
}

func (h *Handler) getKey(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := h.record(w, r)
	if !ok {
		return
	}
	// The version an act's If-Match names, so that it acts on the record
	// read here or not at all (412 key-changed-since-read).
	w.Header().Set("ETag", `"`+Version(rec)+`"`)
	v := keyView{
		Route: r.PathValue("route"), Key: r.PathValue("key"), State: rec.State,
		CreatedAt: rec.CreatedAt.UTC(), Fingerprint: rec.Fingerprint, Origin: rec.Origin,
	}
	if !rec.ExpiresAt.IsZero() {
		t := rec.ExpiresAt.UTC()
		v.ExpiresAt = &t
	}
	if !rec.LeaseExpiresAt.IsZero() {
		t := rec.LeaseExpiresAt.UTC()
		v.LeaseExpiresAt = &t
	}
	if resp := rec.Response; resp != nil {
		v.StoredStatus = resp.Status
		v.Reconciled = resp.Reconciled
		if resp.BodyStored {
			n := len(resp.Body)
			v.StoredBytes = &n
		}
	}
	writeJSON(w, r, http.StatusOK, v)
}

func (h *Handler) deleteKey(w http.ResponseWriter, r *http.Request) {
	// No record is a 404: deleting anyway could remove a reservation made
	// since, whose request is at the upstream now.
	sk, ok := h.storeKey(w, r)
	if !ok {
		return
	}
	act := apiAction(r)
	act.Force = r.URL.Query().Get("force") == "true"
	prev, err := h.releaseKey(r.Context(), r.PathValue("route"), sk, act)
	if err != nil {
		h.actFailed(w, r, sk, err, false)
		return
	}
	writeJSON(w, r, http.StatusOK, map[string]any{"released": true, "previous_state": prev.State})
}

// forceQuery is the query that releases a key in flight anyway. The
// key-in-flight problem names it in its detail, for a client of the API,
// and as its "override" member, which a client with another way to say it
// (idemproxy keys' -force) translates.
const forceQuery = "?force=true"

// operatorAttr is the operator of an audit log line: the request's
// X-Operator, or no attribute at all when the request named none (an empty
// "operator" would read as a name that was lost).
func operatorAttr(operator string) slog.Attr {
	if operator == "" {
		return slog.Attr{} // an empty Attr: the handler writes nothing
	}
	return slog.String("operator", operator)
}

// The key API's paths. A key may hold '/': GET and DELETE take the rest of
// the path as the key. ServeMux ends a pattern at such a wildcard, so
// reconcile, whose path goes on after the key, is served under POST of
// keyPattern too (postKey), and a key with '/' is reconciled whether or not
// its slashes are escaped, as it is read and released.
const (
	keyPattern      = "/v1/keys/{route}/{key...}"
	reconcileSuffix = "/reconcile"
	// reconcileRoute is the reconcile endpoint's path as its spans name it.
	reconcileRoute = "/v1/keys/{route}/{key}" + reconcileSuffix
	// keyMethods are the methods of a key's own path, as ServeMux lists
	// them in the Allow header of a 405.
	keyMethods = "DELETE, GET, HEAD"
)

// postKey serves a POST under keyPattern: the key's reconcile when the
// path's last segment, as sent, is "reconcile" after a key; else 405, as
// ServeMux answers a method a path does not take.
func postKey(reconcile http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutSuffix(r.PathValue("key"), reconcileSuffix)
		if !ok || key == "" || !strings.HasSuffix(r.URL.EscapedPath(), reconcileSuffix) {
			w.Header().Set("Allow", keyMethods)
			problem.Write(w, r, probMethod, r.Method+" is not allowed here; allowed: "+keyMethods, 0, nil)
			return
		}
		r.SetPathValue("key", key)
		reconcile.ServeHTTP(w, r)
	}
}

// reconcileKey runs the reconcile lookup of an in-doubt key now and
// answers its result: 200 with the result (applied, not_applied or error),
// 404 for no record, 409 when the key is not in doubt or another lookup of
// it is running, 400 for a route without reconcile.
func (h *Handler) reconcileKey(w http.ResponseWriter, r *http.Request) {
	sk, ok := h.storeKey(w, r)
	if !ok {
		return
	}
	out, err := h.reconcileKeyAct(r.Context(), r.PathValue("route"), sk, apiAction(r))
	if err != nil {
		h.actFailed(w, r, sk, err, true)
		return
	}
	writeJSON(w, r, http.StatusOK, out)
}

// apiAction is the act a key API request asks for: its operator
// (X-Operator), reason (?reason=) and the version it was read at
// (If-Match, as GET's ETag gave it).
func apiAction(r *http.Request) action {
	act := action{Operator: r.Header.Get("X-Operator"), Reason: r.URL.Query().Get("reason"),
		Version: strings.Trim(r.Header.Get("If-Match"), `"`), RemoteAddr: r.RemoteAddr, UserAgent: r.UserAgent(), Via: "api"}
	if _, sent := r.Header["If-Match"]; sent && act.Version == "" {
		// An If-Match that names no version ("", a script's ETag left
		// empty) matches no record, rather than asking for no check.
		act.Version = `""`
	}
	return act
}

// actFailed answers an act on the key storeKey that was refused or failed;
// with withState, the problem says the key's state (a reconcile's, so that
// the operator sees why a key that is not in doubt was not looked up).
func (h *Handler) actFailed(w http.ResponseWriter, r *http.Request, storeKey string, err error, withState bool) {
	detail, ext := err.Error(), map[string]any(nil)
	switch {
	case errors.Is(err, errKeyInFlight):
		detail = "the key is in flight: its request is being forwarded now; wait for it to settle, or add " + forceQuery
		ext = map[string]any{"override": forceQuery}
	case errors.Is(err, store.ErrNotOwner):
		detail = "the key changed while it was being released (settled, expired or reserved again); look at it again"
	case errors.Is(err, errChanged):
		detail = "the key changed since it was read (If-Match): read it again"
	case errors.Is(err, reconcile.ErrNoLookup):
		detail = "route " + r.PathValue("route") + " has no reconcile lookup"
	}
	if withState && !errors.Is(err, errNoRecord) && !errors.Is(err, errNoReconciler) && !errors.Is(err, errBadText) {
		if rec, gerr := h.opts.Store.Get(r.Context(), storeKey); gerr == nil && rec != nil {
			ext = map[string]any{"state": string(rec.State)}
		}
	}
	problem.Write(w, r, problemFor(err), detail, 0, ext)
}

// acceptLoss accepts that the store lost its keys, audited like a
// release: the operator (X-Operator) and the reason (?reason=), held to a
// release's text rules, are logged with the epochs.
func (h *Handler) acceptLoss(w http.ResponseWriter, r *http.Request) {
	operator, reason := r.Header.Get("X-Operator"), r.URL.Query().Get("reason")
	if err := (action{Operator: operator, Reason: reason}).checkText(); err != nil {
		problem.Write(w, r, problemFor(err), err.Error(), 0, nil)
		return
	}
	old, acc, err := h.opts.AcceptLoss(r.Context(), operator, reason)
	if err != nil {
		problem.Write(w, r, problemFor(err), err.Error(), 0, nil)
		return
	}
	prevID, prevState := "none", "none"
	if old != nil {
		prevID, prevState = old.ID, string(old.State)
	}
	h.opts.Logger.Warn("store loss accepted by an operator: retries of keys answered before the loss will be forwarded again",
		"epoch", acc.ID,
		"gen", acc.Gen,
		"previous_epoch", prevID,
		"previous_state", prevState,
		adminAudit(r, operator, reason))
	writeJSON(w, r, http.StatusOK, map[string]any{"accepted": true, "epoch": acc.ID, "gen": acc.Gen,
		"previous_epoch": prevID, "previous_state": prevState})
}

// adminAudit is the end of the audit line of an act of the admin API on
// the whole store (accept-loss, drop-keyspace): who, why, from where and
// when.
func adminAudit(r *http.Request, operator, reason string) slog.Attr {
	return slog.Group("", operatorAttr(operator), "reason", reason, "via", "admin",
		"remote_addr", r.RemoteAddr, "user_agent", r.UserAgent(), "at", time.Now().UTC().Format(time.RFC3339Nano))
}

// ErrNoKeyspace is Options.DropKeyspace's error for a keyspace the
// store's registry does not hold.
var ErrNoKeyspace = errors.New("the store's registry has no keyspace of this name")

// dropKeyspace lets a keyspace's keys go on purpose, audited like a
// release: the operator (X-Operator) and the reason (?reason=), held to a
// release's text rules, are logged with the keyspace's entry.
func (h *Handler) dropKeyspace(w http.ResponseWriter, r *http.Request) {
	operator, reason := r.Header.Get("X-Operator"), r.URL.Query().Get("reason")
	if err := (action{Operator: operator, Reason: reason}).checkText(); err != nil {
		problem.Write(w, r, problemFor(err), err.Error(), 0, nil)
		return
	}
	if reason == "" {
		problem.Write(w, r, probBadParameter, "reason: say why the keyspace's keys may go, for the audit log line", 0, nil)
		return
	}
	name := r.PathValue("keyspace")
	k, err := h.opts.DropKeyspace(r.Context(), name)
	if err != nil {
		problem.Write(w, r, problemFor(err), "keyspace "+strconv.Quote(name)+": "+err.Error(), 0, nil)
		return
	}
	h.opts.Logger.Warn("keyspace dropped by an operator: its keys are no longer claimed, so retries of the requests they answered will be forwarded again",
		"keyspace", k.Name,
		"recipe", k.Recipe,
		"routes", k.Routes,
		adminAudit(r, operator, reason))
	writeJSON(w, r, http.StatusOK, map[string]any{"dropped": true, "keyspace": k.Name, "recipe": k.Recipe, "routes": k.Routes})
}

func hexPrefix(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// noRecord is the detail of a key API answer for a key without a record.
const noRecord = "no record for this key (never seen, released or expired)"

// writeJSON answers with v as indented JSON; a v that does not encode is a
// 500 internal-error problem instead.
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		problem.Write(w, r, probInternal, "encode answer: "+err.Error(), 0, nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write([]byte(msg + "\n"))
}
