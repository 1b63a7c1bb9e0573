package app

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/redis"
)

// A backend is one kind of store as the program runs it. The table
// backends below is, with config's table of store kinds (config/stores.go:
// each kind's section, its defaults and checks, which kind is selected and
// the default one), the one place that says what a kind of store is: how
// it opens, what it adds to the first log line, and which metrics it
// registers. Adding a store is its package under store/, which passes
// store/storetest, and one line here; TestBackendsAreDeclaredEverywhere
// and config's tests name what else is missing (its configuration section
// and its docs).
type backend struct {
	// kind is the store's kind in config (config.StoreKinds): the section
	// of store that selects it, and its name in metrics and logs.
	kind string
	// local says that only this process uses the store (Badger's files):
	// a new epoch marker is trusted at once. False, the safe default, is
	// a store replicas share: a new marker waits for the objections of
	// replicas that remember an older one.
	local bool
	// open opens the store of the configuration's section.
	open func(a *app) (storeCloser, error)
	// startAttrs are what the first log line says after store=kind: where
	// the store is, never a credential (startlog.go).
	startAttrs func(s config.Store, getenv func(string) string) []any
	// metrics registers the store's own collectors on reg, read from st
	// when scraped; a nil st registers them for listing (they read as
	// zero). Nil: the store has none.
	metrics func(reg prometheus.Registerer, st storeCloser)
}

// backends is the table of store backends, one line each.
var backends = []backend{
	{kind: config.StoreBadger, local: true, open: openBadger, startAttrs: badgerAttrs, metrics: badgerMetrics},
	{kind: config.StoreRedis, open: openRedis, startAttrs: redisAttrs, metrics: redisMetrics},
	{kind: config.StorePostgres, open: openPostgres, startAttrs: postgresAttrs, metrics: postgresMetrics},
}

// backendOf returns the backend of a kind of store; false when there is
// none.
func backendOf(kind string) (backend, bool) {
	for _, b := range backends {
		if b.kind == kind {
			return b, true
		}
	}
	return backend{}, false
}

// openStore opens the configured store, registers its metrics on reg, and
// names it for the metrics.
func (a *app) openStore(reg prometheus.Registerer) (storeCloser, string, error) {
	b, ok := backendOf(a.cfg.Store.Kind())
	if !ok {
		return nil, "", fmt.Errorf("no store configured")
	}
	s, err := b.open(a)
	if err != nil {
		return nil, b.kind, err
	}
	if b.metrics != nil {
		b.metrics(reg, s)
	}
	return s, b.kind, nil
}

// openRedis opens the shared Redis store of store.redis.
func openRedis(a *app) (storeCloser, error) {
	r := a.cfg.Store.Redis
	wait, auto := r.ReplicaWait()
	opts := redis.Options{
		Addrs:              r.Addrs,
		MasterName:         r.MasterName,
		ClusterMode:        r.Cluster,
		SkipEvictionCheck:  r.SkipEvictionCheck,
		AllowEviction:      r.AllowEviction,
		AllowNoPersistence: r.AllowNoPersistence,
		KeysEvicted:        a.keysEvicted,
		Logger:             a.log.With("store", config.StoreRedis),
		DB:                 r.DB,
		KeyPrefix:          r.KeyPrefix,
		DialTimeout:        r.DialTimeout.D(),
		OpTimeout:          r.OpTimeout.D(),
		EpochSeen:          a.epochSeen,
		WaitReplicas:       wait,
		WaitAuto:           auto,
		WaitTimeout:        r.WaitTimeout.D(),
		RecordLayout:       redis.RecordLayout(r.RecordLayout),
	}
	for _, c := range []struct {
		env string
		dst *string
	}{
		{r.UsernameEnv, &opts.Username}, {r.PasswordEnv, &opts.Password},
		{r.SentinelUsernameEnv, &opts.SentinelUsername}, {r.SentinelPasswordEnv, &opts.SentinelPassword},
	} {
		if c.env != "" {
			*c.dst = a.getenv(c.env)
		}
	}
	tlsConf, err := r.ClientTLS()
	if err != nil {
		return nil, err
	}
	opts.TLS = tlsConf
	s, err := redis.New(opts)
	if err != nil {
		return nil, err
	}
	// go-redis logs every failed dial; the store's errors already reach
	// the log and the metrics, so its own lines go to debug.
	redis.SetLogger(a.log)
	return s, nil
}

// redisMetrics registers the Redis store's own metrics.
func redisMetrics(reg prometheus.Registerer, st storeCloser) {
	s, _ := st.(*redis.Store)
	redis.RegisterMetrics(reg, s)
}

// postgresSetUpTimeout bounds opening the PostgreSQL store: connecting,
// creating the schema when it is missing, and the write probe.
const postgresSetUpTimeout = 30 * time.Second

// openPostgres opens the PostgreSQL store of store.postgres, creating its
// table when missing.
func openPostgres(a *app) (storeCloser, error) {
	pg := a.cfg.Store.Postgres
	dsn := a.getenv(pg.DSNEnv)
	if dsn == "" {
		return nil, fmt.Errorf("store.postgres.dsn_env: environment variable %s is empty or not set", pg.DSNEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), postgresSetUpTimeout)
	defer cancel()
	s, err := postgres.New(ctx, postgres.Options{
		DSN:               dsn,
		MaxConns:          pg.MaxConns,
		ConnectTimeout:    pg.ConnectTimeout.D(),
		StatementTimeout:  pg.StatementTimeout.D(),
		Schema:            pg.Schema,
		Table:             pg.Table,
		SynchronousCommit: pg.SynchronousCommit,
		Logger:            a.log,
		EpochSeen:         a.epochSeen,
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// postgresMetrics registers the pool's and the sweeper's metrics.
func postgresMetrics(reg prometheus.Registerer, st storeCloser) {
	s, _ := st.(*postgres.Store)
	postgres.RegisterMetrics(reg, s)
}

// openBadger opens the embedded store of store.badger, guarded against
// failures and a full disk.
func openBadger(a *app) (storeCloser, error) {
	b := a.cfg.Store.Badger
	s, err := badger.OpenGuarded(badger.Options{
		Dir:        b.Dir,
		SyncWrites: *b.SyncWrites,
		GCInterval: b.GCInterval.D(),
		Logger:     a.log,
		Settler:    a.settler,
	}, badger.GuardOptions{MinFreeBytes: uint64(b.MinFreeBytes), Remedy: a.storeCheckRemedy()})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// badgerMetrics registers the store's size on disk, the guard's free space,
// refusals and reopens, whether it could be opened, and the preallocation
// of its files.
func badgerMetrics(reg prometheus.Registerer, st storeCloser) {
	g, _ := st.(*badger.Guard)
	badger.RegisterMetrics(reg, g)
}

// storeCheckRemedy is what the log tells an operator to run when the
// Badger store does not open.
func (a *app) storeCheckRemedy() string {
	return "run `idemproxy store check -config " + a.path + "` to see what is wrong, then follow docs/operations.md, \"Runbook: the store does not open\""
}

// storeOpenReady is the readiness check of a store that could not be
// opened (Badger only): /readyz answers 503 with the reason, unless every
// route forwards when the store fails.
func (a *app) storeOpenReady(st storeCloser) func() error {
	g, ok := st.(*badger.Guard)
	if !ok {
		return func() error { return nil }
	}
	return func() error {
		err := g.OpenFailed()
		if err == nil || a.storeOptional() {
			return nil
		}
		return fmt.Errorf("store unavailable: the store could not be opened (%s): %w", a.storeCheckRemedy(), err)
	}
}
