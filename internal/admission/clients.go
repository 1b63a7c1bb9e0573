package admission

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// resetWindow is how many seconds of server.max_client_resets_per_second
// a client may reset at once before it counts as resetting: its reset
// level drains at that rate, and past rate × resetWindow the client is
// refused until it drains below half of that. The level is capped at one
// and a half times rate × resetWindow, so a client that stops resetting
// is served again at most resetWindow seconds later.
const resetWindow = 10

// A client's resets are judged against the requests it is served, as
// Envoy's premature-reset check does (it closes a connection when more
// than half its streams were reset early): a gateway or
// mesh proxy speaks for many users, and the streams they cancel are
// resets at a rate that grows with the traffic it carries. So, besides the
// reset level above, each client keeps its resets and the streams it
// opened (requests admitted by its per-client limits, a handler run for
// each) over the last resetWindow seconds, each decayed exponentially with
// that time constant.
//
// A client is refused for its resets only when its level passes
// rate × resetWindow AND its resets are more than resetShare of the
// streams it opened: a client that resets nearly every stream it opens
// (rapid reset) is refused as before, while a gateway whose users cancel
// 6 % of 2,000 requests a second (120 resets a second, over the rate) is
// not. An attacker who pads each reset with one served request stays at
// resetShare exactly and is not refused, but every reset then costs it a
// request that the proxy serves in full (admitted by
// server.max_requests_per_client, held through the upstream's answer):
// its resets are bounded by the requests it is served, so the attack
// causes at most twice the work of an ordinary client's traffic, held to
// max_requests_per_client in flight.
const resetShare = 0.5

// minShedResets is the fewest resets (over the last resetWindow seconds) a
// client must have for its connections to be closed in favour of another
// client's stream at server.max_connections in flight; it must also pass
// resetShare. A client with one stray cancellation is never shed.
const minShedResets = 10

// maxResetClients bounds the clients whose resets are remembered while
// they hold no connection: past it, such a client's entry takes the place
// of another's that holds nothing (an attacker with many addresses can
// thin out what is remembered of its own addresses, not grow it).
const maxResetClients = 4096

// Reasons a client's request or connection is refused by the per-client
// limits, the reason label of idemproxy_client_streams_refused_total.
const (
	refusedStreams = "streams" // server.max_requests_per_client requests in flight
	refusedResets  = "resets"  // the client resets streams faster than server.max_client_resets_per_second
	refusedShed    = "shed"    // requests in flight at server.max_connections: the client with the most resets gave way
)

// clientRefusalReasons lists every refusal reason, in documentation order.
var clientRefusalReasons = []string{refusedStreams, refusedResets, refusedShed}

// clientTable keeps, per client (one IPv4 address, one IPv6 /64, as the
// buffer share counts them: ClientOf), its open connections, its
// requests in flight and how fast it resets HTTP/2 streams. An entry lives
// while the client holds a connection, and after that only while its
// reset level has not drained, among at most maxResetClients such
// entries: the table holds at most server.max_connections + 1 +
// maxResetClients entries.
type clientTable struct {
	maxRequests atomic.Int64 // server.max_requests_per_client; <= 0: no cap
	resetRate   atomic.Int64 // server.max_client_resets_per_second; <= 0: resets are not limited

	mu      sync.Mutex
	clients map[string]*clientEntry
	idle    int          // entries without a connection
	worst   *clientEntry // the client last seen with the highest reset level, a candidate to shed
	now     func() time.Time

	refused [3]atomic.Uint64 // by clientRefusalReasons index
	resets  atomic.Uint64    // RST_STREAM frames received from clients
}

type clientEntry struct {
	id       string
	conns    map[*trackedConn]struct{}
	inFlight int64
	level    float64   // resets, drained at resetRate a second since at
	at       time.Time // when level was last drained
	flagged  bool      // level passed the window: refused until it drains below half of it
	resets   float64   // resets over the last resetWindow seconds, decayed since at
	streams  float64   // streams opened over the last resetWindow seconds, decayed since at
}

// decay is the factor that the resets and streams counts of an entry last
// brought to at are multiplied by at now.
func decay(at, now time.Time) float64 {
	if at.IsZero() || !now.After(at) {
		return 1
	}
	return math.Exp(-now.Sub(at).Seconds() / resetWindow)
}

// abusive reports whether resets, out of streams opened over the same
// window, are more than resetShare of them.
func abusive(resets, streams float64) bool {
	return resets > resetShare*streams
}

func newClientTable(now func() time.Time) *clientTable {
	return &clientTable{clients: make(map[string]*clientEntry), now: now}
}

func (t *clientTable) countRefused(reason string) {
	for i, r := range clientRefusalReasons {
		if r == reason {
			t.refused[i].Add(1)
		}
	}
}

// entry returns client's entry, made if absent. t.mu is held.
func (t *clientTable) entry(client string) *clientEntry {
	e := t.clients[client]
	if e == nil {
		e = &clientEntry{id: client, conns: make(map[*trackedConn]struct{})}
		t.clients[client] = e
		t.idle++
	}
	return e
}

// drain brings e's reset level to now, and says whether the client is
// refused for its resets. t.mu is held.
func (t *clientTable) drain(e *clientEntry, now time.Time) bool {
	f := decay(e.at, now)
	e.resets *= f
	e.streams *= f
	rate := float64(t.resetRate.Load())
	if rate <= 0 {
		e.level, e.flagged, e.at = 0, false, now
		return false
	}
	if e.level > 0 {
		e.level = math.Max(0, e.level-rate*now.Sub(e.at).Seconds())
	}
	e.at = now
	if e.flagged && e.level <= rate*resetWindow/2 {
		e.flagged = false
	}
	return e.flagged
}

