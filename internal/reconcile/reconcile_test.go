package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// lookupGate is the real stub with control over its lookups (GET
// /orders/{orderId}/charge): it counts them, fails the first ones on
// demand, and can hold them until released.
type lookupGate struct {
	h       http.Handler
	lookups atomic.Int32
	fail    atomic.Int32  // lookups still to answer 503
	entered chan struct{} // if set, told of each lookup
	block   chan struct{} // if set, each lookup waits for it to close
}

func newGate() *lookupGate { return &lookupGate{h: stub.New(slog.New(slog.DiscardHandler))} }

func (g *lookupGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/charge") {
		g.lookups.Add(1)
		if g.entered != nil {
			g.entered <- struct{}{}
		}
		if g.block != nil {
			select {
			case <-g.block:
			case <-r.Context().Done():
				return
			}
		}
		if g.fail.Load() > 0 {
			g.fail.Add(-1)
			http.Error(w, "lookup unavailable", http.StatusServiceUnavailable)
			return
		}
	}
	g.h.ServeHTTP(w, r)
}

// reconcileRoute is a charges route that reconciles, with times small
// enough for tests: an upstream timeout of 300ms, a grace of 600ms.
const reconcileRoute = `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 300ms
    lease: 500ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 600ms, interval: 100ms}
`

// newReconcileEnv is proxytest.New with the gate in front of the stub, and the
// proxy's reconciler.
func newReconcileEnv(t *testing.T, g *lookupGate, routes string) (*proxytest.Env, *reconcile.Reconciler) {
	t.Helper()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(g)
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, routes)
	rec, err := reconcile.New(e.Proxy.ReconcileHost(), reconcile.Options{Store: e.Store})
	if err != nil {
		t.Fatal(err)
	}
	return e, rec
}

