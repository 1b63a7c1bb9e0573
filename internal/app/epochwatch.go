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
	ex, _ := st.(interface{ ExpectEpoch(string) })
	rs, _ := st.(*redis.Store)
	// had: the replica trusted an epoch; lost: then none (OnTrust runs
	// under the watcher's lock).
	var had, lost bool
	opts.OnTrust = func(id string) {
		if ex != nil {
			ex.ExpectEpoch(id)
		}
		switch {
		case id == "":
			lost = had
		case lost:
			// A loss accepted: the evictions that were part of it
			// are not a new one, and the registry of keyspaces may
			// have gone with the keys: the running routes record
			// theirs again, so that a rename after the loss is
			// still refused.
			if rs != nil {
				rs.AcceptEvictions()
			}
			if k := a.ksOnTrust.Load(); k != nil {
				k.rerecord()
			}
			fallthrough
		default:
			had, lost = true, false
		}
		if f := a.onTrust.Load(); f != nil {
			(*f)(id)
		}
	}
	w := epoch.New(opts)
	slot.Store(w)
	registerEpochMetrics(reg, w)
	registerStoreRisk(reg, rs)
	if rs != nil {
		a.checkRedisSettings(ctx, rs)
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
	if rs != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs.WatchSettings(ctx, interval)
		}()
	}
	ready := func() error {
		if a.storeOptional() {
			return nil
		}
		err := w.Err()
		if err == nil {
			if rs != nil {
				if err := rs.SettingsErr(); err != nil {
					return fmt.Errorf("store-unsafe-settings: %w", err)
				}
			}
			return nil
		}
		if st := w.Status(); st.State != epoch.Unknown {
			return fmt.Errorf("store-lost-keys (%s): %w", st.State, err)
		}
		return err
	}
	return epoch.Gate(st, w), ready, func() { cancel(); wg.Wait() }
}

// registerStoreRisk registers idemproxy_store_config_risk and
// idemproxy_store_config_risk_allowed, every risk: on every store, so that
// their series exist for the alert; only Redis' settings are read (rs;
// nil for another store: 0).
func registerStoreRisk(reg prometheus.Registerer, rs *redis.Store) {
	for _, r := range redis.Risks {
		labels := prometheus.Labels{"risk": r}
		allowed := 0.0
		if rs != nil && rs.Allowed(r) {
			allowed = 1
		}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "idemproxy_store_config_risk",
				Help:        "1 while the store runs with a setting that may lose keys, as its checks (every store.epoch_check_interval, on each new connection, on every master) last saw it: risk eviction (Redis maxmemory above 0 with a maxmemory-policy other than noeviction) or no_persistence (Redis with neither AOF nor RDB snapshots). Protected routes answer 503 store-unsafe-settings meanwhile, unless idemproxy_store_config_risk_allowed is 1. Redis only; 0 otherwise.",
				ConstLabels: labels,
			}, func() float64 {
				if rs != nil && rs.Risks()[r] != "" {
					return 1
				}
				return 0
			}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "idemproxy_store_config_risk_allowed",
				Help:        "1 when the configuration opts in to the risk (store.redis.allow_eviction, store.redis.allow_no_persistence): protected requests are served while it is seen. Redis only; 0 otherwise.",
				ConstLabels: labels,
			}, func() float64 { return allowed }),
		)
	}
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

// checkRedisSettings logs the operator's opt-ins to settings that lose
// keys, at every start, and checks Redis' settings once before the proxy
// serves (rs logs what it sees).
func (a *app) checkRedisSettings(ctx context.Context, rs *redis.Store) {
	r := a.cfg.Store.Redis
	for _, o := range []struct {
		on         bool
		field, why string
	}{
		{r.AllowEviction, "store.redis.allow_eviction", "a maxmemory-policy that evicts records is accepted: an eviction lets retries of answered requests through until it is seen (then the store is marked lost)"},
		{r.AllowNoPersistence, "store.redis.allow_no_persistence", "a Redis without AOF or RDB snapshots is accepted: a restart forgets every key (the epoch marker then refuses protected requests until an operator accepts the loss)"},
	} {
		if o.on {
			a.log.Warn("redis settings that may lose idempotency keys are allowed by the configuration", "field", o.field, "risk", o.why)
		}
	}
	if r.SkipEvictionCheck {
		a.log.Warn("redis settings are not checked (store.redis.skip_eviction_check): an eviction policy or no persistence would not be refused, and evictions not seen")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, epochStartTimeout)
	defer cancel()
	if err := rs.CheckSettings(cctx); err != nil {
		a.log.Warn("redis settings not checked at start: checked again every store.epoch_check_interval", "err", err)
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
