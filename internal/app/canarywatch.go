package app

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/canary"
	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/redis"
)

// releaseMarkMargin is added to the longest witness window for the TTL of
// an operator's release mark.
const releaseMarkMargin = time.Minute

// watchLosses starts this replica's canaries on st (not gated: they are
// written whatever the epoch) and builds its witness of answered keys;
// both turn the store lost through w.MarkLost. It returns the witness for
// the proxy, the function that writes an operator's release mark for the
// admin API, and the function that stops the canaries.
func (a *app) watchLosses(reg prometheus.Registerer, st store.Store, w *epoch.Watcher) (*witness.Witness, func(context.Context, string) error, func()) {
	sc := a.cfg.Store
	lost := func(reason string) bool {
		// The marker first: a store that forgot everything (restarted
		// empty, flushed) is told as such, with what the marker shows.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.Check(ctx)
		return w.MarkLost(reason)
	}
	trusted := func() string {
		if s := w.Status(); s.State == epoch.OK {
			return s.Epoch.ID
		}
		return ""
	}
	var c *canary.Canaries
	wit := witness.New(witness.Options{Window: sc.WitnessWindow.D(), MaxKeys: sc.WitnessMaxKeys, Epoch: trusted,
		Released: func(ctx context.Context, key string) (bool, error) { return canary.Released(ctx, st, key) },
		Lost: func(reason string) {
			// The canaries first, at once: what else the store lost.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.Round(ctx, true)
			lost(reason)
		}})
	opts := canary.Options{Store: st, Interval: sc.CanaryInterval.D(), Lost: lost, Logger: a.log,
		Epoch: func() string {
			// Every interval: the witness forgets the answers of an
			// epoch no longer trusted (a loss accepted) at once.
			id := trusted()
			wit.Sync(id)
			return id
		}}
	// The answers remembered belong to the epoch trusted when they were
	// answered: the witness learns each change of trust as it happens
	// (a loss, an acceptance), not at the canaries' next round.
	syncWitness := func(id string) { wit.Sync(id) }
	a.onTrust.Store(&syncWitness)
	wit.Sync(trusted())
	if g, ok := st.(*badger.Guard); ok {
		opts.Paused = g.BelowFloor
	}
	if rs, ok := st.(*redis.Store); ok {
		opts.Tags = func(ctx context.Context) ([]string, error) { return rs.CanaryTags(ctx, canary.Prefix+"canary/") }
	}
	c = canary.New(opts)
	registerLossMetrics(reg, c, wit)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.Run(ctx)
	}()
	// The longest window any replica may have, not this one's: a replica
	// that remembers its answers longer than this one (a rolling change
	// of store.witness_window, another fleet on the store) would take a
	// key released here for a loss once the mark was gone.
	markTTL := config.MaxWitnessWindow + releaseMarkMargin
	mark := func(ctx context.Context, key string) error { return canary.MarkReleased(ctx, st, key, markTTL) }
	return wit, mark, func() { cancel(); wg.Wait() }
}

// registerLossMetrics exports the canaries' and the witness' counters.
func registerLossMetrics(reg prometheus.Registerer, c *canary.Canaries, wit *witness.Witness) {
	counter := func(name, help string, labels prometheus.Labels, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f()) })
	}
	const checks = "Canaries read back by this replica, by result: ok (found), missing (the store lost writes: marked lost), error (not read: the store unreachable)."
	const writes = "Canaries written by this replica, by result: ok, error (not written: the store unreachable)."
	const hits = "Reservations that succeeded on a key this replica answered within store.witness_window, by verdict: lost (released by no one: refused, the store marked lost), released (an operator's release mark), unknown (the marks not read: refused as a store failure)."
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_store_canaries",
			Help: "Canaries this replica writes every store.canary_interval: one, or one for each Redis Cluster master.",
		}, func() float64 { return float64(c.Stats().Places) }),
		counter("idemproxy_store_canary_writes_total", writes, prometheus.Labels{"result": "ok"}, func() uint64 { return c.Stats().Writes }),
		counter("idemproxy_store_canary_writes_total", writes, prometheus.Labels{"result": "error"}, func() uint64 { return c.Stats().WriteErrors }),
		counter("idemproxy_store_canary_checks_total", checks, prometheus.Labels{"result": "ok"}, func() uint64 { return c.Stats().OK }),
		counter("idemproxy_store_canary_checks_total", checks, prometheus.Labels{"result": "missing"}, func() uint64 { return c.Stats().Missing }),
		counter("idemproxy_store_canary_checks_total", checks, prometheus.Labels{"result": "error"}, func() uint64 { return c.Stats().ReadErrors }),
		counter("idemproxy_witness_hits_total", hits, prometheus.Labels{"verdict": "lost"}, func() uint64 { return wit.Stats().Lost }),
		counter("idemproxy_witness_hits_total", hits, prometheus.Labels{"verdict": "released"}, func() uint64 { return wit.Stats().Released }),
		counter("idemproxy_witness_hits_total", hits, prometheus.Labels{"verdict": "unknown"}, func() uint64 { return wit.Stats().Unknown }),
		counter("idemproxy_witness_forgotten_total",
			"Keys the witness gave up before store.witness_window ended, for newer ones: store.witness_max_keys is too small for the traffic (their retries are not witnessed).",
			nil, func() uint64 { return wit.Stats().Forgotten }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_witness_capacity_keys",
			Help: "Keys the witness can hold (store.witness_max_keys rounded up to a power of two), at 16 bytes each.",
		}, func() float64 { return float64(wit.Capacity()) }),
	)
}