// serveReconcileRoute serves reconcileRoute on st, in front of upstream.
func serveReconcileRoute(t *testing.T, upstream string, st store.Store) (*proxy.Proxy, *httptest.Server) {
	t.Helper()
	p, err := proxy.New(proxytest.ParseConfig(t, upstream, reconcileRoute), proxy.Options{Store: st, Metrics: proxy.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	return p, httptest.NewServer(p)
}

// inDoubtCharged leaves order's key in doubt after the stub charged it: the
// answer comes after the upstream timeout.
func inDoubtCharged(e *proxytest.Env, order string) {
	e.T.Helper()
	e.Fault("delay", 1, "1s")
	proxytest.WantStatus(e.T, "charge answered too late", e.Charge(order, 5), http.StatusGatewayTimeout, "upstream-timeout")
	if st := e.State("charges", "", strings.Trim(order, `"`)); st != store.StateInDoubt {
		e.T.Fatalf("state after the timeout = %q, want in_doubt", st)
	}
}

func reconciliations(e *proxytest.Env, route, result string) int {
	e.T.Helper()
	return int(proxytest.CounterValue(e.T, e.Registry, "idemproxy_reconciliations_total", map[string]string{"route": route, "result": result}))
}

// reconcileUntil runs passes of rec until cond holds.
func reconcileUntil(t *testing.T, rec *reconcile.Reconciler, what string, cond func() bool) {
	t.Helper()
	proxytest.Eventually(t, what, func() bool {
		rec.RunOnce(context.Background())
		return cond()
	})
}

// TestReconcileAppliedBecomesReplayOfTheLookup: a key the lookup found
// applied replays the lookup's answer with the route's status for an
// applied charge (reconcile.applied_status, 201 by default: what the
// client of the POST expects, not the GET's 200); while in doubt, the 409
// says when the lookup is scheduled.
func TestReconcileAppliedBecomesReplayOfTheLookup(t *testing.T) {
	t.Parallel()
	g := newGate()
	e, rec := newReconcileEnv(t, g, reconcileRoute)
	inDoubtCharged(e, `"R-1"`)
	doubt := e.Charge(`"R-1"`, 5)
	proxytest.WantStatus(t, "retry while in doubt", doubt, http.StatusConflict, "outcome-in-doubt")
	if d, _ := doubt.Field("detail").(string); !strings.Contains(d, "this route reconciles it: the upstream is asked about the key") ||
		strings.Contains(d, "wait for it to expire") {
		t.Errorf("in-doubt detail = %q, want when the lookup is scheduled, not to wait for the expiry", d)
	}
	if after, _ := doubt.Field("reconcile_after").(string); after == "" {
		t.Errorf("in-doubt problem has no reconcile_after: %s", doubt.Body)
	}
	if doubt.Header.Get("Retry-After") == "" {
		t.Errorf("in-doubt 409 on a route that reconciles has no Retry-After: %v", doubt.Header)
	}

	reconcileUntil(t, rec, "the key is completed", func() bool { return e.State("charges", "", "R-1") == store.StateCompleted })
	a := e.Charge(`"R-1"`, 5)
	proxytest.WantStatus(t, "retry after reconciliation", a, http.StatusCreated, "")
	if !a.Replayed() || a.Header.Get("Idempotent-Reconciled") != "true" {
		t.Errorf("retry headers = %v, want Idempotent-Replayed and Idempotent-Reconciled true", a.Header)
	}
	if a.Field("orderId") != "R-1" || a.Field("chargeId") == nil {
		t.Errorf("retry body = %s, want the lookup's charge of R-1", a.Body)
	}
	if got := e.Charges(`R-1`); got != 1 {
		t.Errorf("charges of R-1 = %d, want 1", got)
	}
	if got := reconciliations(e, "charges", reconcile.ResultApplied); got != 1 {
		t.Errorf("reconciliations applied = %d, want 1", got)
	}
	if got := g.lookups.Load(); got != 1 {
		t.Errorf("lookups = %d, want 1", got)
	}
}

// TestReconcileAppliedStatusIsTheRoutes: reconcile.applied_status sets
// the status a reconciled key replays.
func TestReconcileAppliedStatusIsTheRoutes(t *testing.T) {
	t.Parallel()
	g := newGate()
	e, rec := newReconcileEnv(t, g, strings.Replace(reconcileRoute, "interval: 100ms}", "interval: 100ms, applied_status: 200}", 1))
	inDoubtCharged(e, `"R-9"`)
	reconcileUntil(t, rec, "the key is completed", func() bool { return e.State("charges", "", "R-9") == store.StateCompleted })
	a := e.Charge(`"R-9"`, 5)
	proxytest.WantStatus(t, "retry after reconciliation", a, http.StatusOK, "")
	if a.Header.Get("Idempotent-Reconciled") != "true" || a.Field("orderId") != "R-9" {
		t.Errorf("retry = %v %s, want the lookup's answer, reconciled", a.Header, a.Body)
	}
}

func TestReconcileNotAppliedReleasesAndTheRetryIsChargedOnce(t *testing.T) {
	t.Parallel()
	g := newGate()
	e, rec := newReconcileEnv(t, g, reconcileRoute)
	// A crash: a reservation whose request never reached the upstream, its
	// lease lapsed with nobody left to settle it.
	sk := store.Key("charges", "", "R-2")
	if r, err := e.Store.Reserve(context.Background(), sk, store.Reservation{Token: "crashed", Lease: 50 * time.Millisecond, TTL: time.Hour}); err != nil || r != nil {
		t.Fatalf("Reserve = %v, %v", r, err)
	}
	proxytest.Eventually(t, "the lease lapses", func() bool { return e.State("charges", "", "R-2") == store.StateInDoubt })
	proxytest.WantStatus(t, "retry while in doubt", e.Charge(`"R-2"`, 5), http.StatusConflict, "outcome-in-doubt")

	reconcileUntil(t, rec, "the key is released", func() bool { return e.State("charges", "", "R-2") == "" })
	proxytest.WantStatus(t, "retry after the release", e.Charge(`"R-2"`, 5), http.StatusCreated, "")
	if a := e.Charge(`"R-2"`, 5); !a.Replayed() || a.Header.Get("Idempotent-Reconciled") != "" {
		t.Errorf("second retry = %v %v, want a plain replay", a, a.Header)
	}
	if got := e.Charges("R-2"); got != 1 {
		t.Errorf("charges of R-2 = %d, want 1", got)
	}
	if got := reconciliations(e, "charges", reconcile.ResultNotApplied); got != 1 {
		t.Errorf("reconciliations not_applied = %d, want 1", got)
	}
	if got := proxytest.CounterValue(t, e.Registry, "idemproxy_reconcile_discovered_total", map[string]string{"route": "charges"}); got != 1 {
		t.Errorf("discovered = %v, want 1 (the crash's reservation)", got)
	}
}

// TestReconcileDiscoveryIsPerRoute: in-doubt keys of a route without
// reconcile, more than a batch of them, do not keep discovery from
// finding those of a route that reconciles.
func TestReconcileDiscoveryIsPerRoute(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(g)
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, reconcileRoute+"  - name: aaa\n    match: POST /aaa\n    key: {json: orderId}\n")
	rec, err := reconcile.New(e.Proxy.ReconcileHost(), reconcile.Options{Store: e.Store, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	lapse := func(route, key string) {
		t.Helper()
		res := store.Reservation{Token: "crashed", Lease: time.Millisecond, TTL: time.Hour}
		if r, err := e.Store.Reserve(context.Background(), store.Key(route, "", key), res); err != nil || r != nil {
			t.Fatalf("Reserve = %v, %v", r, err)
		}
	}
	for _, k := range []string{"A-1", "A-2", "A-3"} {
		lapse("aaa", k)
	}
	lapse("charges", "R-6")
	proxytest.Eventually(t, "the leases lapse", func() bool { return e.State("charges", "", "R-6") == store.StateInDoubt })
	reconcileUntil(t, rec, "R-6 is released", func() bool { return e.State("charges", "", "R-6") == "" })
	if st := e.State("aaa", "", "A-1"); st != store.StateInDoubt {
		t.Errorf("a key of the route without reconcile is %q, want still in_doubt", st)
	}
	// A scoped key under the route (from an earlier, scoped definition of
	// it) is never scheduled or looked up: the answer could be another
	// client's.
	scoped := store.Key("charges", "alice", "R-6")
	res := store.Reservation{Token: "crashed", Lease: time.Millisecond, TTL: time.Hour}
	if r, err := e.Store.Reserve(context.Background(), scoped, res); err != nil || r != nil {
		t.Fatalf("Reserve = %v, %v", r, err)
	}
	proxytest.Eventually(t, "the scoped key's lease lapses", func() bool { return e.State("charges", "alice", "R-6") == store.StateInDoubt })
	discovered := proxytest.CounterValue(t, e.Registry, "idemproxy_reconcile_discovered_total", map[string]string{"route": "charges"})
	rec.RunOnce(context.Background())
	if got := proxytest.CounterValue(t, e.Registry, "idemproxy_reconcile_discovered_total", map[string]string{"route": "charges"}); got != discovered {
		t.Errorf("discovered went from %v to %v: the scoped key was scheduled", discovered, got)
	}
	before := g.lookups.Load()
	if _, err := rec.Reconcile(context.Background(), scoped); !errors.Is(err, reconcile.ErrNoLookup) {
		t.Errorf("Reconcile of a scoped key = %v, want ErrNoLookup", err)
	}
	if n := g.lookups.Load() - before; n != 0 {
		t.Errorf("lookups of a scoped key = %d, want 0", n)
	}
}

func TestReconcileFailingLookupStaysInDoubtAndIsRetried(t *testing.T) {
	t.Parallel()
	g := newGate()
	g.fail.Store(2)
	e, rec := newReconcileEnv(t, g, reconcileRoute)
	inDoubtCharged(e, `"R-3"`)

	reconcileUntil(t, rec, "a first lookup fails", func() bool { return reconciliations(e, "charges", reconcile.ResultError) >= 1 })
	if st := e.State("charges", "", "R-3"); st != store.StateInDoubt {
		t.Errorf("state after a failed lookup = %q, want in_doubt", st)
	}
	proxytest.WantStatus(t, "retry after a failed lookup", e.Charge(`"R-3"`, 5), http.StatusConflict, "outcome-in-doubt")

	reconcileUntil(t, rec, "the key is completed", func() bool { return e.State("charges", "", "R-3") == store.StateCompleted })
	if got := reconciliations(e, "charges", reconcile.ResultError); got != 2 {
		t.Errorf("reconciliations error = %d, want 2", got)
	}
	if got := g.lookups.Load(); got != 3 {
		t.Errorf("lookups = %d, want 3 (two failed, one applied)", got)
	}
	if a := e.Charge(`"R-3"`, 5); !a.Replayed() || e.Charges("R-3") != 1 {
		t.Errorf("retry = %v, charges %d; want a replay and one charge", a, e.Charges("R-3"))
	}
}

// TestReconcileScheduleSurvivesRestart: the schedule is in the store, so a
// proxy opened again on the same Badger directory looks the key up when it
// is due without discovering it anew.
func TestReconcileScheduleSurvivesRestart(t *testing.T) {
	t.Parallel()
	g := newGate()
	up := httptest.NewServer(g)
	t.Cleanup(up.Close)
	dir := t.TempDir()
	open := func() (*badger.Store, *proxy.Proxy, *httptest.Server) {
		st, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
		if err != nil {
			t.Fatal(err)
		}
		p, hs := serveReconcileRoute(t, up.URL, st)
		return st, p, hs
	}
	st, _, srv := open()
	ev := &proxytest.Env{T: t, Stub: up, Server: srv, Store: st}
	inDoubtCharged(ev, `"R-4"`)
	srv.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, p, srv := open()
	defer func() { srv.Close(); st.Close() }()
	keys, err := st.Unscheduled(context.Background(), "charges/", 10)
	if err != nil || len(keys) != 0 {
		t.Fatalf("Unscheduled after the restart = %q, %v; want none: the schedule was lost", keys, err)
	}
	rec, err := reconcile.New(p.ReconcileHost(), reconcile.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ev = &proxytest.Env{T: t, Stub: up, Server: srv, Store: st}
	reconcileUntil(t, rec, "the key is completed after the restart", func() bool { return ev.State("charges", "", "R-4") == store.StateCompleted })
	if a := ev.Charge(`"R-4"`, 5); !a.Replayed() || ev.Charges("R-4") != 1 {
		t.Errorf("retry = %v, charges %d; want a replay and one charge", a, ev.Charges("R-4"))
	}
}

// TestReconcileTwoReplicasOneRedisSendOneLookup: the lookup lease lets one
// replica look a key up at a time, even when both are told to at once.
func TestReconcileTwoReplicasOneRedisSendOneLookup(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := newGate()
	up := httptest.NewServer(g)
	t.Cleanup(up.Close)
	routes := strings.NewReplacer("upstream_timeout: 300ms", "upstream_timeout: 1s", "lease: 500ms", "lease: 2s",
		"grace: 600ms", "grace: 3s").Replace(reconcileRoute)
	type replica struct {
		p   *proxy.Proxy
		rec *reconcile.Reconciler
		e   *proxytest.Env
	}
	var rs []replica
	for range 2 {
		st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "two:", DialTimeout: time.Second, OpTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		reg := prometheus.NewRegistry()
		p, err := proxy.New(proxytest.ParseConfig(t, up.URL, routes), proxy.Options{Store: st, Metrics: proxy.NewMetrics(reg)})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(p)
		t.Cleanup(hs.Close)
		rec, err := reconcile.New(p.ReconcileHost(), reconcile.Options{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, replica{p, rec, &proxytest.Env{T: t, Stub: up, Server: hs, Registry: reg}})
	}
	a, b := rs[0], rs[1]
	a.e.Fault("delay", 1, "3s")
	proxytest.WantStatus(t, "charge answered too late", a.e.Charge(`"R-5"`, 5), http.StatusGatewayTimeout, "upstream-timeout")

	g.entered, g.block = make(chan struct{}, 4), make(chan struct{})
	sk := store.Key("charges", "", "R-5")
	done := make(chan reconcile.Outcome, 1)
	go func() {
		out, err := a.rec.Reconcile(context.Background(), sk)
		if err != nil {
			t.Errorf("replica A: Reconcile: %v", err)
		}
		done <- out
	}()
	<-g.entered // A's lookup is at the upstream now
	if _, err := b.rec.Reconcile(context.Background(), sk); !errors.Is(err, store.ErrLookupBusy) {
		t.Errorf("replica B: Reconcile during A's lookup = %v, want ErrLookupBusy", err)
	}
	close(g.block)
	if out := <-done; out.Result != reconcile.ResultApplied {
		t.Errorf("replica A: result = %+v, want applied", out)
	}
	b.rec.RunOnce(context.Background())
	if got := g.lookups.Load(); got != 1 {
		t.Errorf("lookups = %d, want 1", got)
	}
	if ans := b.e.Charge(`"R-5"`, 5); !ans.Replayed() || ans.Header.Get("Idempotent-Reconciled") != "true" {
		t.Errorf("retry on replica B = %v %v, want the reconciled replay", ans, ans.Header)
	}
	if got := a.e.Charges("R-5"); got != 1 {
		t.Errorf("charges of R-5 = %d, want 1", got)
	}
}

type oneRoute struct{}

func (oneRoute) RouteScope(name string) (string, bool) { return "", name == "charges" }

func TestAdminReconcileNow(t *testing.T) {
	t.Parallel()
	g := newGate()
	e, rec := newReconcileEnv(t, g, reconcileRoute)
	h := admin.NewHandler(admin.Options{Store: e.Proxy.Store(), Routes: oneRoute{}, Token: "tok", Reconciler: rec})
	post := func(key string) (int, map[string]any) {
		req := httptest.NewRequest("POST", "/v1/keys/charges/"+key+"/reconcile", nil)
		req.Header.Set("Authorization", "Bearer tok")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var m map[string]any
		json.Unmarshal(w.Body.Bytes(), &m)
		return w.Code, m
	}
	tests := []struct {
		name   string
		setup  func()
		key    string
		status int
		result string
		typ    string // the problem's type, for an error
	}{
		{"no record", func() {}, "A-0", http.StatusNotFound, "", "no-record"},
		{"in doubt, charged: applied at once, before the grace", func() { inDoubtCharged(e, `"A-1"`) }, "A-1", http.StatusOK, reconcile.ResultApplied, ""},
		{"completed: not in doubt", func() {}, "A-1", http.StatusConflict, "", "key-not-in-doubt"},
	}
	for _, tt := range tests {
		tt.setup()
		code, body := post(tt.key)
		if code != tt.status || (tt.result != "" && body["result"] != tt.result) {
			t.Errorf("%s: POST = %d %v, want %d result %q", tt.name, code, body, tt.status, tt.result)
		}
		if tt.typ != "" && body["type"] != problem.TypePrefix+tt.typ {
			t.Errorf("%s: POST answered type %v, want %s", tt.name, body["type"], problem.TypePrefix+tt.typ)
		}
	}
	req := httptest.NewRequest("GET", "/v1/keys/charges/A-1", nil)
	req.Header.Set("Authorization", "Bearer tok")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if !strings.Contains(w.Body.String(), `"reconciled": true`) {
		t.Errorf("GET of a reconciled key = %s, want reconciled: true", w.Body)
	}
}

// TestReconcileScheduleSurvivesRestartRedis: the same with Redis: a new
// proxy process (a new client) finds the schedule in Redis.
func TestReconcileScheduleSurvivesRestartRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := newGate()
	up := httptest.NewServer(g)
	t.Cleanup(up.Close)
	open := func() (*redis.Store, *proxy.Proxy, *httptest.Server) {
		st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "restart:", DialTimeout: time.Second, OpTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		p, hs := serveReconcileRoute(t, up.URL, st)
		return st, p, hs
	}
	st, _, hs := open()
	(&proxytest.Env{T: t, Stub: up, Server: hs}).Fault("delay", 1, "1s")
	proxytest.WantStatus(t, "charge answered too late", proxytest.Send(hs.Client(), "POST", hs.URL+"/charges", `{"orderId": "R-7", "amount": 5}`), http.StatusGatewayTimeout, "upstream-timeout")
	hs.Close()
	st.Close()

	st, p, hs := open()
	defer func() { hs.Close(); st.Close() }()
	if keys, err := st.Unscheduled(context.Background(), "charges/", 10); err != nil || len(keys) != 0 {
		t.Fatalf("Unscheduled after the restart = %q, %v; want none: the schedule was lost", keys, err)
	}
	rec, err := reconcile.New(p.ReconcileHost(), reconcile.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	sk := store.Key("charges", "", "R-7")
	reconcileUntil(t, rec, "the key is completed after the restart", func() bool {
		r, err := st.Get(context.Background(), sk)
		return err == nil && r != nil && r.State == store.StateCompleted
	})
	if a := proxytest.Send(hs.Client(), "POST", hs.URL+"/charges", `{"orderId": "R-7", "amount": 5}`); !a.Replayed() || a.Header.Get("Idempotent-Reconciled") != "true" {
		t.Errorf("retry after the restart = %v %v, want the reconciled replay", a, a.Header)
	}
}

// TestReconcilerRunStopsOnCancel: Run resolves due keys by itself, and
// returns once its context is cancelled, with no lookup left running.
func TestReconcilerRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(g)
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, reconcileRoute)
	rec, err := reconcile.New(e.Proxy.ReconcileHost(), reconcile.Options{Store: e.Store, Tick: 10 * time.Millisecond, DiscoverEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { rec.Run(ctx); close(stopped) }()
	inDoubtCharged(e, `"R-8"`)
	proxytest.Eventually(t, "the background reconciler completes the key", func() bool { return e.State("charges", "", "R-8") == store.StateCompleted })
	// A lookup held at the upstream when the reconciler stops: Run waits
	// for it, and the key stays in doubt.
	g.entered, g.block = make(chan struct{}, 4), make(chan struct{})
	inDoubtCharged(e, `"R-9"`)
	<-g.entered
	cancel()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if st := e.State("charges", "", "R-9"); st != store.StateInDoubt {
		t.Errorf("state of R-9 after the stop = %q, want in_doubt", st)
	}
}

// TestReconcileFollowsReload: a key due on a route that a reload left
// without reconcile is taken off the schedule, not looked up; a reload
// that brings reconcile back schedules it again.
func TestReconcileFollowsReload(t *testing.T) {
	t.Parallel()
	g := newGate()
	other := "  - name: other\n    match: POST /other\n    key: {json: orderId}\n    upstream_timeout: 300ms\n    lease: 500ms\n" +
		"    reconcile: {lookup: \"GET /orders/{key}/charge\", grace: 600ms, interval: 100ms}\n"
	e, rec := newReconcileEnv(t, g, reconcileRoute+other)
	inDoubtCharged(e, `"R-10"`)
	without := strings.Replace(reconcileRoute, "    reconcile: {lookup: \"GET /orders/{key}/charge\", grace: 600ms, interval: 100ms}\n", "", 1)
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, without+other)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	proxytest.Eventually(t, "the key is taken off the schedule", func() bool {
		rec.RunOnce(ctx)
		keys, err := e.Store.Unscheduled(ctx, "charges/", 10)
		return err == nil && len(keys) == 1
	})
	if got := g.lookups.Load(); got != 0 {
		t.Errorf("lookups on a route without reconcile = %d, want 0", got)
	}
	if st := e.State("charges", "", "R-10"); st != store.StateInDoubt {
		t.Errorf("state = %q, want in_doubt", st)
	}
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, reconcileRoute+other)); err != nil {
		t.Fatal(err)
	}
	reconcileUntil(t, rec, "the key is completed once reconcile is back", func() bool { return e.State("charges", "", "R-10") == store.StateCompleted })
}

// TestReconcileDueGaugeFollowsReload: idemproxy_reconcile_due_keys counts
// the keys due at the reconciler's last pass. Once a reload leaves no route
// that reconciles, passes stop, and the gauge must say 0 rather than keep
// its last count: an alert on it would fire until the next restart.
func TestReconcileDueGaugeFollowsReload(t *testing.T) {
	t.Parallel()
	g := newGate()
	g.fail.Store(1 << 20) // every lookup fails: the key stays due
	e, rec := newReconcileEnv(t, g, reconcileRoute)
	inDoubtCharged(e, `"R-20"`)
	due := func() float64 { return proxytest.CounterValue(t, e.Registry, "idemproxy_reconcile_due_keys", nil) }
	reconcileUntil(t, rec, "the key is due", func() bool { return due() == 1 })
	without := strings.Replace(reconcileRoute, "    reconcile: {lookup: \"GET /orders/{key}/charge\", grace: 600ms, interval: 100ms}\n", "", 1)
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, without)); err != nil {
		t.Fatal(err)
	}
	rec.RunOnce(context.Background())
	if got := due(); got != 0 {
		t.Errorf("idemproxy_reconcile_due_keys = %v after a reload without reconcile, want 0", got)
	}
}

