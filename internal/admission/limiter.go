package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/problem"
)

// newConnGrace is how long a new connection may stay silent before it can
// be shed: a client that has just connected is about to send its request,
// and shedding it for the next newcomer would only trade one client for
// another.
const newConnGrace = time.Second

// recheckEvery is how often an Accept that waits at the limit looks again
// for a connection that has become sheddable without an event (a silent
// new one past its grace, a header that takes longer than
// read_header_timeout).
const recheckEvery = 100 * time.Millisecond

// h2Preface starts every HTTP/2 connection made with prior knowledge.
var h2Preface = []byte("PRI * HTTP/2.0")

// Limiter bounds the client connections open at once and, when the
// bound is reached, makes room for a new client by closing the connection
// that has waited longest for a request (as nginx and Envoy do):
//
//   - A keep-alive connection between two requests (http.StateIdle), or an
//     HTTP/2 connection with no open stream, can be shed at once.
//   - A new connection that has sent nothing can be shed after
//     newConnGrace.
//   - A connection that has started to send a request but not yet its
//     whole header can be shed once the header has taken longer than
//     read_header_timeout.
//   - A connection whose request is being served (http.StateActive, an
//     HTTP/2 connection with at least one stream) or that was hijacked (a
//     passthrough WebSocket) is never shed.
//
// Accept takes the next connection from the kernel and holds it (the one
// connection above the bound) until it has a slot: at once if one is free,
// after shedding if a connection can be shed, otherwise when a connection
// closes or turns idle. Meanwhile further clients wait in the listen
// backlog, as before. A connection's state comes from http.Server's
// ConnState hook (ConnState) and from its reads.
//
// The server that serves it must use its hooks: Guard around the handler,
// ConnState and ConnContext.
type Limiter struct {
	net.Listener
	max           int           // <= 0: no bound
	headerTimeout time.Duration // read_header_timeout; 0: a started header never makes a connection sheddable

	mu        sync.Mutex
	open      int          // admitted and not yet closed
	idleHead  *trackedConn // connections waiting for a request, oldest first
	idleTail  *trackedConn
	idleCount int

	freed  chan struct{} // a slot freed or a connection turned idle; capacity 1
	closed chan struct{} // the listener is closed
	once   sync.Once

	shed   atomic.Uint64 // connections closed to admit another
	waited atomic.Uint64 // admissions that had to wait: no connection could be shed

	// inFlight counts the requests being handled, over every connection
	// and protocol. An HTTP/1 connection carries one at a time, so the
	// connection bound bounds them; an HTTP/2 connection carries up to
	// h2MaxStreams, so a stream is refused (503) once inFlight would pass
	// max: streams never take the process beyond what max connections
	// could.
	inFlight  atomic.Int64
	h2Refused atomic.Uint64 // HTTP/2 streams refused by that bound

	headerRefused atomic.Uint64 // HTTP/1 headers cut at maxHeaderLines

	// clients holds the per-client limits: requests in flight
	// (server.max_requests_per_client) and HTTP/2 resets
	// (server.max_client_resets_per_second).
	clients *clientTable
	log     *slog.Logger // refusals, through the process's rate-limited handler
	// over holds the bounds over all clients (overload.go):
	// server.max_resets_per_second and the heap.
	over overload

	emptyContinuations atomic.Uint64 // connections closed for a run of empty CONTINUATION frames
	pingFloods         atomic.Uint64 // connections closed for PINGs past maxPingBurst or maxPingsPerSecond
	// fair makes admission at the bound fair between clients (the admin
	// listener's; see NewAdminLimiter): groups counts the open
	// connections of each network of each level, refused the newcomers
	// closed at once.
	fair    bool
	groups  map[string]int
	refused atomic.Uint64
}

