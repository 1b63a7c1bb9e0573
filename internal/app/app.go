package app

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"regexp"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/app/buildinfo"
	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

// app is a running idemproxy.
type app struct {
	log    *slog.Logger
	access *proxy.AccessLog // nil: the access log is off
	// settler retries the writes that settle keys (internal/settle);
	// made by serve.
	settler *settle.Settler
	// onTrust, when set, is told the ID of the epoch the replica trusts
	// whenever it changes ("" for none), after the store is: the witness
	// of answered keys forgets those of an epoch no longer trusted.
	onTrust atomic.Pointer[func(id string)]
	// ksOnTrust is keyspaces once serve set it (nil: none yet), for the
	// epoch watcher's goroutine: told to record the keyspaces again when
	// the replica trusts the store after a loss.
	ksOnTrust atomic.Pointer[keyspaces]
	path      string
	// overrides are the flags' and variables' values that replace the
	// file's, on every reload as at start.
	overrides config.Overrides
	getenv    func(string) string

	tracing *tracing.Tracing // on while tracing.enabled; made by serve

	mu    sync.Mutex // serialises reloads
	cfg   *config.Config
	p     *proxy.Proxy
	conns *admission.Limiter // the client listener's limits; set by serve
	// heapBound is the memory the admission judges the live heap against
	// (applyMemoryLimit); 0: none.
	heapBound int64
	reloadOK  prometheus.Gauge
	reloadTS  prometheus.Gauge
	reloads   *prometheus.CounterVec // by trigger and result
	// loadedSum is the hash of the file's content last read by a start or
	// a reload, applied or not: config.watch reloads when the file's
	// differs.
	loadedSum [sha256.Size]byte

	// keyspaces checks the routes' keyspaces against the store's registry
	// (keyspaces.go); nil outside serve, or for a store without one.
	keyspaces *keyspaces

	// epochSeen is given to the shared stores, which call it with the
	// epoch marker read on each new connection (epoch.go); nil outside
	// serve.
	epochSeen func(m *store.Epoch, read bool) error
	// keysEvicted is given to the Redis store, which calls it when it saw
	// keys evicted: the epoch watcher marks the store lost; nil outside
	// serve.
	keysEvicted func(reason string)
}

// storeCloser is a store the program opens and closes; every backend
// lists its keys for the admin API.
type storeCloser interface {
	store.Store
	store.Lister
	Close() error
}

// newRegistry returns the registry of the program's own metrics; the
// store and the proxy add theirs.
func (a *app) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	a.registerMetrics(reg)
	return reg
}

// registerMetrics registers the process, build and reload metrics.
func (a *app) registerMetrics(reg prometheus.Registerer) {
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_build_info",
		Help: "Always 1; the labels name the running build.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(buildinfo.Version(), runtime.Version()).Set(1)
	a.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_config_last_reload_successful",
		Help: "1 if the last configuration (re)load succeeded, 0 if it failed and the previous one is still running.",
	})
	a.reloadTS = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_config_last_reload_success_timestamp_seconds",
		Help: "Unix time of the last successful configuration (re)load.",
	})
	a.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_config_reloads_total",
		Help: "Configuration reloads, by trigger (signal, api, watch) and result (applied, failed).",
	}, []string{"trigger", "result"})
	for _, t := range []string{reloadBySignal, reloadByAPI, reloadByWatch} {
		a.reloads.WithLabelValues(t, "applied")
		a.reloads.WithLabelValues(t, "failed")
	}
	reg.MustRegister(
		// Besides the default series: the collector's CPU time, by
		// class, and the CPU available (GOMAXPROCS × wall time), as the
		// runtime estimates them, for the share the collector takes under
		// load; and the live heap, what memory-aware admission judges
		// (docs/admission.md, "Many clients at once").
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{
			Matcher: regexp.MustCompile(`^(/cpu/classes/(gc/.*|total):cpu-seconds|/gc/heap/live:bytes)$`),
		})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo, a.reloadOK, a.reloadTS, a.reloads,
	)
	a.reloadOK.Set(1)
	a.reloadTS.SetToCurrentTime()
}

// Options is what Serve runs: a loaded configuration and where its lines
// go.
type Options struct {
	Log    *slog.Logger     // required
	Access *proxy.AccessLog // nil: the access log is off
	Path   string           // the configuration file, read again on reload
	Config *config.Config   // the configuration loaded from Path
	// Overrides were applied to Config; a reload applies them again.
	Overrides config.Overrides
	Getenv    func(string) string
}

// Serve runs the proxy until ctx is cancelled, then shuts down gracefully;
// it returns why it could not start or serve, nil after a clean stop.
func Serve(ctx context.Context, o Options) error {
	a := &app{log: o.Log, access: o.Access, path: o.Path, cfg: o.Config, overrides: o.Overrides, getenv: o.Getenv}
	return a.serve(ctx)
}

