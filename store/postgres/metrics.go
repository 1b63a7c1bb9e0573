package postgres

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers the connection pool's and the sweeper's metrics
// of s on reg (idemproxy_postgres_*). They are read from s when scraped; a
// nil s reads as zero (for listing the metrics without a database).
func RegisterMetrics(reg prometheus.Registerer, s *Store) {
	stat := func(f func(*pgxpool.Stat) float64) func() float64 {
		return func() float64 {
			if s == nil {
				return 0
			}
			return f(s.pool.Stat())
		}
	}
	counter := func(v func(*Store) int64) func() float64 {
		return func() float64 {
			if s == nil {
				return 0
			}
			return float64(v(s))
		}
	}
	conns := func(state string, f func(*pgxpool.Stat) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "idemproxy_postgres_pool_conns",
			Help:        "Connections of the PostgreSQL pool, by state: idle, acquired (running a statement), constructing (being opened).",
			ConstLabels: prometheus.Labels{"state": state},
		}, stat(f))
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_postgres_pool_max_conns",
			Help: "Size of the PostgreSQL connection pool (store.postgres.max_conns).",
		}, stat(func(st *pgxpool.Stat) float64 { return float64(st.MaxConns()) })),
		conns("idle", func(st *pgxpool.Stat) float64 { return float64(st.IdleConns()) }),
		conns("acquired", func(st *pgxpool.Stat) float64 { return float64(st.AcquiredConns()) }),
		conns("constructing", func(st *pgxpool.Stat) float64 { return float64(st.ConstructingConns()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_pool_acquires_total",
			Help: "Connections taken from the PostgreSQL pool.",
		}, stat(func(st *pgxpool.Stat) float64 { return float64(st.AcquireCount()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_pool_empty_acquires_total",
			Help: "Connections taken from the PostgreSQL pool that had to wait for one (none was idle).",
		}, stat(func(st *pgxpool.Stat) float64 { return float64(st.EmptyAcquireCount()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_pool_canceled_acquires_total",
			Help: "Waits for a PostgreSQL connection that gave up (store.postgres.connect_timeout or the caller's deadline).",
		}, stat(func(st *pgxpool.Stat) float64 { return float64(st.CanceledAcquireCount()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_pool_acquire_wait_seconds_total",
			Help: "Time spent waiting for a PostgreSQL connection when none was idle.",
		}, stat(func(st *pgxpool.Stat) float64 { return st.EmptyAcquireWaitTime().Seconds() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_pool_new_conns_total",
			Help: "PostgreSQL connections opened.",
		}, stat(func(st *pgxpool.Stat) float64 { return float64(st.NewConnsCount()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_expired_deleted_total",
			Help: "Expired key records deleted by this process' sweeper.",
		}, counter(func(s *Store) int64 { return s.swept.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_postgres_sweep_errors_total",
			Help: "Sweeps of expired key records that failed (they are tried again at the next interval).",
		}, counter(func(s *Store) int64 { return s.sweepFails.Load() })),
	)
}