// NewLimiter limits ln, the client-facing listener, to max connections
// at once (max <= 0: no bound, connections are still tracked), a header
// that started taking at most headerTimeout (server.read_header_timeout;
// 0: a started header never makes a connection sheddable) before its
// connection may be shed. Its refusals are logged on log (nil: not
// logged), which should be rate-limited. SetClientLimits applies the
// per-client limits.
func NewLimiter(ln net.Listener, max int, headerTimeout time.Duration, log *slog.Logger) *Limiter {
	l := newLimiter(ln, max, headerTimeout)
	if log != nil {
		l.log = log
	}
	return l
}

func newLimiter(ln net.Listener, max int, headerTimeout time.Duration) *Limiter {
	return &Limiter{
		Listener: ln, max: max, headerTimeout: headerTimeout,
		freed: make(chan struct{}, 1), closed: make(chan struct{}),
		clients: newClientTable(time.Now), log: slog.New(slog.DiscardHandler),
	}
}

// SetHeapBound sets the memory the live heap is judged against: past
// its share of n (overload.go), new connections and streams are refused.
// n is the soft memory limit when it stands for a real bound (a
// container's limit, or one the operator set); zero or less (the
// default: the default soft limit is a collector's target, which a large
// embedded store's live heap passes in normal operation) judges nothing.
func (l *Limiter) SetHeapBound(n int64) {
	if l == nil {
		return
	}
	l.over.heapBound.Store(n)
	if n <= 0 {
		l.over.heapHigh.Store(false)
	}
}

// IdleTimeoutOff is the http.Server.IdleTimeout of a server whose
// Limiter closes idle connections itself (SetIdleTimeout): negative, Go's
// server then sets no idle timer of its own, over HTTP/1 or HTTP/2.
const IdleTimeoutOff = -1

// idleSweepEvery is how often, at most, the idle connections are checked
// against the idle timeout (a tenth of it when that is shorter).
const idleSweepEvery = time.Second

// SetIdleTimeout makes the limiter close a connection that has waited d
// or longer for a request (http.StateIdle: a keep-alive connection
// between requests, an HTTP/2 connection with no open stream); d <= 0:
// none is closed. Call it
// once, before Accept; the server's IdleTimeout must be IdleTimeoutOff.
//
// It takes the place of Go's idle timers: its HTTP/2 server stops a
// connection's idle timer as the connection ends, then closes the streams
// still open, and closing the last one arms the timer again, so every
// connection that ended with a stream open (each connection of a
// rapid-reset flood, each one the proxy sheds) stayed in memory for the
// whole idle timeout, a few KiB each: 34 MB of live heap two minutes
// after a flood from 119 addresses, which kept the collector busy under
// the default soft memory limit of 48 MiB.
func (l *Limiter) SetIdleTimeout(d time.Duration) {
	if d <= 0 {
		return
	}
	every := min(idleSweepEvery, d/10)
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case now := <-tick.C:
				l.closeIdle(now, d)
			case <-l.closed:
				return
			}
		}
	}()
}

// closeIdle closes the connections idle for d or longer at now.
func (l *Limiter) closeIdle(now time.Time, d time.Duration) {
	var old []*trackedConn
	l.mu.Lock()
	for c := l.idleHead; c != nil; c = c.next {
		// As Go's timers did: an HTTP/2 connection's frames (PING,
		// SETTINGS) do not keep it open, nor do the first bytes of an
		// HTTP/1 request (until four have come, when the server marks
		// it active and its header is bounded by read_header_timeout).
		if c.state == http.StateIdle && now.Sub(c.since) >= d {
			old = append(old, c)
		}
	}
	for _, c := range old {
		l.removeIdle(c)
		c.shed.Store(true) // a request that starts now is not handled (Guard)
	}
	l.mu.Unlock()
	for _, c := range old {
		c.Close()
	}
}