// serve runs the proxy until ctx is cancelled, then shuts down gracefully.
func (a *app) serve(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	log.Info("idemproxy starting", a.startAttrs()...)
	go warnUnresolvedHosts(ctx, log, cfg) // never delays the start (ResolveTimeout at most)
	nofile, nofileKnown := raiseOpenFiles(log)
	checkDescriptors(log, cfg, nofile, nofileKnown)
	if err := a.preallocate(); err != nil { // store.badger.preallocate, before the store opens
		return err
	}
	// From the start: an unhandled SIGHUP would kill the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	a.applyMemoryLimit(cfg)
	// Before the store opens: a start its OTEL_* settings refuse must not
	// write to a shared store first (an epoch marker).
	a.tracing = tracing.New(log)
	if err := a.tracing.Configure(cfg.Tracing.Enabled); err != nil {
		return err
	}
	defer func() { // after the last request and lookup: their spans are flushed
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.tracing.Shutdown(fctx); err != nil {
			log.Warn("tracing: the last spans were not all exported", "err", err)
		}
	}()
	reg := a.newRegistry()
	// One settler retries every write that settles a key, the proxy's and
	// the store's own (a Badger commit whose batch failed): shutdown waits
	// for them up to its deadline, before the store closes.
	a.settler = settle.New(log)
	settle.RegisterMetrics(reg, a.settler)
	var watcher atomic.Pointer[epoch.Watcher]
	a.epochSeen = func(m *store.Epoch, read bool) error { return epochSeen(watcher.Load(), m, read) }
	a.keysEvicted = func(reason string) {
		if w := watcher.Load(); w != nil {
			w.MarkLost(reason)
		}
	}
	st, storeName, err := a.openStore(reg)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			log.Error("close store", "err", err)
		}
	}()
	defer func() { // on an early return: stopped at once; after a shutdown, closed already
		now, cancel := context.WithCancel(context.Background())
		cancel()
		a.settler.Close(now)
	}()
	// The epoch watcher gates reservations (a store that forgot its keys
	// is refused); the write probe's verdict is /readyz's, and the
	// proxy's reservations report to it between probes.
	reserveStore, epochReady, stopEpoch := a.watchEpoch(ctx, reg, st, storeName, &watcher)
	defer stopEpoch() // before the store closes
	// The canaries and the witness of answered keys: a store that lost
	// some keys, not all, marked lost too.
	var wit *witness.Witness
	var markReleased func(context.Context, string) error
	if w := watcher.Load(); w != nil {
		var stopLosses func()
		wit, markReleased, stopLosses = a.watchLosses(reg, st, w)
		defer stopLosses() // before the store closes
	}
	probe := store.NewWriteProbe(st, store.ProbeOptions{})
	a.p, err = proxy.New(cfg, proxy.Options{
		Store: probe.Observe(reserveStore), StoreName: storeName, Logger: log, AccessLog: a.access, Metrics: proxy.NewMetrics(reg),
		Settler: a.settler, Tracing: a.tracing, Witness: wit,
	})
	if err != nil {
		return err
	}
	// Before the listener opens: a route whose keys would be made anew
	// in a keyspace with live keys never serves a request.
	ks, stopKeyspaces := a.startKeyspaces(st, cfg.Store.EpochCheckInterval.D())
	a.ksOnTrust.Store(ks)
	defer stopKeyspaces()
	a.mu.Lock()
	a.keyspaces = ks
	a.mu.Unlock()
	reconciler, stopReconciler, err := a.startReconciler(st)
	if err != nil {
		return err
	}
	defer stopReconciler() // before the store closes
	store.RegisterProbeMetrics(reg, probe)
	probeCtx, stopProbe := context.WithCancel(context.Background())
	probeDone := make(chan struct{})
	go func() { defer close(probeDone); probe.Run(probeCtx) }()
	defer func() { stopProbe(); <-probeDone }() // before the store closes

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	conns := admission.NewLimiter(ln, cfg.Server.MaxConnections, cfg.Server.ReadHeaderTimeout.D(), log)
	conns.SetClientLimits(cfg.Server)
	a.conns = conns
	conns.SetHeapBound(a.heapBound)
	conns.SetIdleTimeout(cfg.Server.IdleTimeout.D())
	admission.RegisterMetrics(reg, conns)
	srv := &http.Server{
		Handler:           conns.Guard(admission.WithoutH2CUpgrade(a.p)),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.D(),
		ReadTimeout:       cfg.Server.ReadTimeout.D(),
		IdleTimeout:       admission.IdleTimeoutOff, // conns closes them: SetIdleTimeout
		MaxHeaderBytes:    admission.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnState:         conns.ConnState,
		ConnContext:       conns.ConnContext,
		Protocols:         admission.ServerProtocols(),
		HTTP2:             admission.ServerHTTP2(),
	}
	ln = conns
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()

	var adm *admin.Handler
	var admSrv *http.Server
	if cfg.Admin.Listen != "" {
		token := a.getenv(cfg.Admin.TokenEnv)
		if token == "" {
			log.Warn("the key API is disabled: " + cfg.Admin.TokenEnv + " is not set")
		}
		adm = admin.NewHandler(admin.Options{
			Store: a.p.Store(), Lister: st, Routes: a, Gatherer: reg, Token: token, TokenEnv: cfg.Admin.TokenEnv,
			Reload: func() error { return a.reload(reloadByAPI) }, StoreOptional: a.storeOptional, Logger: log, Reconciler: reconciler,
			AcceptLoss: a.acceptLossFunc(st, &watcher), DropKeyspace: ks.dropFunc(), MarkReleased: markReleased,
			Pprof: cfg.Admin.Pprof, ReadyChecks: []func() error{conns.Saturated, a.p.BuffersSaturated, a.storeOpenReady(st), epochReady, ks.ready},
			StoreProbe: probe, Registerer: reg, Tracing: a.tracing,
		})
		raw, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			srv.Close()
			return fmt.Errorf("admin listen: %w", err)
		}
		// The admin listener is bounded apart from the main one
		// (admin.max_connections, fair between client addresses), with
		// short timeouts of its own: nothing on the admin port can take
		// the descriptors the charge path needs, or keep a probe out.
		aln := admission.NewAdminLimiter(raw, cfg.Admin.MaxConnections, admission.AdminReadHeaderTimeout)
		admission.RegisterAdminMetrics(reg, aln)
		admSrv = &http.Server{Handler: aln.Guard(adm), ReadHeaderTimeout: admission.AdminReadHeaderTimeout,
			ReadTimeout: admission.AdminReadTimeout, WriteTimeout: admission.AdminWriteTimeout,
			IdleTimeout: admission.AdminIdleTimeout, MaxHeaderBytes: admission.AdminMaxHeaderBytes,
			ConnState: aln.ConnState, ConnContext: aln.ConnContext,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { errc <- admSrv.Serve(aln) }()
		log.Info("admin listening", "addr", aln.Addr().String())
	}
	log.Info("idemproxy listening", "addr", ln.Addr().String(), "upstream", redactURL(cfg.Upstream),
		"store", storeName, "routes", len(cfg.Routes), "version", buildinfo.Version(), "config", a.path)

	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); a.watchConfig(watchCtx, config.WatchInterval) }()
	defer func() { stopWatch(); <-watchDone }()

	for done := false; !done; {
		select {
		case err := <-errc:
			srv.Close()
			if admSrv != nil {
				admSrv.Close()
			}
			return fmt.Errorf("serve: %w", err)
		case <-hup:
			a.reload(reloadBySignal)
		case <-ctx.Done():
			done = true
		}
	}

	// Shut down: not ready at once, keep serving for the drain delay while
	// load balancers notice, then finish what is in flight.
	if adm != nil {
		adm.SetStopping()
	}
	sc := a.currentServer()
	log.Info("shutting down", "signal", stopReason(ctx), "drain_delay", sc.DrainDelay.D(), "timeout", sc.ShutdownTimeout.D())
	time.Sleep(sc.DrainDelay.D())
	sctx, cancel := context.WithTimeout(context.Background(), sc.ShutdownTimeout.D())
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown deadline passed: requests still waiting for the upstream leave their keys in doubt")
		a.p.Abort()
		srv.Close()
	}
	// Settling retries left by a stalled store end at the same deadline
	// (their keys turn in doubt when their leases end), so that shutdown
	// stays within shutdown_timeout.
	defer context.AfterFunc(sctx, a.p.Abort)()
	a.p.Wait()
	a.settler.Close(sctx) // the store's retries too
	if admSrv != nil {
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		admSrv.Shutdown(actx)
	}
	log.Info("idemproxy stopped", "signal", stopReason(ctx))
	return nil
}

