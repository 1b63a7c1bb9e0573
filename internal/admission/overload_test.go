package admission

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// TestOverloadResetBudget: the budget over all connections starts shedding
// past one second of server.max_resets_per_second and stops once it drains
// below half of it; zero turns it off.
func TestOverloadResetBudget(t *testing.T) {
	var o overload
	now := time.Unix(1000, 0)
	if o.reset(10_000, now) {
		t.Fatal("a budget of 0 (off) shed")
	}
	o.rate.Store(100)
	if o.reset(100, now) {
		t.Fatal("shedding at one second's worth of resets, want only past it")
	}
	if !o.reset(1, now) {
		t.Fatal("not shedding past one second's worth of resets")
	}
	// 0.3 s later the level (capped at 150) drained by 30: still above half.
	if !o.reset(0, now.Add(300*time.Millisecond)) {
		t.Fatal("stopped shedding above half the budget")
	}
	if o.reset(0, now.Add(1500*time.Millisecond)) {
		t.Fatal("still shedding once the resets drained below half the budget")
	}
	if got := o.state(); got != 0 {
		t.Errorf("state = %v once drained, want 0", got)
	}
}

// TestConnResetsAbusive: a connection is shed for the budget only when it
// resets at least minShedResets streams and more than half the streams it
// opened; a connection mostly served is not.
func TestConnResetsAbusive(t *testing.T) {
	for _, tc := range []struct {
		resets, opened int64
		want           bool
	}{
		{minShedResets - 1, 0, false},
		{minShedResets, 0, true},
		{100, 100, true},
		{100, 200, false},
		{10, 1000, false},
	} {
		var r connResets
		r.resets.Store(tc.resets)
		r.opened.Store(tc.opened)
		if got := r.abusive(); got != tc.want {
			t.Errorf("resets %d of %d opened: abusive = %v, want %v", tc.resets, tc.opened, got, tc.want)
		}
	}
}

// TestOverloadShedsResetsFromManyClients is issue 36's attack in this
// process: rapid reset from 40 addresses, each far under its own
// server.max_client_resets_per_second (set out of reach here), so only
// the budget over all clients can meet it. The connections are closed by
// it (idemproxy_overload_actions_total{action="close_connection",
// reason="resets"}, or "backlog"), and probes from another address are served while
// and after it.
func TestOverloadShedsResetsFromManyClients(t *testing.T) {
	l, addr := clientServer(t, 256, config.Server{MaxRequestsPerClient: 256, MaxClientResetsPerSecond: 1 << 30, MaxResetsPerSecond: 200})
	from := make([]string, 40)
	for i := range from {
		from[i] = fmt.Sprintf("127.0.0.%d", 10+i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a := &h2attack.Attacker{Addr: addr, From: from}
	wg := a.Run(ctx, len(from))
	defer wg.Wait()
	defer cancel()
	// Closed for their resets, or for the backlog of frames they send
	// faster than a slow run (-race) reads them.
	closed := func() uint64 {
		return l.over.counted(actionCloseConn, reasonResets) + l.over.counted(actionCloseConn, reasonBacklog)
	}
	for closed() < uint64(len(from)) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := closed(); n < uint64(len(from)) {
		t.Fatalf("the budget over all clients closed %d attacking connections, want at least %d (%d streams reset on %d connections)",
			n, len(from), a.Streams.Load(), a.Conns.Load())
	}
	if n := l.clients.refused[1].Load(); n != 0 {
		t.Errorf("per-client limit refused %d times, want 0: the test is of the global budget", n)
	}
	probeServed(t, addr, 3)
	cancel()
	wg.Wait()
	t.Logf("attack: %d streams reset on %d connections; %d closed by the global budget", a.Streams.Load(), a.Conns.Load(), closed())
}

// TestOverloadMemoryRefusesNewWork: with the live heap past its share of
// the soft memory limit, a new connection is closed as it is accepted
// (nothing is read from it) and counted; once the heap is back below its
// resume share, new connections are served again.
func TestOverloadMemoryRefusesNewWork(t *testing.T) {
	l, addr := clientServer(t, 64, config.Server{MaxRequestsPerClient: 64, MaxClientResetsPerSecond: 100, MaxResetsPerSecond: 1000})
	if st, _, err := h2attack.GetFrom(t, "127.0.0.2", addr, "/"); st != 200 {
		t.Fatalf("before: %d %v, want 200", st, err)
	}

	// A live heap of 64 MiB against a soft limit of 68 MiB: 94 %, past
	// the 90 % share. The ballast is never written: it costs no memory.
	ballast := make([]byte, 64<<20)
	runtime.GC()
	old := debug.SetMemoryLimit(68 << 20)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	l.SetHeapBound(68 << 20) // a container's limit, or one the operator set
	h2attack.Eventually(t, "a new connection is refused", func() bool {
		st, _, _ := h2attack.GetFrom(t, "127.0.0.2", addr, "/")
		return st == 0
	})
	if n := l.over.counted(actionRefuseConn, reasonMemory); n == 0 {
		t.Errorf("idemproxy_overload_actions_total{action=refuse_connection,reason=memory} = 0, want the refusals counted")
	}
	if got := l.over.state(); got != 2 {
		t.Errorf("state = %v with the heap high, want 2", got)
	}
	if err := l.Saturated(); err == nil || !strings.Contains(err.Error(), "memory_limit") {
		t.Errorf("Saturated() = %v with the heap high, want the reason /readyz gives naming memory_limit", err)
	}
	runtime.KeepAlive(ballast)
	// No runtime.GC() here: with new work refused nothing allocates, and
	// the proxy starts the collection that shows the heap back down.
	ballast = nil
	h2attack.Eventually(t, "new connections are served once the heap is back down", func() bool {
		st, _, _ := h2attack.GetFrom(t, "127.0.0.2", addr, "/")
		return st == 200
	})
}

// clientServer serves, through a client listener's Limiter of max
// connections with the limits of s, a handler that reads the body and
// answers "ok"; it returns the Limiter and its address.
func clientServer(t *testing.T, max int, s config.Server) (*Limiter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(ln, max, time.Second)
	l.SetClientLimits(s)
	srv := &http.Server{
		Handler: l.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		})),
		ConnState: l.ConnState, ConnContext: l.ConnContext,
		Protocols: ServerProtocols(), HTTP2: ServerHTTP2(),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l, ln.Addr().String()
}