// SetClientLimits applies the per-client limits of s; a reload applies
// them to requests and resets from then on. A per-client cap of
// max_connections is no cap: the bound over all clients decides.
func (l *Limiter) SetClientLimits(s config.Server) {
	maxRequests := int64(s.MaxRequestsPerClient)
	if l.max > 0 && maxRequests >= int64(l.max) {
		maxRequests = 0
	}
	l.clients.maxRequests.Store(maxRequests)
	l.clients.resetRate.Store(int64(s.MaxClientResetsPerSecond))
	l.over.rate.Store(int64(s.MaxResetsPerSecond))
}

// NewAdminLimiter limits the admin listener ln to max connections at
// once (max <= 0: no bound), fairly between clients: a slowloris on the
// admin port, from one address or from many, holds at most max
// descriptors and never keeps a probe from another network out.
//
// Clients are told apart by nested networks (fairLevels): for IPv4 the
// /16, the /24 and the address; for IPv6 the /32, the /48 and the /64. At
// the bound a newcomer
//
//  1. takes the place of a connection not serving a request (new, reading
//     its header, or idle) of another network that holds at least as many
//     connections as the newcomer's own, at the widest level where they
//     differ; within that network the victim is in its largest part, down
//     to the address, the oldest there; this ignores the grace of a new
//     connection and the header timeout (at least as many, not more: a
//     probe whose previous connection is still being closed holds one, as
//     each address of a flood may);
//  2. otherwise takes the place of one of its own address's connections
//     that can be shed by the rules of Limiter (a client replacing its
//     own idle connection);
//  3. otherwise is closed at once: it is never held, so the listen backlog
//     drains at the pace of Accept and a probe behind a flood of
//     connections is reached at once.
//
// So a network can crowd out only networks that hold at least as many
// connections: a Kubernetes probe or a Prometheus scrape from a network
// of its own is admitted at once and never displaced by a flood from
// elsewhere, whether its connections send a byte every few seconds from
// one address, come one each from many addresses, or reconnect all the
// time. Within one /24 (IPv6 /48), addresses share as fairly, but a flood
// from many addresses of the probe's own /24 can displace the probe's
// connection before its request is read.
//
// Its connections get no HTTP/2 and no per-client limits; a header of more
// than 256 lines is answered 431, as on the
// client-facing listener. The admin server uses the Admin* settings below.
func NewAdminLimiter(ln net.Listener, max int, headerTimeout time.Duration) *Limiter {
	l := newLimiter(ln, max, headerTimeout)
	l.fair = true
	l.groups = map[string]int{}
	return l
}

// The admin listener's own settings, for its http.Server (with
// NewAdminLimiter). Its requests are small and its
// clients (probes, scrapes, operators) send them at once; an idle
// keep-alive connection (a Prometheus scrape's between scrapes) may stay,
// and is the first to go when connections run short.
const (
	AdminReadHeaderTimeout = 5 * time.Second
	AdminReadTimeout       = 10 * time.Second
	AdminWriteTimeout      = 30 * time.Second
	AdminIdleTimeout       = 2 * time.Minute
	AdminMaxHeaderBytes    = 16 << 10
)

// Close closes the listener: an Accept waiting for a slot returns
// net.ErrClosed. Connections already admitted stay open.
func (l *Limiter) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *Limiter) signal() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// Accept returns the next client connection once it has a slot. A
// connection from a client that resets HTTP/2 streams too fast is closed
// at once, before it takes a slot.
func (l *Limiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.fair {
			// The admin listener: fair between networks, and no HTTP/2.
			return l.acceptFair(c)
		}
		if l.over.heapHighAt(time.Now()) {
			// Past the heap's share of memory_limit: taking in a
			// connection is taking in work the collector pays for.
			l.over.count(actionRefuseConn, reasonMemory)
			l.log.Warn("connection refused: the heap is past its share of memory_limit",
				"reason", reasonMemory, "heap_bytes", l.over.heapBytes.Load())
			c.Close()
			continue
		}
		client := ClientOf(c.RemoteAddr().String())
		if l.clients.refusing(client) {
			l.clients.countRefused(refusedResets)
			c.Close()
			continue
		}
		tc, err := l.admit(c)
		if err != nil {
			return nil, err
		}
		if !l.clients.admit(client, tc) {
			l.clients.countRefused(refusedResets)
			tc.Close()
			continue
		}
		return tc, nil
	}
}

