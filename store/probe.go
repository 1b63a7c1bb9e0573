package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProbeRoute is the route part of the write probe's keys. Route names are
// [A-Za-z0-9._-]{1,64}, so no route's key can begin with it, and the
// listing of a route, which reads keys beginning with "name/", never sees
// a probe key.
const ProbeRoute = "~probe"

// Defaults of ProbeOptions.
const (
	defaultProbeInterval = 2 * time.Second
	defaultProbeTimeout  = 2 * time.Second
)

// ProbeOptions configures NewWriteProbe. Zero values mean the defaults.
type ProbeOptions struct {
	// Interval is the time between the end of a probe and the start of the
	// next.
	Interval time.Duration
	// Timeout bounds one probe: a store that has not answered within it
	// has failed it, and so has one whose probe has been running longer.
	Timeout time.Duration
}

// WriteProbe tells whether the store takes writes now, as a protected
// request needs: every Interval it pings the store, reserves a key of its
// own (ProbeRoute/-/ and a random id of this process) and releases it,
// through the ordinary Store interface, so that a store that answers
// pings but refuses or stalls writes (PostgreSQL waiting for a missing
// synchronous standby, Redis under CLIENT PAUSE WRITE, Badger below its
// disk floor) is seen by every backend alike. Err reads the verdict
// without touching the store.
//
// A probe record left behind by a failed release (the store stalled) is
// released by the next probe, fenced by its token, or expires within a
// minute; its lease of 30 seconds keeps it from ever being in doubt for
// long, and no route's listing or reconciliation sees it.
type WriteProbe struct {
	s    Store
	opts ProbeOptions
	key  string

	mu      sync.Mutex
	err     error     // the verdict: the error of the latest write seen; nil: it wrote
	at      time.Time // when the write that gave the verdict started
	done    bool      // a probe has ended
	running time.Time // when the running probe started; zero: none runs

	failures atomic.Uint64
}

// NewWriteProbe returns a probe of s; Run runs it.
func NewWriteProbe(s Store, opts ProbeOptions) *WriteProbe {
	if opts.Interval <= 0 {
		opts.Interval = defaultProbeInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultProbeTimeout
	}
	return &WriteProbe{s: s, opts: opts, key: Key(ProbeRoute, "", randomID())}
}

func randomID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Run probes the store every Interval until ctx is done.
func (p *WriteProbe) Run(ctx context.Context) {
	for {
		p.Probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.opts.Interval):
		}
	}
}

// Probe runs one probe now and returns its error.
func (p *WriteProbe) Probe(ctx context.Context) error {
	start := time.Now()
	p.mu.Lock()
	p.running = start
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	err := p.write(ctx)
	if err != nil {
		p.failures.Add(1)
	}
	p.mu.Lock()
	p.verdictLocked(err, start)
	p.done, p.running = true, time.Time{}
	p.mu.Unlock()
	return err
}

// verdictLocked makes err, of a write that started at start, the verdict,
// unless a write that started later gave it already: a reservation that
// succeeded just before the disk filled but reports after a later one
// failed is older news (p.mu held).
func (p *WriteProbe) verdictLocked(err error, start time.Time) {
	if start.Before(p.at) {
		return
	}
	p.err, p.at = err, start
}

// write pings the store (a store below its floor refuses there, without
// counting a refused reservation), then reserves the probe key and
// releases it.
func (p *WriteProbe) write(ctx context.Context) error {
	if err := p.s.Ping(ctx); err != nil {
		return err
	}
	token := randomID()
	rec, err := p.s.Reserve(ctx, p.key, Reservation{Token: token, Fingerprint: "probe", Lease: 30 * time.Second, TTL: time.Minute})
	if errors.Is(err, ErrKeysLost) {
		// The store answered and refused on purpose: it lost its keys,
		// which the epoch watcher reports; its writes are not failing.
		return nil
	}
	if err != nil {
		return fmt.Errorf("writes fail: reserve of a probe key: %w", err)
	}
	if rec != nil {
		// An earlier probe's record, whose release failed or whose
		// reservation was applied after its caller gave up: releasing it
		// is a write too.
		token = rec.Token
	}
	if err := p.s.Release(ctx, p.key, token); err != nil {
		return fmt.Errorf("writes fail: release of a probe key: %w", err)
	}
	return nil
}

// Observe returns s with the outcomes of its reservations reported to p:
// a reservation that fails (other than by its caller's cancellation) makes
// the verdict that failure at once, and one that succeeds makes it ready,
// until the next probe says otherwise. So the verdict follows the real
// traffic between probes. A ReconcileStore stays one.
func (p *WriteProbe) Observe(s Store) Store {
	o := observed{Store: s, p: p}
	if rs, ok := s.(ReconcileStore); ok {
		return observedReconcile{o, rs}
	}
	return o
}

// observed is a Store whose reservations' outcomes go to its probe.
type observed struct {
	Store
	p *WriteProbe
}

func (o observed) Reserve(ctx context.Context, key string, res Reservation) (*Record, error) {
	start := time.Now()
	rec, err := o.Store.Reserve(ctx, key, res)
	// A client that went away says nothing of the store; a store that
	// lost its keys refuses on purpose (the epoch watcher reports it), and
	// an origin too long is its caller's mistake.
	if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrKeysLost) && !errors.Is(err, ErrOriginTooLong) {
		o.p.observe(err, start)
	}
	return rec, err
}

type observedReconcile struct {
	observed
	ReconcileStore
}

// observe sets the verdict to the outcome of a real reservation that
// started at start.
func (p *WriteProbe) observe(err error, start time.Time) {
	if err != nil {
		err = fmt.Errorf("writes fail: a reservation failed: %w", err)
	}
	p.mu.Lock()
	if p.done || err != nil {
		p.verdictLocked(err, start)
		p.done = true
	}
	p.mu.Unlock()
}

// Err returns the verdict: nil when the last probe (or real reservation,
// see Observe) wrote, its error when it failed, an error when the running probe has taken longer than
// Timeout (a store that ignores its deadline), and nil before the first
// probe has ended.
func (p *WriteProbe) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running.IsZero() {
		if d := time.Since(p.running); d > p.opts.Timeout {
			return fmt.Errorf("writes stall: no answer to a write probe for %s", d.Round(time.Millisecond))
		}
	}
	if !p.done {
		return nil
	}
	return p.err
}

// Ready reports whether a probe has ended, so that Err is a verdict.
func (p *WriteProbe) Ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Failures returns the probes that failed so far.
func (p *WriteProbe) Failures() uint64 { return p.failures.Load() }

// RegisterProbeMetrics registers the verdict of the write probe p on reg
// (idemproxy_store_writable, which /readyz agrees with, and its failures),
// read from p when scraped.
func RegisterProbeMetrics(reg prometheus.Registerer, p *WriteProbe) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_store_writable",
			Help: "1 when the store takes writes: the last write probe (a reserve and release of a key of its own, every 2 s) or real reservation since succeeded; 0 when it failed or a probe stalls: /readyz is 503 then.",
		}, func() float64 {
			if p.Err() != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_store_write_probe_failures_total",
			Help: "Write probes of the store that failed or timed out (2 s).",
		}, func() float64 { return float64(p.Failures()) }),
	)
}
