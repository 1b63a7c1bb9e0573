package app

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/redis"
)

// A backend is one store the program can open: its name in metrics and
// logs, whether the configuration selects it, and how to open it. Adding a
// store means adding it here, its configuration in package config, and its
// package under store/, which passes store/storetest.
type backend struct {
	name     string
	selected func(config.Store) bool
	open     func(a *app, reg prometheus.Registerer) (storeCloser, error)
}

// backends lists every store backend. config.Validate allows one to be
// selected at a time, and config's defaults select Badger when none is.
var backends = []backend{
	{name: "redis", selected: func(s config.Store) bool { return s.Redis != nil }, open: openRedis},
	{name: "postgres", selected: func(s config.Store) bool { return s.Postgres != nil }, open: openPostgres},
	{name: "badger", selected: func(s config.Store) bool { return s.Badger != nil }, open: openBadger},
}

// openStore opens the configured store and names it for the metrics.
func (a *app) openStore(reg prometheus.Registerer) (storeCloser, string, error) {
	for _, b := range backends {
		if b.selected(a.cfg.Store) {
			s, err := b.open(a, reg)
			return s, b.name, err
		}
	}
	return nil, "", fmt.Errorf("no store configured")
}

// openRedis opens the shared Redis store of store.redis.
func openRedis(a *app, _ prometheus.Registerer) (storeCloser, error) {
	r := a.cfg.Store.Redis
	opts := redis.Options{
		Addrs:             r.Addrs,
		MasterName:        r.MasterName,
		ClusterMode:       r.Cluster,
		SkipEvictionCheck: r.SkipEvictionCheck,
		DB:                r.DB,
		KeyPrefix:         r.KeyPrefix,
		DialTimeout:       r.DialTimeout.D(),
		OpTimeout:         r.OpTimeout.D(),
		EpochSeen:         a.epochSeen,
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
	goredis.SetLogger(redisLogger{a.log})
	return s, nil
}

// postgresSetUpTimeout bounds opening the PostgreSQL store: connecting,
// creating the schema when it is missing, and the write probe.
const postgresSetUpTimeout = 30 * time.Second

// openPostgres opens the PostgreSQL store of store.postgres, creating its
// table when missing, and exports its pool's metrics.
func openPostgres(a *app, reg prometheus.Registerer) (storeCloser, error) {
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
	postgres.RegisterMetrics(reg, s)
	return s, nil
}

// openBadger opens the embedded store of store.badger, guarded against
// failures and a full disk.
func openBadger(a *app, reg prometheus.Registerer) (storeCloser, error) {
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
	registerBadgerMetrics(reg, s)
	return s, nil
}

// storeCheckRemedy is what the log tells an operator to run when the
// Badger store does not open.
func (a *app) storeCheckRemedy() string {
	return "run `idemproxy store check -config " + a.path + "` to see what is wrong, then follow docs/operations.md, \"Runbook: the store does not open\""
}

// registerStoreOpenMetric exports idemproxy_store_open_failed: 1 while the
// Badger store could not be opened (the process serves degraded: 503 on
// protected routes, passthrough routes served).
func registerStoreOpenMetric(reg prometheus.Registerer, s *badger.Guard) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_store_open_failed",
		Help: "1 while the embedded (Badger) store could not be opened (a damaged reservation log, a missing or unreadable MANIFEST, a permission error): protected routes answer 503 store-unavailable and /readyz says why; 0 once it is open.",
	}, func() float64 {
		if s.OpenFailed() != nil {
			return 1
		}
		return 0
	}))
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