// admit holds c until it has a slot.
func (l *Limiter) admit(c net.Conn) (*trackedConn, error) {
	counted := false
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		now := time.Now()
		l.mu.Lock()
		if l.max <= 0 || l.open < l.max {
			l.open++
			tc := &trackedConn{Conn: c, l: l, state: http.StateNew, since: now, born: now}
			l.pushIdle(tc)
			l.mu.Unlock()
			return tc, nil
		}
		victim := l.sheddable(now)
		l.mu.Unlock()
		if victim != nil {
			victim.shedNow()
			l.shed.Add(1)
			continue
		}
		if !counted {
			counted = true
			l.waited.Add(1)
			tick = time.NewTicker(recheckEvery)
		}
		select {
		case <-l.freed:
		case <-tick.C:
		case <-l.closed:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

// acceptFair admits c, or the next connection, by the rules of
// NewAdminLimiter.
func (l *Limiter) acceptFair(c net.Conn) (net.Conn, error) {
	for {
		path := connClient(c.RemoteAddr())
		now := time.Now()
		l.mu.Lock()
		if l.max <= 0 || l.open < l.max {
			l.open++
			for _, k := range path {
				l.groups[k]++
			}
			tc := &trackedConn{Conn: c, l: l, state: http.StateNew, since: now, networks: path}
			l.pushIdle(tc)
			l.mu.Unlock()
			return tc, nil
		}
		victim := l.displaceable(path, now)
		l.mu.Unlock()
		if victim != nil {
			victim.shedNow()
			l.shed.Add(1)
			continue
		}
		l.refused.Add(1)
		c.Close()
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		default:
		}
		var err error
		if c, err = l.Listener.Accept(); err != nil {
			return nil, err
		}
	}
}

// displaceable returns the connection a newcomer from path may take the
// place of (see NewAdminLimiter), taken off the idle list; nil if none.
// l.mu is held.
func (l *Limiter) displaceable(path clientPath, now time.Time) *trackedConn {
	var victim *trackedConn
	for lvl := 0; lvl < fairLevels && victim == nil; lvl++ {
		// The largest other network at this level, among the connections
		// that share the newcomer's wider networks.
		var top *trackedConn
		for c := l.idleHead; c != nil; c = c.next {
			if c.networks[lvl] == path[lvl] || (lvl > 0 && c.networks[lvl-1] != path[lvl-1]) {
				continue
			}
			if top == nil || l.groups[c.networks[lvl]] > l.groups[top.networks[lvl]] {
				top = c
			}
		}
		if top != nil && l.groups[top.networks[lvl]] >= l.groups[path[lvl]] {
			victim = l.largestPart(top, lvl)
		}
		// Otherwise the newcomer's network holds the most here: fairness
		// within it decides.
	}
	if victim == nil {
		for c := l.idleHead; c != nil; c = c.next {
			if c.networks == path && c.sheddable(now, l.headerTimeout) {
				victim = c
				break
			}
		}
	}
	if victim != nil {
		l.removeIdle(victim)
		victim.shed.Store(true)
	}
	return victim
}

// largestPart returns, among the idle connections in top's network of
// level lvl, the oldest of its largest part at each narrower level.
// l.mu is held.
func (l *Limiter) largestPart(top *trackedConn, lvl int) *trackedConn {
	var cands []*trackedConn
	for c := l.idleHead; c != nil; c = c.next {
		if c.networks[lvl] == top.networks[lvl] {
			cands = append(cands, c)
		}
	}
	for n := lvl + 1; n < fairLevels; n++ {
		best := cands[0]
		for _, c := range cands {
			if l.groups[c.networks[n]] > l.groups[best.networks[n]] {
				best = c
			}
		}
		kept := cands[:0]
		for _, c := range cands {
			if c.networks[n] == best.networks[n] {
				kept = append(kept, c)
			}
		}
		cands = kept
	}
	return cands[0]
}

// fairLevels is how many nested networks fair admission tells apart.
const fairLevels = 3

// clientPath names the networks a connection comes from, widest first:
// for IPv4 its /16, its /24 and its address; for IPv6 its /32, its /48 and
// its /64 (the block one host is commonly given).
type clientPath [fairLevels]string

// connClient returns the networks a connection comes from.
func connClient(addr net.Addr) clientPath {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return clientPath{"?", "?", addr.String()} // not an IP address: one client
	}
	a := ap.Addr().Unmap()
	bits := [fairLevels]int{16, 24, 32}
	if a.Is6() {
		bits = [fairLevels]int{32, 48, 64}
	}
	var p clientPath
	for i, b := range bits {
		pre, _ := a.Prefix(b)
		p[i] = pre.String()
	}
	return p
}

