package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/keyspace"
	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// keyspaceTimeout bounds one check of the keyspaces (internal/keyspace):
// a registry read and a few listings of one key.
const keyspaceTimeout = 10 * time.Second

// keyspaceInterval is the least time between two periodic checks of the
// keyspaces (store.epoch_check_interval, when longer): on Redis a
// keyspace without live keys is a SCAN of the database.
const keyspaceInterval = 10 * time.Second

// keyspaces runs the checks of the routes' keyspaces against the store's
// registry: at start, at every reload (reload), after a drop-keyspace and
// every keyspaceInterval (or store.epoch_check_interval, when longer; every
// store.epoch_check_interval until one succeeded). It holds the routes
// whose keys would be made anew in a keyspace with live keys
// (proxy.Hold), and records the keyspaces of the others.
type keyspaces struct {
	a  *app
	st keyspace.Store
	// last is the last check's result; nil before one succeeded.
	last atomic.Pointer[keyspace.Result]
	// logged is the text of the findings last logged, so that the
	// periodic check logs a change once; guarded by mu.
	mu     sync.Mutex
	logged string
	kick   chan struct{}
	// checking serialises the checks (check).
	checking sync.Mutex
	// pending is set until the keyspaces of the configuration started or
	// reloaded are recorded; held (guarded by checking) names the
	// keyspaces the last check held. A check records only those two: a
	// keyspace an operator dropped while a route still claims it stays
	// dropped until the next start or reload.
	pending atomic.Bool
	held    map[string]bool
}

// startKeyspaces checks the keyspaces of the running configuration once,
// then every interval until the function it returns is called; nil when
// st keeps no registry.
func (a *app) startKeyspaces(st storeCloser, interval time.Duration) (*keyspaces, func()) {
	ks, ok := st.(keyspace.Store)
	if !ok {
		return nil, func() {}
	}
	k := &keyspaces{a: a, st: ks, kick: make(chan struct{}, 1)}
	k.pending.Store(true)
	k.check()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			// Until a check succeeded (a store that did not answer at
			// start), every interval: a route renamed is held soon
			// after the store answers.
			wait := max(interval, keyspaceInterval)
			if k.last.Load() == nil {
				wait = interval
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-k.kick:
				t.Stop()
			}
			k.check()
		}
	}()
	return k, func() { cancel(); <-done }
}

// rerecord asks for a check that records the running configuration's
// keyspaces, as at a start: the store may have lost its registry with its
// keys (a loss an operator accepted). It does not wait.
func (k *keyspaces) rerecord() {
	if k == nil {
		return
	}
	k.pending.Store(true)
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// check checks the running configuration: it holds the routes of the
// findings and logs them, unless a reload swapped another configuration
// in meanwhile (that reload checked its own), then records what is due.
// Only the store's calls run without a.mu; checks run one at a time.
func (k *keyspaces) check() {
	k.checking.Lock()
	defer k.checking.Unlock()
	k.a.mu.Lock()
	cfg := k.a.cfg
	k.a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), keyspaceTimeout)
	defer cancel()
	res, err := keyspace.Check(ctx, k.st, cfg.Routes, time.Now())
	if err != nil {
		k.note(fmt.Sprintf("not checked: %v", err), func() {
			k.a.log.Warn("the routes' keyspaces could not be checked against the store's registry; checked again within 10 s (or store.epoch_check_interval)", "err", err)
		})
		return
	}
	k.a.mu.Lock()
	current := k.a.cfg == cfg
	if current {
		k.hold(res)
	}
	k.a.mu.Unlock()
	if !current {
		return
	}
	pending := k.pending.Load()
	if !pending {
		res.Record = slices.DeleteFunc(res.Record, func(e store.Keyspace) bool { return !k.held[e.Name] })
	}
	if err := keyspace.Record(ctx, k.st, res); err != nil {
		k.a.log.Warn("the routes' keyspaces could not be recorded in the store's registry; recorded at the next check", "err", err)
		return
	}
	k.pending.CompareAndSwap(pending, false)
	k.held = map[string]bool{}
	for _, f := range res.Findings {
		k.held[f.Keyspace] = true
	}
}

// hold holds the routes of res's findings, and logs the findings once.
// The caller holds a.mu.
func (k *keyspaces) hold(res keyspace.Result) {
	k.last.Store(&res)
	k.a.p.Hold(res.Held())
	text := ""
	if err := res.Err(); err != nil {
		text = err.Error()
	}
	k.note(text, func() {
		for _, f := range res.Findings {
			k.a.log.Error("keyspace held: its keys would be made anew while the store holds live keys made before; "+
				"the route answers 503 keyspace-held until an operator decides",
				"route", f.Route, "keyspace", f.Keyspace, "reason", f.Reason(), "fix", f.Fix())
		}
		if len(res.Findings) == 0 {
			k.a.log.Info("keyspaces checked: every route's keyspace and key recipe agree with the store's registry")
		}
	})
}

