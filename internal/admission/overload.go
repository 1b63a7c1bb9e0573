package admission

import (
	"errors"
	"math"
	"net"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// The overload manager: bounds over all clients, whatever their address
// (docs/admission.md, "Many clients at once"). The per-client limits hold
// against one address; a flood spread over many addresses, each under
// its own limits, is met here:
//
//   - server.max_resets_per_second, HTTP/2 streams reset over all
//     connections: one second's worth at once. Past it the proxy sheds:
//     a connection whose resets are more than resetShare of the streams
//     it opened (and at least minShedResets) is closed as it reads its
//     next reset, before any further frame of it is read, so its unread
//     backlog goes with it instead of being drained slowly; a connection
//     whose streams are mostly served is never closed for the budget.
//     Shedding stops once the level drains below half the budget.
//   - the unread backlog of an HTTP/2 connection: bytes the kernel holds
//     for it that the server has not read, past maxBacklog (more than
//     flow control lets a client send unasked) for backlogFor, or at
//     once while the proxy sheds: the connection is closed and its
//     backlog goes with it, rather than being drained at the server's
//     pace (45 KB/s a connection was seen after a flood ended).
//   - while the proxy sheds, the connections that spend most of the
//     budget go first: a connection with a large backlog at once; one
//     that resets more than resetShare of its streams as it reads its
//     next reset, after minShedResets resets, or after its first reset
//     while it is new (younger than newConnGrace: a flood reconnects,
//     each new connection would otherwise reset minShedResets streams
//     unchecked); a connection mostly served never.
//   - the live heap: past memoryShedShare of the soft memory limit
//     (memory_limit), read at most every memoryReadEvery, new
//     connections are closed as they are accepted and new HTTP/2 streams
//     answered 503 before their body is read, so the collector is not
//     driven into a loop by more work taken in.
const (
	// memoryShedShare is the share of the soft memory limit past which
	// the live heap (what the last collection kept) sheds;
	// memoryResumeShare the share below which it stops. A collection's
	// work grows with the live heap and its frequency with the inverse of
	// the room left under the limit; the Go runtime caps the collector at
	// about half the CPU when the soft limit drives it. The shares were
	// set above the 33 to 40 MiB the process kept live after a
	// rapid-reset flood ended, before that was found to be Go's HTTP/2
	// idle timers holding every closed connection for idle_timeout
	// (SetIdleTimeout); about 5 MiB are left now.
	memoryShedShare   = 0.90
	memoryResumeShare = 0.85
	// memoryReadEvery bounds how often the heap is read (runtime/metrics,
	// a few microseconds): never per request.
	memoryReadEvery = 100 * time.Millisecond
	// memoryRecheckEvery: while the heap sheds and no collection has run
	// for this long, one is started, at most this often. The live heap is
	// what the last collection kept; refusing work stops allocation, and
	// with it the collections that would show the heap back down, so
	// without this the proxy would refuse until the runtime's periodic
	// collection (two minutes).
	memoryRecheckEvery = time.Second
	// maxBacklog is the unread bytes past which an HTTP/2 connection's
	// backlog is large. The server reads each connection's frames as
	// they come (its bodies into the streams' flow-control windows), so
	// a client it serves leaves a few KiB unread at most; the kernel
	// holds up to about 128 KiB for a connection that is not read
	// (Linux's default receive buffer), which is where the backlog of a
	// flood stays (8.2 MB over 100 connections after one ended).
	maxBacklog = 64 << 10
	// backlogFor is how long a backlog may stay large while the proxy
	// does not shed.
	backlogFor = time.Second
	// backlogReadEvery bounds how often a connection's backlog is read
	// (an ioctl): at most this often a connection, on its reads.
	backlogReadEvery = 100 * time.Millisecond
)

// Overload actions and their reasons: the labels of
// idemproxy_overload_actions_total.
const (
	actionCloseConn   = "close_connection" // an open connection closed
	actionRefuseConn  = "refuse_connection"
	actionRefuseStrm  = "refuse_stream" // an HTTP/2 stream answered 503 before its body was read
	reasonResets      = "resets"        // server.max_resets_per_second passed
	reasonMemory      = "memory"        // the heap past its share of memory_limit
	reasonBacklog     = "backlog"       // an HTTP/2 connection's unread backlog stayed large
	overloadStateNone = 0
)

// overloadActions lists the (action, reason) pairs counted, in
// documentation order.
var overloadActions = [...][2]string{
	{actionCloseConn, reasonResets},
	{actionCloseConn, reasonMemory},
	{actionCloseConn, reasonBacklog},
	{actionRefuseConn, reasonMemory},
	{actionRefuseStrm, reasonMemory},
}

// overload holds the global bounds' state.
type overload struct {
	rate atomic.Int64 // server.max_resets_per_second; <= 0: not bounded

	mu       sync.Mutex
	level    float64   // resets over all connections, drained at rate a second since at
	at       time.Time // when level was last drained
	shedding atomic.Bool

	heapBound atomic.Int64 // what the live heap is judged against (SetHeapBound); <= 0: not judged
	heapRead  atomic.Int64 // unix nanoseconds of the last read of the heap
	heapHigh  atomic.Bool  // the heap is past memoryShedShare of the soft limit
	heapBytes atomic.Int64 // the last read
	sample    [2]metrics.Sample
	sampleMu  sync.Mutex
	cycles    uint64    // collections seen at the last read; under sampleMu
	cycleAt   time.Time // when cycles last changed, or a collection was started; under sampleMu
	collect   atomic.Bool

	actions [len(overloadActions)]atomic.Uint64
}

func (o *overload) count(action, reason string) {
	for i, a := range overloadActions {
		if a[0] == action && a[1] == reason {
			o.actions[i].Add(1)
		}
	}
}

// counted returns how many times action was taken for reason.
func (o *overload) counted(action, reason string) uint64 {
	for i, a := range overloadActions {
		if a[0] == action && a[1] == reason {
			return o.actions[i].Load()
		}
	}
	return 0
}

// reset counts n resets read at now, and reports whether the budget over
// all connections is spent: the proxy sheds connections that reset more
// than they are served.
func (o *overload) reset(n int, now time.Time) bool {
	rate := float64(o.rate.Load())
	if rate <= 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.at.IsZero() {
		o.level = max(o.level-now.Sub(o.at).Seconds()*rate, 0)
	}
	o.at = now
	o.level = min(o.level+float64(n), 1.5*rate)
	switch {
	case o.level > rate:
		o.shedding.Store(true)
	case o.level < rate/2:
		o.shedding.Store(false)
	}
	return o.shedding.Load()
}

// heapHighAt reports whether the heap is past its share of the soft
// memory limit, reading it at most every memoryReadEvery.
func (o *overload) heapHighAt(now time.Time) bool {
	last := o.heapRead.Load()
	if now.UnixNano()-last < int64(memoryReadEvery) || !o.heapRead.CompareAndSwap(last, now.UnixNano()) {
		return o.heapHigh.Load()
	}
	limit := o.heapBound.Load()
	if limit <= 0 || limit == math.MaxInt64 {
		o.heapHigh.Store(false)
		return false
	}
	o.sampleMu.Lock()
	defer o.sampleMu.Unlock()
	o.sample[0].Name, o.sample[1].Name = "/gc/heap/live:bytes", "/gc/cycles/total:gc-cycles"
	metrics.Read(o.sample[:])
	heap, cycles := int64(0), uint64(0)
	if o.sample[0].Value.Kind() == metrics.KindUint64 {
		heap = int64(o.sample[0].Value.Uint64())
	}
	if o.sample[1].Value.Kind() == metrics.KindUint64 {
		cycles = o.sample[1].Value.Uint64()
	}
	o.heapBytes.Store(heap)
	high := o.heapHigh.Load()
	switch {
	case float64(heap) > memoryShedShare*float64(limit):
		high = true
	case float64(heap) < memoryResumeShare*float64(limit):
		high = false
	}
	o.heapHigh.Store(high)
	if cycles != o.cycles {
		o.cycles, o.cycleAt = cycles, now
	} else if high && now.Sub(o.cycleAt) >= memoryRecheckEvery && o.collect.CompareAndSwap(false, true) {
		o.cycleAt = now
		go func() {
			defer o.collect.Store(false)
			runtime.GC()
		}()
	}
	return high
}

// state is the gauge idemproxy_overload_state: 0 none, 1 shedding for
// resets, 2 for memory, 3 both.
func (o *overload) state() float64 {
	s := overloadStateNone
	if o.shedding.Load() {
		s |= 1
	}
	if o.heapHigh.Load() {
		s |= 2
	}
	return float64(s)
}

// connResets are one connection's resets and streams opened, to tell a
// connection that resets more than it is served.
type connResets struct {
	resets atomic.Int64
	opened atomic.Int64
}

// abusiveConn reports whether the connection resets more than resetShare
// of the streams it opened, with at least minShedResets resets.
func (r *connResets) abusive() bool {
	return r.abusiveFrom(minShedResets)
}

// abusiveFrom reports whether the connection resets more than
// resetShare of the streams it opened, with at least least resets.
func (r *connResets) abusiveFrom(least int64) bool {
	n := r.resets.Load()
	return n >= least && abusive(float64(n), float64(r.opened.Load()))
}

// connBacklog follows an HTTP/2 connection's unread backlog. Only the
// connection's serving goroutine (its reads) touches it.
type connBacklog struct {
	readAt time.Time // when it was last read
	bytes  int       // the last read; -1: not known
	since  time.Time // since when it has been past maxBacklog; zero: it is not
}

// large reads the backlog of c at now, at most every backlogReadEvery,
// and reports whether it is past maxBacklog, and has been for
// backlogFor (both as of the last read).
func (b *connBacklog) large(c net.Conn, now time.Time) (large, stays bool) {
	if b.readAt.IsZero() || now.Sub(b.readAt) >= backlogReadEvery {
		b.readAt, b.bytes = now, unreadBytes(c)
		switch {
		case b.bytes <= maxBacklog:
			b.since = time.Time{}
		case b.since.IsZero():
			b.since = now
		}
	}
	return !b.since.IsZero(), !b.since.IsZero() && now.Sub(b.since) >= backlogFor
}

// costly returns why c, an HTTP/2 connection, is to be closed at now
// (shedding: the reset budget over all clients is spent or the heap is
// high), or "" if it is not: in the order of what it costs, a backlog
// that stays large (at once while shedding), then while shedding resets
// more than resetShare of its streams (from its first reset while it is
// new).
func (c *trackedConn) costly(now time.Time, shedding bool) string {
	if large, stays := c.backlog.large(c.Conn, now); stays || (large && shedding) {
		return reasonBacklog
	}
	if !shedding {
		return ""
	}
	least := int64(minShedResets)
	if now.Sub(c.born) < newConnGrace {
		least = 1
	}
	if c.resets.abusiveFrom(least) {
		return c.l.over.shedReason()
	}
	return ""
}

// shedReason is why the proxy sheds: reasonResets while the reset budget
// is spent, else reasonMemory.
func (o *overload) shedReason() string {
	if o.shedding.Load() {
		return reasonResets
	}
	return reasonMemory
}

// refuseOverload closes c for reason (reasonResets, reasonMemory: it
// resets more HTTP/2 streams than it is served while the budget over all
// clients is spent or the heap is high; reasonBacklog: its unread
// backlog is large), and returns the read error the server ends it on.
// Its unread frames go with it.
func (c *trackedConn) refuseOverload(reason string) error {
	err := &net.OpError{Op: "read", Net: "tcp", Err: errOverloadResets}
	if reason == reasonBacklog {
		err.Err = errOverloadBacklog
	}
	if c.shed.Load() {
		return err // closed already (by a stream of it, or its read)
	}
	c.l.over.count(actionCloseConn, reason)
	if reason == reasonBacklog {
		c.l.log.Warn("overload: HTTP/2 connection closed: its unread backlog stays large",
			"reason", reason, "client", c.client.id, "unread_bytes", c.backlog.bytes, "max", maxBacklog)
	} else {
		c.l.log.Warn("overload: HTTP/2 connection closed: it resets more streams than it is served while the proxy sheds",
			"reason", reason, "client", c.client.id, "setting", "server.max_resets_per_second",
			"limit", c.l.over.rate.Load(), "resets", c.resets.resets.Load(), "streams", c.resets.opened.Load())
	}
	c.l.drop([]*trackedConn{c})
	return err
}

// errOverloadBacklog ends a connection whose unread backlog stays large.
var errOverloadBacklog = errors.New("http2: the connection sends frames faster than it is served")

// errOverloadResets ends a connection closed by the overload manager.
var errOverloadResets = errors.New("http2: the connection resets more streams than it is served while the proxy sheds")
