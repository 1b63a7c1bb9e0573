package redis

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers the Redis store's own metrics of s on reg:
// the writes failed because fewer replicas than Options.WaitReplicas
// acknowledged them. They are read from s when scraped; a nil s reads as
// zero (for listing the metrics without a store).
func RegisterMetrics(reg prometheus.Registerer, s *Store) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "idemproxy_store_replica_wait_failures_total",
		Help: "Redis writes (reservations, commits, releases, in-doubt marks, lookups) that failed because fewer replicas than store.redis.wait_replicas acknowledged them within store.redis.wait_timeout; each answered as a store error.",
	}, func() float64 {
		if s == nil {
			return 0
		}
		return float64(s.replicaWaitFailures())
	}))
}
