// Package epoch watches a store's epoch marker (store.EpochStore) for one
// replica, and says whether the replica may reserve keys on the store.
//
// A store that forgets its keys (a Redis restarted without persistence, a
// FLUSHALL, an eviction, a failover to a replica that never synced, a
// truncated PostgreSQL table, a Badger directory replaced by an empty one)
// would let every retry of an answered key through again: charged twice,
// silently. The marker is written beside the keys and disappears with
// them; a replica remembers the marker it trusts and checks it at start,
// every Options.Interval, when asked to (Kick: a new connection, a sign
// of a restart) and, where a backend can, on every new connection (Verify).
//
// The rules:
//
//   - A replica that finds no marker writes a new one (state new) and
//     trusts it only after Options.Grace, in which replicas that remember
//     an older epoch see it and object by marking the store lost; a
//     replica that finds another's new marker waits the grace too. With no
//     grace (a store no other replica shares: Badger), a new marker is
//     trusted at once.
//   - A replica that remembers epoch E and sees the marker missing or
//     replaced (other than by an operator's acceptance newer than E) marks
//     the store lost for everyone: it writes a marker in state lost, which
//     every replica, new or old, obeys.
//   - An operator's acceptance (a marker in state accepted with a higher
//     Gen) is adopted by every replica on its next check.
//
// While the replica is not OK, Err returns an error wrapping
// store.ErrKeysLost (lost, establishing) or errNotChecked (no check has
// succeeded yet), and the program refuses reservations with it.
package epoch

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// State is the replica's view of the store's epoch.
type State int

// The states of a Watcher.
const (
	// Unknown: no check has succeeded yet.
	Unknown State = iota
	// Establishing: the marker is new (this replica's or another's) and
	// its grace period has not ended.
	Establishing
	// OK: the replica trusts the marker: the store has the keys it had.
	OK
	// Lost: the store lost its keys; until an operator accepts the loss,
	// nothing is reserved.
	Lost
)

func (s State) String() string {
	switch s {
	case Establishing:
		return "establishing"
	case OK:
		return "ok"
	case Lost:
		return "lost"
	default:
		return "unknown"
	}
}

// errNotChecked is Err's error before the first check succeeded.
var errNotChecked = errors.New("the store's epoch marker has not been checked yet")

// Options configures New.
type Options struct {
	// Store holds the marker. Required.
	Store store.EpochStore
	// Interval is the time between two checks of Run. Required (positive).
	Interval time.Duration
	// Grace is how long a new marker waits for objections before it is
	// trusted; zero trusts it at once (a store no other replica shares).
	Grace time.Duration
	// Incarnation, when set, names the store's server process (Redis'
	// run_id, PostgreSQL's start time and address); it is read at each
	// check and logged when the epoch changes. Nil: not known.
	Incarnation func(ctx context.Context) (string, error)
	// OnTrust, when set, is called (with the watcher's lock held: it must
	// not call the watcher) with the ID of the epoch the replica trusts
	// whenever it changes, and with "" when it trusts none. A backend
	// that checks the epoch inside its reservations (Redis single node)
	// uses it.
	OnTrust func(id string)
	// Logger receives one line per transition; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Status is what a Watcher knows.
type Status struct {
	State State
	// Epoch is the marker the replica trusts (OK), waits on
	// (Establishing) or the lost marker (Lost); nil when Unknown.
	Epoch *store.Epoch
	// Reason says why the replica is not OK ("" when OK).
	Reason string
}

// Watcher holds one replica's view of the store's epoch. Its methods are
// safe for concurrent use.
type Watcher struct {
	opts Options
	log  *slog.Logger
	kick chan struct{}

	mu          sync.Mutex
	checking    sync.Mutex // one Check at a time
	state       State
	mine        *store.Epoch // see Status.Epoch
	until       time.Time    // the end of the grace, when Establishing
	reason      string
	incarnation string
	// prevIncarnation is the incarnation before the last change ("" for
	// none): a restart or failover, logged with a loss.
	prevIncarnation string

	changes atomic.Uint64
	// ok says that Err is nil, read without mu by every reservation
	// (noted keeps it in step with state).
	ok atomic.Bool

	// verified counts the losses Verify saw (a new connection's marker);
	// readAt is its value when the running Check read the marker. A
	// Check never trusts a marker read before a loss that Verify saw
	// meanwhile: the store may have forgotten it since (w.mu).
	verified, readAt uint64
}

// New returns a Watcher in state Unknown; Run (or Check) makes it look.
func New(opts Options) *Watcher {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	w := &Watcher{opts: opts, log: opts.Logger, kick: make(chan struct{}, 1), reason: errNotChecked.Error()}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.noted()
	return w
}

// noted sets ok from state, after every change of state (under mu).
func (w *Watcher) noted() {
	w.ok.Store(w.state == OK || w.state == Unknown && w.opts.Grace == 0)
}

// Err is nil when the replica may reserve keys on the store. Otherwise it
// wraps store.ErrKeysLost (lost, or a new marker in its grace period), or
// says that the marker has not been checked yet. A watcher without a
// grace (a store no other replica shares: Badger) has nothing to wait for
// before its first check: its Err is nil then, so that the store's own
// refusal answers (a disk below its floor, a store that could not open)
// and is counted as such; no other replica can have written to it, and
// its reservations check the marker themselves once one is trusted.
func (w *Watcher) Err() error {
	if w.ok.Load() {
		return nil // the reservations' path: no lock
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case OK:
		return nil
	case Unknown:
		if w.opts.Grace == 0 {
			return nil
		}
		return errNotChecked
	default:
		return fmt.Errorf("%w: %s", store.ErrKeysLost, w.reason)
	}
}

// Status returns the watcher's state.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := Status{State: w.state, Reason: w.reason}
	if w.mine != nil {
		e := *w.mine
		st.Epoch = &e
	}
	if w.state == OK {
		st.Reason = ""
	}
	return st
}