// note calls log when text differs from what was noted last.
func (k *keyspaces) note(text string, log func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if text != k.logged {
		k.logged = text
		log()
	}
}

// reload checks cfg, the configuration a reload would swap in, and
// returns why it must not be; the caller holds a.mu and calls applied
// once it swapped cfg in. A store that cannot be read refuses a reload
// that changes a keyspace or a key recipe, and lets any other through.
func (k *keyspaces) reload(old, cfg *config.Config) (applied func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), keyspaceTimeout)
	defer cancel()
	res, err := keyspace.Check(ctx, k.st, cfg.Routes, time.Now())
	if err != nil {
		if claims(old) != claims(cfg) {
			return nil, fmt.Errorf("the routes' keyspaces could not be checked against the store's registry (%w), "+
				"and this configuration changes a keyspace or a key recipe: reload again once the store answers", err)
		}
		return func() {}, nil
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("keyspace held: %w", err)
	}
	// Recorded by the next check, at once: the caller holds a.mu.
	return func() {
		k.hold(res)
		k.pending.Store(true)
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}, nil
}

// claims is what a configuration claims of keyspaces, to compare two.
func claims(c *config.Config) string {
	var s []string
	for _, r := range c.Routes {
		s = append(s, r.Keyspace+" "+r.KeyRecipe())
	}
	slices.Sort(s)
	return fmt.Sprint(s)
}

// ready is /readyz's check: the findings of the last check.
func (k *keyspaces) ready() error {
	if k == nil {
		return nil
	}
	if res := k.last.Load(); res != nil {
		if err := res.Err(); err != nil {
			return fmt.Errorf("keyspace-held: %w", err)
		}
	}
	return nil
}

// dropFunc is the admin API's drop-keyspace (drop); nil without a
// registry.
func (k *keyspaces) dropFunc() func(context.Context, string) (store.Keyspace, error) {
	if k == nil {
		return nil
	}
	return k.drop
}

// drop is the admin API's drop-keyspace: it removes the keyspace from the
// registry, then checks again at once (the routes it held serve). A
// keyspace that a running route claims is not recorded again until the
// next start or reload, so that a reload that leaves it is accepted.
func (k *keyspaces) drop(ctx context.Context, name string) (store.Keyspace, error) {
	all, err := k.st.Keyspaces(ctx)
	if err != nil {
		return store.Keyspace{}, err
	}
	i := slices.IndexFunc(all, func(e store.Keyspace) bool { return e.Name == name })
	if i < 0 {
		return store.Keyspace{}, admin.ErrNoKeyspace
	}
	found, err := k.st.DropKeyspace(ctx, name)
	if err != nil {
		return store.Keyspace{}, err
	}
	if !found {
		return store.Keyspace{}, admin.ErrNoKeyspace
	}
	k.check()
	return all[i], nil
}

// CheckKeyspaces is -check's look at the store: it opens the configured
// store, checks the routes' keyspaces against its registry and writes to
// w (as -check's other lines: "idemproxy: FILE: ...") each route that
// would start a keyspace anew, without writing to the registry. It
// returns false when there is one. A store it cannot read (or a Badger
// directory a running proxy holds) is a warning, and no failure; a
// Badger directory that does not exist yet holds no keys.
func CheckKeyspaces(ctx context.Context, cfg *config.Config, path string, getenv func(string) string, w io.Writer) bool {
	if b := cfg.Store.Badger; b != nil {
		if _, err := os.Stat(b.Dir); errors.Is(err, fs.ErrNotExist) {
			return true
		}
	}
	notChecked := func(err error) bool {
		fmt.Fprintf(w, "idemproxy: %s: warning: the routes' keyspaces were not checked against the store's registry: %v\n", path, err)
		return true
	}
	log := slog.New(slog.DiscardHandler)
	a := &app{log: log, cfg: cfg, getenv: getenv, path: path, settler: settle.New(log)}
	defer func() {
		now, cancel := context.WithCancel(context.Background())
		cancel()
		a.settler.Close(now)
	}()
	st, name, err := a.openStore(prometheus.NewRegistry())
	if err != nil {
		return notChecked(err)
	}
	defer st.Close()
	if g, ok := st.(*badger.Guard); ok && g.OpenFailed() != nil {
		return notChecked(g.OpenFailed())
	}
	ks, ok := st.(keyspace.Store)
	if !ok {
		return notChecked(fmt.Errorf("the %s store keeps no registry", name))
	}
	ctx, cancel := context.WithTimeout(ctx, keyspaceTimeout)
	defer cancel()
	res, err := keyspace.Check(ctx, ks, cfg.Routes, time.Now())
	if err != nil {
		return notChecked(err)
	}
	for _, f := range res.Findings {
		fmt.Fprintf(w, "idemproxy: %s: keyspace held: %s\n", path, f.Error())
	}
	return len(res.Findings) == 0
}
