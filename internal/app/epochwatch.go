package app

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/redis"
)

// epochStartTimeout bounds the first check of the epoch marker at start,
// so that a replica restarted on a store that kept its keys serves at once.
const epochStartTimeout = 10 * time.Second

// epochSeen is what a shared store calls with the marker read on a new
// connection (read false: a Cluster node, where it was not read): it asks
// the watcher w (nil before it exists) for a check, and fails the
// connection when the marker contradicts the epoch w trusts.
func epochSeen(w *epoch.Watcher, m *store.Epoch, read bool) error {
	if w == nil {
		return nil
	}
	w.Kick()
	if !read {
		return nil
	}
	return w.Verify(m)
}

// watchEpoch starts the watcher of the store's epoch marker (internal/epoch)
// and publishes it in slot. It returns the store the proxy reserves on
// (reservations refused while the replica does not trust the store's
// epoch), the readiness check that says so, and the function that stops
// the watcher. The first check runs before it returns, and a new marker's
// grace too (until ctx ends): a shared store's new marker waits three
// check intervals for objections; Badger's, which no other replica
// shares, none.
func (a *app) watchEpoch(ctx context.Context, reg prometheus.Registerer, st storeCloser, name string, slot *atomic.Pointer[epoch.Watcher]) (store.Store, func() error, func()) {
	es, ok := st.(store.EpochStore)
	if !ok {
		return st, func() error { return nil }, func() {}
	}
	interval := a.cfg.Store.EpochCheckInterval.D()
	opts := epoch.Options{Store: es, Interval: interval, Grace: 3 * interval, Logger: a.log.With("store", name)}
	if b, _ := backendOf(name); b.local {
		opts.Grace = 0
	}
	if inc, ok := st.(interface {
		Incarnation(context.Context) (string, error)
	}); ok {
		opts.Incarnation = inc.Incarnation
	}
	if ex, ok := st.(interface{ ExpectEpoch(string) }); ok {
		opts.OnTrust = ex.ExpectEpoch
	}
	w := epoch.New(opts)
	slot.Store(w)
	registerEpochMetrics(reg, w)
	risk := registerStoreRisk(reg)
	if rs, ok := st.(*redis.Store); ok {
		a.checkRedisConfig(risk, rs)
	}
	cctx, cancel := context.WithTimeout(ctx, epochStartTimeout)
	if err := w.Check(cctx); err != nil {
		a.log.Warn("the store's epoch marker could not be read at start: protected routes answer 503 until it is", "err", err)
	}
	cancel()
	// A new marker (a first start on an empty shared store) waits for the
	// replicas that may remember an older one to object: the proxy
	// listens once it is trusted (or lost), so that nothing it answers
	// in the meantime is a 503 of a store that is only new. A store that
	// cannot be read does not hold the start up.
	for end := time.Now().Add(opts.Grace + 2*interval); w.Status().State == epoch.Establishing && time.Now().Before(end); {
		select {
		case <-ctx.Done():
			end = time.Time{}
			continue
		case <-time.After(min(interval, time.Until(end))):
		}
		cctx, cancel := context.WithTimeout(ctx, epochStartTimeout)
		w.Check(cctx)
		cancel()
	}
	ctx, cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.Run(ctx)
	}()
	ready := func() error {
		err := w.Err()
		if err == nil || a.storeOptional() {
			return nil
		}
		if st := w.Status(); st.State != epoch.Unknown {
			return fmt.Errorf("store-lost-keys (%s): %w", st.State, err)
		}
		return err
	}
	return epoch.Gate(st, w), ready, func() { cancel(); wg.Wait() }
}

// registerStoreRisk registers idemproxy_store_config_risk, every risk at
// 0: on every store, so that its series exist for the alert; only Redis'
// configuration is read (checkRedisConfig).
func registerStoreRisk(reg prometheus.Registerer) *prometheus.GaugeVec {
	risk := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_config_risk",
		Help: "1 when the store's configuration, read at start, risks losing keys: risk eviction (Redis maxmemory-policy is not noeviction) or no_persistence (Redis with neither AOF nor RDB). Redis only, where CONFIG GET is allowed; 0 otherwise.",
	}, []string{"risk"})
	reg.MustRegister(risk)
	for _, r := range redis.Risks {
		risk.WithLabelValues(r).Set(0)
	}
	return risk
}

// registerEpochMetrics exports the watcher's view, for the alert on a
// store that lost its keys.
func registerEpochMetrics(reg prometheus.Registerer, w *epoch.Watcher) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_store_epoch_changes_total",
			Help: "Times this replica saw the store's epoch marker missing or replaced: the store forgot its keys.",
		}, func() float64 { return float64(w.Changes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_store_keys_lost",
			Help: "1 while the store is marked as having lost its keys: protected routes answer 503 store-lost-keys until an operator accepts the loss.",
		}, func() float64 {
			if w.Status().State == epoch.Lost {
				return 1
			}
			return 0
		}),
	)
}

// checkRedisConfig warns, once at start, of a Redis configuration that
// forgets keys (an eviction policy, no persistence), where CONFIG GET is
// allowed, and exports it.
func (a *app) checkRedisConfig(risk *prometheus.GaugeVec, rs *redis.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), epochStartTimeout)
	defer cancel()
	risks, known, err := rs.ConfigRisks(ctx)
	switch {
	case err != nil:
		a.log.Warn("redis configuration not checked", "err", err)
		return
	case !known:
		a.log.Info("redis refuses CONFIG GET: its eviction policy and persistence were not checked")
		return
	}
	for _, r := range redis.Risks {
		if seen := risks[r]; seen != "" {
			risk.WithLabelValues(r).Set(1)
			a.log.Warn("redis may lose idempotency keys: a restart or eviction would let retries of answered requests through again "+
				"(the epoch marker detects it and refuses them until an operator accepts the loss)", "risk", r, "seen", seen)
		}
	}
}

// acceptLossFunc is the admin API's accept-loss over st (nil when st keeps
// no epoch marker): it writes the accepted marker, then has this replica's
// watcher adopt it at once.
func (a *app) acceptLossFunc(st storeCloser, slot *atomic.Pointer[epoch.Watcher]) func(context.Context, string, string) (*store.Epoch, *store.Epoch, error) {
	es, ok := st.(store.EpochStore)
	if !ok {
		return nil
	}
	return func(ctx context.Context, operator, reason string) (*store.Epoch, *store.Epoch, error) {
		var floor uint64 // the Gen this replica knows
		if w := slot.Load(); w != nil {
			if e := w.Status().Epoch; e != nil {
				floor = e.Gen
			}
		}
		old, acc, err := epoch.Accept(ctx, es, operator, reason, time.Now(), floor)
		if err == nil {
			if w := slot.Load(); w != nil {
				w.Kick()
			}
		}
		return old, acc, err
	}
}