// Changes is how many times this replica saw the epoch it trusted missing
// or replaced: the store forgot its keys.
func (w *Watcher) Changes() uint64 { return w.changes.Load() }

// Kick asks Run for a check now (a new connection to the store, a sign
// that it restarted). It does not wait.
func (w *Watcher) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run checks at once, then every Interval and when kicked, until ctx ends.
// A failed check (the store unreachable) leaves the state as it is.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, max(w.opts.Interval, 5*time.Second))
		if err := w.Check(cctx); err != nil && ctx.Err() == nil {
			w.log.Debug("epoch check failed", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
		}
	}
}

// Verify judges the marker m read on a new connection to the store (nil:
// none). When the replica trusts an epoch that m contradicts, it turns
// the replica lost at once (the next check writes the lost marker for the
// others), kicks a check and returns an error wrapping store.ErrKeysLost:
// the caller fails the connection, so that nothing is reserved on it.
// Otherwise it returns nil.
func (w *Watcher) Verify(m *store.Epoch) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != OK || w.fits(m) {
		return nil
	}
	w.lose(m, w.mine, "seen on a new connection")
	w.verified++
	w.Kick()
	return fmt.Errorf("%w: %s", store.ErrKeysLost, w.reason)
}

// MarkLost turns the replica lost because something other than the marker
// showed that the store forgot keys it had: a canary missing before its
// TTL, a key this replica answered found free again, keys evicted. reason
// says what was seen; it becomes the lost marker's note, which every
// replica logs and shows on /readyz. The check it kicks writes the lost
// marker, so that every replica refuses reservations until an operator
// accepts the loss, exactly as for a marker gone missing. It reports
// whether the replica turned lost: a replica that trusts no epoch (lost
// already, establishing, not checked) reserves nothing anyway, and it
// returns false then.
func (w *Watcher) MarkLost(reason string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != OK {
		return false
	}
	w.changes.Add(1)
	attrs := []any{"trusted_epoch", w.mine.ID, "trusted_gen", w.mine.Gen}
	if w.incarnation != "" {
		attrs = append(attrs, "store_instance", w.incarnation)
	}
	attrs = append(attrs, "seen", reason)
	w.log.Error("the store lost keys: protected routes answer 503 store-lost-keys until an operator accepts the loss "+
		"(idemproxy store accept-loss); retries of keys answered before would be charged again", attrs...)
	lost := *w.mine
	lost.State = store.EpochLost
	w.state, w.mine, w.reason = Lost, &lost, reason
	w.noted()
	// A check that read the marker before this must not trust it again.
	w.verified++
	w.trust("")
	w.Kick()
	return true
}