// sheddable returns the oldest connection that may be closed now, and
// takes it off the idle list; nil if none. l.mu is held.
func (l *Limiter) sheddable(now time.Time) *trackedConn {
	for c := l.idleHead; c != nil; c = c.next {
		if c.sheddable(now, l.headerTimeout) {
			l.removeIdle(c)
			c.shed.Store(true)
			return c
		}
	}
	return nil
}

// Saturated reports, for /readyz, whether the bound is reached with no
// connection waiting for a request (a new client would wait until a
// request finishes), or max requests are in flight (a new HTTP/2 stream
// would be refused), or the live heap sheds (overload.go).
func (l *Limiter) Saturated() error {
	// Read here too (at most every 100 ms): a replica a load balancer
	// takes out for it gets no connection that would read it again.
	if !l.fair && l.over.heapHighAt(time.Now()) {
		return fmt.Errorf("memory: the live heap (%d bytes) is past %.0f%% of memory_limit, new connections and HTTP/2 streams are refused",
			l.over.heapBytes.Load(), memoryShedShare*100)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.max <= 0:
		return nil
	case l.open >= l.max && l.idleCount == 0:
		return fmt.Errorf("connection limit reached: all %d connections (server.max_connections) are serving requests", l.max)
	case l.inFlight.Load() >= int64(l.max):
		return fmt.Errorf("request limit reached: %d requests in flight (server.max_connections), new HTTP/2 streams are refused", l.max)
	}
	return nil
}

// Counts returns the connections waiting for a request (idle) and the
// others (active: reading or serving a request, or hijacked).
func (l *Limiter) Counts() (active, idle int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open - l.idleCount, l.idleCount
}

func (l *Limiter) pushIdle(c *trackedConn) {
	c.prev, c.next = l.idleTail, nil
	if l.idleTail != nil {
		l.idleTail.next = c
	} else {
		l.idleHead = c
	}
	l.idleTail = c
	c.inIdle = true
	l.idleCount++
}

func (l *Limiter) removeIdle(c *trackedConn) {
	if !c.inIdle {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.idleHead = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.idleTail = c.prev
	}
	c.prev, c.next, c.inIdle = nil, nil, false
	l.idleCount--
}

// ConnState is http.Server's ConnState hook: it keeps each connection on
// the idle list while it waits for a request, and off it while a request
// is served (HTTP/2: while a stream is open) or once hijacked.
func (l *Limiter) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*trackedConn)
	if !ok {
		return
	}
	now := time.Now()
	l.mu.Lock()
	switch st {
	case http.StateIdle:
		c.state, c.since = st, now
		c.readAt.Store(0)
		if !c.h2.Load() {
			c.hdr = headerLines{} // the next request's header
		}
		if !c.inIdle && !c.released {
			l.pushIdle(c)
		}
	case http.StateActive, http.StateHijacked:
		c.state = st
		l.removeIdle(c)
	}
	l.mu.Unlock()
	if st == http.StateIdle {
		l.signal()
	}
}