// probeServed sends n POSTs over HTTP/1.1 and n over cleartext HTTP/2
// from 127.0.0.2 to addr, and fails the test for any answer but 200.
func probeServed(t *testing.T, addr string, n int) {
	t.Helper()
	h1, h2 := h2attack.ProbeClients("127.0.0.2")
	for i := range n {
		for _, c := range []*http.Client{h1, h2} {
			r, _ := h2attack.Do(c, "POST", "http://"+addr+"/charges", `{}`)
			if r.Status != 200 {
				t.Errorf("probe %d = %d %v, want 200", i, r.Status, r.Err)
			}
		}
	}
}

// TestShedTheCostliestFirst: while the proxy sheds, the connections that
// spend most of the budget are closed and the others kept: one that
// resets more than half its streams after minShedResets resets, or after
// its first one while it is new (a flood reconnects); one mostly served,
// or old with a few resets, is kept. With the budget not spent, none is
// closed for its resets.
func TestShedTheCostliestFirst(t *testing.T) {
	now := time.Unix(1e9, 0)
	l := newLimiter(nil, 0, time.Second)
	for _, tc := range []struct {
		name           string
		age            time.Duration
		resets, opened int64
		want           string // while shedding for resets
	}{
		{"new, every stream reset", newConnGrace / 2, 2, 2, reasonResets},
		{"new, mostly served", newConnGrace / 2, 2, 10, ""},
		{"old, a few resets", time.Minute, minShedResets - 1, minShedResets - 1, ""},
		{"old, every stream reset", time.Minute, minShedResets, minShedResets, reasonResets},
		{"old, mostly served", time.Minute, 100, 1000, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &trackedConn{Conn: nopConn{}, l: l, born: now.Add(-tc.age)}
			c.resets.resets.Store(tc.resets)
			c.resets.opened.Store(tc.opened)
			if got := c.costly(now, false); got != "" {
				t.Errorf("costly while not shedding = %q, want kept", got)
			}
			l.over.shedding.Store(true)
			defer l.over.shedding.Store(false)
			if got := c.costly(now, true); got != tc.want {
				t.Errorf("costly while shedding = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestIdleTimeoutClosesIdleConnections: with the limiter closing idle
// connections (SetIdleTimeout, the server's own idle timers off), an
// HTTP/1.1 keep-alive connection and an HTTP/2 connection with no open
// stream are closed once idle for the timeout, and one serving a request
// is not.
func TestIdleTimeoutClosesIdleConnections(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(ln, 64, time.Second)
	l.SetIdleTimeout(300 * time.Millisecond)
	srv := &http.Server{
		Handler: l.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-release
			}
			io.WriteString(w, "ok")
		})),
		ConnState: l.ConnState, ConnContext: l.ConnContext, IdleTimeout: IdleTimeoutOff,
		Protocols: ServerProtocols(), HTTP2: ServerHTTP2(),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	held := h2attack.DialRaw(t, addr)
	fmt.Fprintf(held, "GET /hold HTTP/1.1\r\nHost: test\r\n\r\n")
	idle := h2attack.DialRaw(t, addr)
	if st, _, err := idle.Get("/"); st != 200 {
		t.Fatalf("HTTP/1.1: %d %v", st, err)
	}
	var closedH2 atomic.Bool
	h2 := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		return &p
	}(), DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c, closed: &closedH2}, nil
	}}}
	if r, _ := h2attack.Do(h2, "GET", "http://"+addr+"/", ""); r.Status != 200 {
		t.Fatalf("HTTP/2: %d %v", r.Status, r.Err)
	}
	h2attack.Eventually(t, "the idle HTTP/1.1 connection closed", idle.ClosedByPeer)
	h2attack.Eventually(t, "the idle HTTP/2 connection closed", closedH2.Load)
	if held.ClosedByPeer() {
		t.Error("the connection serving a request was closed, want it kept")
	}
}