// fits reports whether m is the trusted epoch or an acceptance to adopt.
func (w *Watcher) fits(m *store.Epoch) bool {
	return m != nil && (m.ID == w.mine.ID || (m.State == store.EpochAccepted && m.Gen > w.mine.Gen))
}

// Check reads the marker once and applies the rules (see the package
// documentation). An error reading or writing the marker leaves the state
// as it was.
func (w *Watcher) Check(ctx context.Context) error {
	w.checking.Lock()
	defer w.checking.Unlock()
	inc := ""
	if w.opts.Incarnation != nil {
		inc, _ = w.opts.Incarnation(ctx) // a diagnosis only
	}
	w.mu.Lock()
	w.readAt = w.verified
	w.mu.Unlock()
	m, err := w.opts.Store.Epoch(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	prevInc := w.incarnation
	if inc != "" && inc != w.incarnation {
		w.prevIncarnation, w.incarnation = w.incarnation, inc
	}
	w.mu.Unlock()
	// A write that loses a race returns the marker that won: judged again,
	// a few times at most.
	for range 4 {
		next, again, err := w.step(ctx, m, prevInc, inc)
		if err != nil || !again {
			return err
		}
		m = next
	}
	return nil
}

// step applies the rules to the marker m. It returns again (with the
// marker now in the store) when a write it attempted lost a race.
func (w *Watcher) step(ctx context.Context, m *store.Epoch, prevInc, inc string) (*store.Epoch, bool, error) {
	w.mu.Lock()
	state, mine, until := w.state, w.mine, w.until
	w.mu.Unlock()
	now := w.opts.Now()
	switch state {
	case Unknown:
		return w.fresh(ctx, m, now)
	case Establishing:
		switch {
		case m == nil:
			// The new marker vanished in its grace: the store forgot
			// again. Nothing was served on it; start over.
			return w.fresh(ctx, nil, now)
		case m.State == store.EpochLost:
			w.set(Lost, m, "another replica marked the store as lost: "+m.Note, "the store's keys are marked lost", slog.LevelError, prevInc, inc)
		case m.ID == mine.ID && m.State == store.EpochNew:
			if now.Before(until) {
				return nil, false, nil
			}
			est := *m
			est.State = store.EpochEstablished
			cur, ok, err := w.opts.Store.SwapEpoch(ctx, m.ID, est)
			if err != nil || !ok {
				return cur, err == nil, err
			}
			w.set(OK, &est, "", "new store epoch established: no replica objected", slog.LevelInfo, prevInc, inc)
		case m.State == store.EpochNew:
			w.wait(m, now)
		default: // established or accepted: another replica trusts it
			w.set(OK, m, "", "store epoch trusted", slog.LevelInfo, prevInc, inc)
		}
	case OK:
		switch {
		case m != nil && m.ID == mine.ID:
			w.mu.Lock()
			w.mine = m
			w.mu.Unlock()
		case m != nil && m.State == store.EpochAccepted && m.Gen > mine.Gen:
			w.set(OK, m, "", "store epoch accepted by an operator adopted", slog.LevelWarn, prevInc, inc)
		default: // missing, replaced, or marked lost by another replica
			w.mu.Lock()
			w.lose(m, mine, "")
			w.mu.Unlock()
			return w.markLost(ctx, m, prevInc, inc)
		}
	case Lost:
		switch {
		case m != nil && m.State == store.EpochAccepted && m.Gen > mine.Gen:
			w.set(OK, m, "", "the loss of the store's keys was accepted by an operator: serving again", slog.LevelWarn, prevInc, inc)
		default:
			return w.markLost(ctx, m, prevInc, inc)
		}
	}
	return nil, false, nil
}

// fresh judges m for a replica with no epoch of its own.
func (w *Watcher) fresh(ctx context.Context, m *store.Epoch, now time.Time) (*store.Epoch, bool, error) {
	switch {
	case m == nil:
		e := store.Epoch{ID: rand.Text(), State: store.EpochNew, Gen: NextGen(0, now), CreatedAt: now}
		if w.opts.Grace <= 0 {
			e.State = store.EpochEstablished
		}
		cur, ok, err := w.opts.Store.SwapEpoch(ctx, "", e)
		if err != nil || !ok {
			return cur, err == nil, err
		}
		if w.opts.Grace <= 0 {
			w.set(OK, &e, "", "new store epoch: the store had no marker", slog.LevelInfo, "", "")
		} else {
			w.wait(&e, now)
		}
	case m.State == store.EpochLost:
		w.set(Lost, m, "the store is marked as lost: "+m.Note, "the store's keys are marked lost", slog.LevelError, "", "")
	case m.State == store.EpochNew:
		w.wait(m, now)
	default:
		w.set(OK, m, "", "store epoch trusted", slog.LevelInfo, "", "")
	}
	return nil, false, nil
}

// wait enters Establishing on the new marker m.
func (w *Watcher) wait(m *store.Epoch, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == Establishing && w.mine != nil && w.mine.ID == m.ID {
		return
	}
	w.until = now.Add(w.opts.Grace)
	w.setLocked(Establishing, m, "a new epoch marker waits "+w.opts.Grace.String()+
		" for replicas that remember an older one to object", "new store epoch: waiting for other replicas to object",
		slog.LevelInfo, "", "")
}

// lose turns the replica lost in memory (lock held), having seen m where
// it trusted mine, and counts the change. The lost marker is written by
// markLost.
func (w *Watcher) lose(m, mine *store.Epoch, where string) {
	seen := "the marker is missing"
	if m != nil {
		seen = fmt.Sprintf("the marker is %s (state %s, gen %d), not %s", m.ID, m.State, m.Gen, mine.ID)
		if m.State == store.EpochLost {
			seen = "another replica marked the store as lost: " + m.Note
		}
	}
	if where != "" {
		seen += " (" + where + ")"
	}
	w.changes.Add(1)
	attrs := []any{"trusted_epoch", mine.ID, "trusted_gen", mine.Gen, "seen_epoch", "none"}
	if m != nil {
		attrs = append(attrs[:4], "seen_epoch", m.ID, "seen_state", string(m.State), "seen_gen", m.Gen)
	}
	attrs = append(attrs, "store_instance", w.incarnation)
	if w.prevIncarnation != "" {
		attrs = append(attrs, "previous_store_instance", w.prevIncarnation)
	}
	attrs = append(attrs, "seen", seen)
	w.log.Error("the store lost its keys: protected routes answer 503 store-lost-keys until an operator accepts the loss "+
		"(idemproxy store accept-loss); retries of keys answered before would be charged again", attrs...)
	lost := *mine
	lost.State = store.EpochLost
	w.state, w.mine, w.reason = Lost, &lost, seen
	w.noted()
	w.trust("")
}

// markLost writes a lost marker over m (nil: none) for every replica,
// unless m is one already.
func (w *Watcher) markLost(ctx context.Context, m *store.Epoch, prevInc, inc string) (*store.Epoch, bool, error) {
	w.mu.Lock()
	mine, reason := w.mine, w.reason
	w.mu.Unlock()
	if m != nil && m.State == store.EpochLost {
		w.mu.Lock()
		w.mine = m
		w.mu.Unlock()
		return nil, false, nil
	}
	old, gen := "", mine.Gen
	if m != nil {
		old, gen = m.ID, max(gen, m.Gen)
	}
	note := reason
	if inc != "" && prevInc != "" && inc != prevInc {
		note += "; store instance " + prevInc + " → " + inc
	}
	lost := store.Epoch{ID: rand.Text(), State: store.EpochLost, Gen: NextGen(gen, w.opts.Now()), CreatedAt: w.opts.Now(),
		Previous: mine.ID, Note: note}
	cur, ok, err := w.opts.Store.SwapEpoch(ctx, old, lost)
	if err != nil || !ok {
		return cur, err == nil, err
	}
	w.mu.Lock()
	w.mine = &lost
	w.mu.Unlock()
	return nil, false, nil
}

// set moves to state on epoch m, logging msg at level once per transition.
func (w *Watcher) set(state State, m *store.Epoch, reason, msg string, level slog.Level, prevInc, inc string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setLocked(state, m, reason, msg, level, prevInc, inc)
}

func (w *Watcher) setLocked(state State, m *store.Epoch, reason, msg string, level slog.Level, prevInc, inc string) {
	if state == OK && w.verified != w.readAt {
		// A new connection saw the store lose its keys after this
		// check read m: m is stale; the check Verify asked for reads
		// the marker again.
		return
	}
	same := w.state == state && w.mine != nil && w.mine.ID == m.ID
	old := w.mine
	w.state, w.mine, w.reason = state, m, reason
	w.noted()
	if state == OK {
		w.trust(m.ID)
	} else {
		w.trust("")
	}
	if same {
		return
	}
	attrs := []any{"state", state.String(), "epoch", m.ID, "epoch_state", string(m.State), "gen", m.Gen}
	if old != nil {
		attrs = append(attrs, "previous_epoch", old.ID)
	}
	if m.Note != "" {
		attrs = append(attrs, "note", m.Note)
	}
	if w.incarnation != "" {
		attrs = append(attrs, "store_instance", w.incarnation)
	}
	if prevInc != "" && inc != "" && prevInc != inc {
		attrs = append(attrs, "previous_store_instance", prevInc)
	}
	w.log.Log(context.Background(), level, msg, attrs...)
}

// trust tells OnTrust (lock held).
func (w *Watcher) trust(id string) {
	if w.opts.OnTrust != nil {
		w.opts.OnTrust(id)
	}
}

// NextGen is the Gen of a marker written at now over one of Gen floor:
// above floor, and at least now in Unix milliseconds, so that a marker
// written later has a higher Gen even when the writer did not see the
// one before it (an acceptance written before the lost marker was, on a
// store that forgot everything), unless clocks differ by more than the
// time between the two.
func NextGen(floor uint64, now time.Time) uint64 {
	return max(floor+1, uint64(max(now.UnixMilli(), 0)))
}

// Accept writes an accepted epoch over whatever marker the store has (an
// operator's acceptance of a loss): every replica adopts it on its next
// check and serves again. Its Gen is above the store's marker's and above
// floor (the Gen the caller's replica knows, 0 for none). It returns the
// marker it replaced (nil: none) and the new one.
func Accept(ctx context.Context, s store.EpochStore, operator, reason string, now time.Time, floor uint64) (old, accepted *store.Epoch, err error) {
	cur, err := s.Epoch(ctx)
	if err != nil {
		return nil, nil, err
	}
	for range 8 {
		e := store.Epoch{ID: rand.Text(), State: store.EpochAccepted, Gen: NextGen(floor, now), CreatedAt: now,
			Note: "accepted by " + cmp.Or(operator, "an unnamed operator")}
		if reason != "" {
			e.Note += ": " + reason
		}
		id := ""
		if cur != nil {
			id, e.Gen, e.Previous = cur.ID, NextGen(max(floor, cur.Gen), now), cur.ID
		}
		next, ok, err := s.SwapEpoch(ctx, id, e)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			return cur, &e, nil
		}
		cur = next
	}
	return nil, nil, errors.New("the epoch marker kept changing; try again")
}

// Gate returns s with its reservations refused while w is not OK: Reserve
// returns w.Err() without asking the store, so nothing is written and
// nothing forwarded. Every other method passes through (the answers of
// requests already forwarded are still stored). The result is a
// store.ReconcileStore when s is one.
func Gate(s store.Store, w *Watcher) store.Store {
	g := gated{Store: s, w: w}
	if rs, ok := s.(store.ReconcileStore); ok {
		return gatedReconcile{gated: g, ReconcileStore: rs}
	}
	return g
}

type gated struct {
	store.Store
	w *Watcher
}

// Reserve implements store.Store.
func (g gated) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	if err := g.w.Err(); err != nil {
		return nil, err
	}
	return g.Store.Reserve(ctx, key, res)
}

type gatedReconcile struct {
	gated
	store.ReconcileStore
}