// forget deletes e if it holds nothing and remembers no resets. t.mu is
// held.
func (t *clientTable) forget(e *clientEntry) {
	if len(e.conns) > 0 || e.inFlight > 0 || e.level > 0 {
		return
	}
	if t.clients[e.id] == e {
		delete(t.clients, e.id)
		t.idle--
	}
	if t.worst == e {
		t.worst = nil
	}
}

// trim keeps at most maxResetClients entries without a connection: past
// it, it drops those whose level has drained, then others holding nothing,
// down to three quarters of the bound (so that trimming is rare). t.mu is
// held.
func (t *clientTable) trim(now time.Time) {
	if t.idle <= maxResetClients {
		return
	}
	for pass := 0; pass < 2 && t.idle > maxResetClients*3/4; pass++ {
		for _, e := range t.clients {
			if len(e.conns) > 0 || e.inFlight > 0 {
				continue
			}
			if t.drain(e, now); pass == 0 && e.level > 0 {
				continue
			}
			delete(t.clients, e.id)
			t.idle--
			if t.worst == e {
				t.worst = nil
			}
			if t.idle <= maxResetClients*3/4 {
				return
			}
		}
	}
}

// admit registers c, a connection just accepted from client, or reports
// that the client is refused for its resets (the caller closes c).
func (t *clientTable) admit(client string, c *trackedConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(client)
	if t.drain(e, t.now()) {
		t.forget(e)
		return false
	}
	if len(e.conns) == 0 {
		t.idle--
	}
	e.conns[c] = struct{}{}
	c.client = e
	return true
}

// closed unregisters c.
func (t *clientTable) closed(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := c.client
	if e == nil {
		return
	}
	if _, ok := e.conns[c]; !ok {
		return
	}
	delete(e.conns, c)
	if len(e.conns) == 0 {
		t.idle++
		t.forget(e)
		t.trim(t.now())
	}
}

// start counts a request of client in flight, and as a stream it opened
// (what its resets are judged against), or returns why it is refused:
// refusedResets (the client resets too fast), refusedStreams (it has
// max_requests_per_client in flight; a refused request is not counted as
// a stream). A request that starts must be ended by end.
func (t *clientTable) start(e *clientEntry) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.drain(e, t.now()) {
		return refusedResets
	}
	if max := t.maxRequests.Load(); max > 0 && e.inFlight >= max {
		return refusedStreams
	}
	e.inFlight++
	e.streams++
	return ""
}

// end ends a request started by start.
func (t *clientTable) end(e *clientEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.inFlight--
	t.forget(e)
}

// reset counts n streams that e reset (RST_STREAM frames it sent), and
// returns e's connections to close if e now resets too fast: its level
// passed rate × resetWindow and its resets are more than resetShare of
// the streams it opened.
func (t *clientTable) reset(e *clientEntry, n int) []*trackedConn {
	t.resets.Add(uint64(n))
	rate := float64(t.resetRate.Load())
	if rate <= 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.drain(e, now)
	e.level = math.Min(e.level+float64(n), 1.5*rate*resetWindow)
	e.resets += float64(n)
	if t.sheddable(e, now) {
		if w := t.worst; w == nil || w == e || !t.sheddable(w, now) || e.resets > w.resets*decay(w.at, now) {
			t.worst = e
		}
	}
	if e.flagged || e.level <= rate*resetWindow || !abusive(e.resets, e.streams) {
		return nil
	}
	e.flagged = true
	shed := make([]*trackedConn, 0, len(e.conns))
	for c := range e.conns {
		shed = append(shed, c)
	}
	return shed
}

// sheddable reports whether e may give way to another client's stream at
// max_connections in flight: over the last resetWindow seconds it reset
// at least minShedResets streams, more than resetShare of those it opened.
// It does not change e. t.mu is held.
func (t *clientTable) sheddable(e *clientEntry, now time.Time) bool {
	f := decay(e.at, now)
	return e.resets*f >= minShedResets && abusive(e.resets*f, e.streams*f)
}

// victim returns the connections of the client to shed so that a request
// of e's may take a slot when max requests are in flight: the client that
// reset the most streams lately, if it is sheddable (its resets a real
// share of its streams, not a stray cancellation), resets more than e and
// has a request in flight. It returns nil when there is none.
func (t *clientTable) victim(e *clientEntry) []*trackedConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.worst
	if w == nil || w == e || w.inFlight == 0 || len(w.conns) == 0 {
		return nil
	}
	now := t.now()
	if !t.sheddable(w, now) || w.resets*decay(w.at, now) <= e.resets*decay(e.at, now) {
		return nil
	}
	t.worst = nil // the next reset names the next candidate
	shed := make([]*trackedConn, 0, len(w.conns))
	for c := range w.conns {
		shed = append(shed, c)
	}
	return shed
}

// refusing reports whether client is refused for its resets now.
func (t *clientTable) refusing(client string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.clients[client]
	if e == nil {
		return false
	}
	refused := t.drain(e, t.now())
	t.forget(e)
	return refused
}

// size returns the entries held, for tests.
func (t *clientTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.clients)
}