// release gives c's slot back.
func (l *Limiter) release(c *trackedConn) {
	l.clients.closed(c)
	l.mu.Lock()
	l.removeIdle(c)
	c.released = true
	l.open--
	if l.fair {
		for _, k := range c.networks {
			if l.groups[k]--; l.groups[k] <= 0 {
				delete(l.groups, k)
			}
		}
	}
	l.mu.Unlock()
	l.signal()
}

// trackedConn is one admitted connection. Its list links, state and since
// are guarded by the limiter's mu.
type trackedConn struct {
	net.Conn
	l          *Limiter
	prev, next *trackedConn
	inIdle     bool
	released   bool
	state      http.ConnState
	since      time.Time  // when it entered state
	networks   clientPath // the networks it comes from (fair limiters only)

	readAt atomic.Int64 // unix nanoseconds of the first byte read since it went idle; 0: none
	// hdr counts the lines of an HTTP/1 request's header as it is read,
	// for maxHeaderLines. Only the connection's serving goroutine touches
	// it (its reads, and ConnState's reset when it turns idle).
	hdr  headerLines
	h2   atomic.Bool // it opened with the HTTP/2 preface
	shed atomic.Bool // the limiter closed it to admit another, or for its client's resets

	client *clientEntry // its client's entry; set once, at Accept
	resets connResets   // its HTTP/2 resets and streams opened, for the budget over all clients
	// backlog is its unread bytes in the kernel, for the budget over all
	// clients (HTTP/2 only); born when it was accepted.
	backlog connBacklog
	born    time.Time
	frames  h2Frames // HTTP/2 frame headers as they are read, for runs of empty CONTINUATION frames

	head  [len("PRI * HTTP/2.0")]byte // the first bytes read, until the preface is told apart
	headN int                         // -1: told apart
	once  sync.Once
}

// sheddable reports whether c, on the idle list, may be closed at now.
func (c *trackedConn) sheddable(now time.Time, headerTimeout time.Duration) bool {
	if c.state == http.StateIdle && c.h2.Load() {
		// No stream open: frames still come (SETTINGS, PING), but no
		// request is under way; one that starts finds the connection shed
		// and is never handled (see Guard).
		return true
	}
	if at := c.readAt.Load(); at != 0 {
		// A request is arriving: only one whose header is overdue.
		return headerTimeout > 0 && now.Sub(time.Unix(0, at)) >= headerTimeout
	}
	if c.state == http.StateNew {
		return now.Sub(c.since) >= newConnGrace
	}
	return true
}

// shedNow closes c, which the limiter took off the idle list, and gives
// its slot back at once.
func (c *trackedConn) shedNow() { c.Close() }

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if c.shed.Load() {
			// Bytes that arrived as the connection was shed: its request
			// is not read (the client sees the connection closed before
			// any answer, as when an idle keep-alive connection times
			// out).
			return 0, net.ErrClosed
		}
		if c.readAt.Load() == 0 {
			c.readAt.Store(time.Now().UnixNano())
		}
		sniffing := c.headN >= 0
		if sniffing {
			c.sniff(p[:n])
		}
		// HTTP/2 frames are followed from the first byte (the preface is
		// told apart over the first reads).
		if c.h2.Load() || (sniffing && c.headN >= 0) {
			if !c.frames.scan(p[:n]) {
				return 0, c.refuseFlood()
			}
			if c.client != nil {
				now := time.Now()
				shedding := c.l.over.shedding.Load()
				if k := c.frames.resets; k > 0 {
					c.frames.resets = 0
					c.resets.resets.Add(int64(k))
					if shed := c.l.clients.reset(c.client, k); shed != nil {
						return 0, c.refuseResets(shed)
					}
					shedding = c.l.over.reset(k, now)
				}
				if why := c.costly(now, shedding || c.l.over.heapHigh.Load()); why != "" {
					return 0, c.refuseOverload(why)
				}
			}
		}
		if !c.hdr.done && !c.h2.Load() && c.hdr.count(p[:n]) > maxHeaderLines {
			return 0, c.refuseHeader()
		}
	}
	return n, err
}