// watchedConn records that the other end closed it (a read ended).
type watchedConn struct {
	net.Conn
	closed *atomic.Bool
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.closed.Store(true)
	}
	return n, err
}

// TestFloodLeavesNoConnectionInMemory: the connections of a rapid-reset
// flood, each ended with streams open, are not kept in memory once they
// close. With Go's own HTTP/2 idle timer (re-armed as the streams left
// open are closed, after the connection ended) each stayed live for the
// idle timeout, 7 to 10 KiB a connection.
func TestFloodLeavesNoConnectionInMemory(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(ln, 1024, time.Second)
	l.SetClientLimits(config.Server{MaxRequestsPerClient: 256, MaxClientResetsPerSecond: 100, MaxResetsPerSecond: 1000})
	l.SetIdleTimeout(time.Hour)
	srv := &http.Server{
		Handler:   l.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })),
		ConnState: l.ConnState, ConnContext: l.ConnContext, IdleTimeout: IdleTimeoutOff, ReadTimeout: time.Hour,
		Protocols: ServerProtocols(), HTTP2: ServerHTTP2(),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	before := liveHeap()
	from := make([]string, 40)
	for i := range from {
		from[i] = fmt.Sprintf("127.0.0.%d", 10+i)
	}
	ctx, cancel := context.WithCancel(t.Context())
	a := &h2attack.Attacker{Addr: ln.Addr().String(), From: from}
	wg := a.Run(ctx, len(from))
	// 500 connections, or as many as a slow run (-race, a loaded
	// machine) makes in a minute: the proxy closes them as it sheds.
	for deadline := time.Now().Add(time.Minute); a.Conns.Load() < 500 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if a.Conns.Load() < 100 {
		t.Fatalf("the attack made %d connections in a minute, want 100 or more", a.Conns.Load())
	}
	h2attack.Eventually(t, "every connection closed", func() bool { active, idle := l.Counts(); return active+idle == 0 })
	var after uint64
	// The serving goroutines end a moment after their connections.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		after = liveHeap()
		if after < before+uint64(a.Conns.Load())*3072 || time.Now().After(deadline) {
			break
		}
	}
	per := (int64(after) - int64(before)) / a.Conns.Load()
	t.Logf("%d connections: live heap %d before, %d after (%d bytes a connection)", a.Conns.Load(), before, after, per)
	if per >= 3072 {
		t.Errorf("the flood's connections left %d bytes each in the live heap, want under 3 KiB: they are kept after they closed", per)
	}
}

// liveHeap collects twice and returns the live heap.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