// TestReconcileDiscoveryIsNotStarvedByScopedKeys: in-doubt keys left by a
// route's earlier, scoped definition are never looked up; on Redis, whose
// scan comes in no particular order, a batch full of them must not hide
// the unscoped orphan that discovery is there to schedule.
func TestReconcileDiscoveryIsNotStarvedByScopedKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "starve:", DialTimeout: time.Second, OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	up := httptest.NewServer(newGate())
	t.Cleanup(up.Close)
	p, hs := serveReconcileRoute(t, up.URL, st)
	t.Cleanup(hs.Close)
	ctx := context.Background()
	orphan := func(sk string) {
		res := store.Reservation{Token: "tok-" + sk, Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
		if rec, err := st.Reserve(ctx, sk, res); err != nil || rec != nil {
			t.Fatalf("Reserve(%q) = %v, %v", sk, rec, err)
		}
		if err := st.MarkInDoubt(ctx, sk, res.Token, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 200 {
		orphan(store.Key("charges", "tenant-a", fmt.Sprintf("S-%d", i)))
	}
	orphan(store.Key("charges", "", "U-1"))
	rec, err := reconcile.New(p.ReconcileHost(), reconcile.Options{Store: st, Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rec.Discover(ctx)
	}
	keys, err := st.Unscheduled(ctx, "charges/-/", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("unscoped in-doubt keys still without a lookup after discovery: %q", keys)
	}
}