// startReconciler starts the background reconciliation of in-doubt keys
// when the store supports it, and returns it (nil otherwise) with the
// function that stops it and waits for its lookups.
func (a *app) startReconciler(st storeCloser) (admin.Reconciler, func(), error) {
	rs, ok := st.(store.ReconcileStore)
	if !ok {
		return nil, func() {}, nil
	}
	rec, err := reconcile.New(a.p.ReconcileHost(), reconcile.Options{Store: rs})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rec.Run(ctx)
	}()
	return rec, func() { cancel(); <-done }, nil
}

func (a *app) currentServer() config.Server {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg.Server
}

// RouteScope implements admin.Routes over the running configuration.
func (a *app) RouteScope(name string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.cfg.Routes {
		if r.Name == name {
			return r.Scope.Header, true
		}
	}
	return "", false
}

var _ admin.RouteKeyspaces = (*app)(nil)

// RouteKeyspace implements admin.RouteKeyspaces over the running
// configuration: the keyspace the route's keys are stored under.
func (a *app) RouteKeyspace(name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.cfg.Routes {
		if r.Name == name {
			return r.Keyspace
		}
	}
	return ""
}

var _ admin.RouteNamer = (*app)(nil)

// RouteNames implements admin.RouteNamer over the running configuration:
// the console's overview lists these routes.
func (a *app) RouteNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := make([]string, 0, len(a.cfg.Routes))
	for _, r := range a.cfg.Routes {
		names = append(names, r.Name)
	}
	return names
}