// refuseHeader answers an HTTP/1 request whose header has more than
// maxHeaderLines lines with 431 and closes the connection. Go's server
// parses every header line into its own strings and map entries before a
// handler can look at the request: 64 KiB of one-byte fields cost half a
// mebibyte, so max_connections of them would take hundreds of MiB. The
// error is a read error, which the server ends the connection on without
// writing an answer of its own.
func (c *trackedConn) refuseHeader() error {
	c.l.headerRefused.Add(1)
	c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	c.Conn.Write(problem.Raw(problem.TooManyHeaderFields, "the request header has more than "+strconv.Itoa(maxHeaderLines)+
		" lines (request line and fields); send fewer header fields"))
	c.Close()
	return &net.OpError{Op: "read", Net: "tcp", Err: errTooManyHeaderLines}
}

// headerLines counts the lines of a request header as its bytes arrive,
// until the empty line that ends it. Bytes read after that (the body, and
// a pipelined request already buffered with it, at most one read buffer)
// are not counted: the count starts again when the connection turns idle.
type headerLines struct {
	lines   int  // lines read, the empty one that ends the header not included
	nonzero bool // a line with content was read: an empty line now ends the header
	inLine  bool // the current line has content
	done    bool // the empty line was read
}

// count adds the line ends in b and returns the lines so far.
func (h *headerLines) count(b []byte) int {
	for _, ch := range b {
		switch ch {
		case '\n':
			if !h.inLine && h.nonzero {
				h.done = true // the empty line: not one of the header's
				return h.lines
			}
			h.lines++
			h.nonzero = h.nonzero || h.inLine
			h.inLine = false
		case '\r':
		default:
			h.inLine = true
		}
	}
	return h.lines
}

// errTooManyHeaderLines ends a connection whose request header has more
// than maxHeaderLines lines.
var errTooManyHeaderLines = errors.New("request header has too many lines")

// sniff tells an HTTP/2 connection (prior knowledge) from an HTTP/1 one
// by its first bytes.
func (c *trackedConn) sniff(b []byte) {
	k := copy(c.head[c.headN:], b)
	c.headN += k
	if !bytes.HasPrefix(h2Preface, c.head[:c.headN]) {
		c.headN = -1
		return
	}
	if c.headN == len(c.head) {
		c.h2.Store(true)
		c.headN = -1
	}
}

// Close closes the connection and gives its slot back, once.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

type connKey struct{}

// ConnContext is http.Server's ConnContext hook: it lets Guard find a
// request's connection.
func (l *Limiter) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// Guard drops a request that started on a connection the limiter has just
// shed (the request's header was read as the connection was closed): it is
// never handled, so nothing is reserved or forwarded for a client that
// cannot get the answer. A connection being served is never shed, so this
// only closes the race between a shed and a request's start.
//
// It then applies, before a request takes one of the max requests in
// flight, its client's limits (clientTable): an HTTP/2 stream its client
// reset before its handler started is dropped; a client with server.max_requests_per_client requests in flight is
// answered 503 overloaded; a client that resets streams faster than
// server.max_client_resets_per_second has its connections closed. With max
// requests in flight, a new HTTP/2 stream is refused, unless another
// client has reset more streams lately than this one and has a request in
// flight: that client's connections are closed and the stream is served.
func (l *Limiter) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*trackedConn)
		if c != nil && c.shed.Load() {
			panic(http.ErrAbortHandler)
		}
		h2 := r.ProtoMajor == 2
		if h2 && r.Context().Err() != nil {
			return // reset before its handler started: no one to answer
		}
		if h2 && c != nil && c.client != nil && l.over.heapHighAt(time.Now()) {
			l.over.count(actionRefuseStrm, reasonMemory)
			writeOverloaded(w, r, "the proxy's heap is past its share of memory_limit: "+
				"this HTTP/2 stream was refused before it was read; retry it", map[string]any{"setting": "memory_limit"})
			return
		}
		if h2 && c != nil && c.client != nil && c.resets.abusive() && (l.over.shedding.Load() || l.over.heapHigh.Load()) {
			// A stream of a connection that resets more than it is
			// served, while the proxy sheds: it goes, before a handler
			// runs for it.
			c.refuseOverload(l.over.shedReason())
			panic(http.ErrAbortHandler)
		}
		if c != nil && c.client != nil {
			e := c.client
			if h2 {
				c.resets.opened.Add(1)
			}
			if why := l.clients.start(e); why != "" {
				l.refuseClient(w, r, c, why)
				return
			}
			defer l.clients.end(e)
		}
		n := l.inFlight.Add(1)
		defer l.inFlight.Add(-1)
		if h2 && l.max > 0 && n > int64(l.max) {
			var victims []*trackedConn
			if c != nil && c.client != nil {
				victims = l.clients.victim(c.client)
			}
			if victims == nil {
				l.h2Refused.Add(1)
				writeOverloaded(w, r, fmt.Sprintf("%d requests are in flight (server.max_connections): "+
					"this HTTP/2 stream was refused before it was read; retry it", l.max),
					map[string]any{"setting": "server.max_connections", "limit": l.max})
				return
			}
			// Served in place of the client that resets the most: its
			// requests end as its connections close.
			l.clients.countRefused(refusedShed)
			l.log.Warn("client's connections closed: requests in flight reached server.max_connections "+
				"and this client reset the most HTTP/2 streams", "reason", refusedShed,
				"client", victims[0].client.id, "connections", len(victims))
			l.drop(victims)
		}
		next.ServeHTTP(w, r)
	})
}

// refuseClient refuses a request of c's client for why (refusedStreams,
// refusedResets), before it takes a slot or touches the store.
func (l *Limiter) refuseClient(w http.ResponseWriter, r *http.Request, c *trackedConn, why string) {
	l.clients.countRefused(why)
	if why == refusedResets {
		// A client that resets streams at this rate reads no answer:
		// its connection goes, the others went when it passed the rate.
		l.log.Warn("client refused: it resets HTTP/2 streams faster than server.max_client_resets_per_second",
			"reason", refusedResets, "client", c.client.id, "setting", "server.max_client_resets_per_second",
			"limit", l.clients.resetRate.Load())
		l.drop([]*trackedConn{c})
		if r.ProtoMajor == 2 {
			panic(http.ErrAbortHandler)
		}
		return
	}
	max := l.clients.maxRequests.Load()
	l.log.Warn("request refused: this client has server.max_requests_per_client requests in flight",
		"reason", refusedStreams, "client", c.client.id, "setting", "server.max_requests_per_client", "limit", max)
	writeOverloaded(w, r, fmt.Sprintf("this client (%s) has %d requests in flight (server.max_requests_per_client): "+
		"this request was refused before it was read; retry it", c.client.id, max),
		map[string]any{"client": c.client.id, "setting": "server.max_requests_per_client", "limit": max})
}

// drop closes conns, connections of a client that resets streams too fast
// or that gave way to another client's request, marked shed so that the
// requests they end are not counted as resets.
func (l *Limiter) drop(conns []*trackedConn) {
	for _, c := range conns {
		c.shed.Store(true)
		c.Close()
	}
}

// writeOverloaded answers 503 overloaded, with Retry-After: 1, a request
// refused before it was read (an HTTP/2 stream beyond
// server.max_connections requests in flight, or beyond its client's
// server.max_requests_per_client); detail names the bound, ext adds
// extension members.
func writeOverloaded(w http.ResponseWriter, r *http.Request, detail string, ext map[string]any) {
	problem.Write(w, r, problem.Overloaded, detail, 1, ext)
}