// storeOptional reports whether every route of the running configuration
// forwards when the store fails.
func (a *app) storeOptional() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.cfg.Routes {
		if r.OnStoreError != config.StoreErrorForward {
			return false
		}
	}
	return true
}

// What asked for a reload, the trigger label of
// idemproxy_config_reloads_total.
const (
	reloadBySignal = "signal" // SIGHUP
	reloadByAPI    = "api"    // POST /-/reload, idemproxy reload
	reloadByWatch  = "watch"  // config.watch saw the file change
)

// reload re-reads the configuration file and swaps it in; a file that does
// not load, or that changes what only a restart can change, keeps the
// running configuration.
func (a *app) reload(trigger string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := os.ReadFile(a.path)
	var cfg *config.Config
	if err != nil {
		err = fmt.Errorf("read config: %w", err)
	} else {
		a.loadedSum = sha256.Sum256(b)
		cfg, err = config.ParseWith(b, a.overrides)
	}
	if err == nil {
		err = needsRestart(a.cfg, cfg)
	}
	keyspacesApplied := func() {}
	if err == nil && a.keyspaces != nil {
		keyspacesApplied, err = a.keyspaces.reload(a.cfg, cfg)
	}
	if err == nil {
		err = a.tracing.Configure(cfg.Tracing.Enabled)
	}
	if err == nil {
		if err = a.p.Reload(cfg); err != nil {
			a.tracing.Configure(a.cfg.Tracing.Enabled) // as it was
		}
	}
	if err != nil {
		a.reloadOK.Set(0)
		a.reloads.WithLabelValues(trigger, "failed").Inc()
		a.log.Error("configuration reload failed; the running configuration is kept", "config", a.path, "trigger", trigger, "err", err)
		return err
	}
	if cfg.MemoryLimit != a.cfg.MemoryLimit {
		a.applyMemoryLimit(cfg)
	}
	if a.conns != nil {
		a.conns.SetClientLimits(cfg.Server)
	}
	a.cfg = cfg
	keyspacesApplied()
	a.reloadOK.Set(1)
	a.reloadTS.SetToCurrentTime()
	a.reloads.WithLabelValues(trigger, "applied").Inc()
	a.log.Info("configuration reloaded", "config", a.path, "trigger", trigger, "routes", len(cfg.Routes))
	return nil
}

// needsRestart reports the settings that differ between old and new but
// only take effect at start.
func needsRestart(old, new *config.Config) error {
	var changed []string
	if old.Listen != new.Listen {
		changed = append(changed, "listen")
	}
	if old.UpstreamTLS != new.UpstreamTLS {
		changed = append(changed, "upstream_tls")
	}
	if old.Admin != new.Admin {
		changed = append(changed, "admin")
	}
	if !reflect.DeepEqual(old.Store, new.Store) {
		changed = append(changed, "store")
	}
	oldS, newS := old.Server, new.Server
	oldS.DrainDelay, newS.DrainDelay = 0, 0
	oldS.ShutdownTimeout, newS.ShutdownTimeout = 0, 0
	oldS.PassthroughTimeout, newS.PassthroughTimeout = 0, 0
	oldS.MaxBufferedBytes, newS.MaxBufferedBytes = 0, 0
	oldS.MaxBufferedBytesPerClient, newS.MaxBufferedBytesPerClient = 0, 0
	oldS.BodyTimeout, newS.BodyTimeout = 0, 0
	oldS.MaxRequestsPerClient, newS.MaxRequestsPerClient = 0, 0
	oldS.MaxClientResetsPerSecond, newS.MaxClientResetsPerSecond = 0, 0
	oldS.MaxResetsPerSecond, newS.MaxResetsPerSecond = 0, 0
	if oldS != newS {
		changed = append(changed, "server timeouts or max_connections")
	}
	if len(changed) > 0 {
		return fmt.Errorf("%v changed: restart idemproxy to apply", changed)
	}
	return nil
}
