package admission

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// frames returns the preface followed by the frames each call of add
// writes.
func frames(add func(w *bufio.Writer)) []byte {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	w.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	h2attack.WriteFrame(w, h2attack.FrameSettings, 0, 0, nil)
	add(w)
	w.Flush()
	return b.Bytes()
}

// TestH2FramesScan: the frame scanner on the read path finds a run of
// CONTINUATION frames that adds nothing, and counts RST_STREAM frames,
// however the bytes are split between reads; a legitimate header block
// over CONTINUATION frames, and frames whose payload looks like a frame
// header, pass.
func TestH2FramesScan(t *testing.T) {
	block := h2attack.HPACKLiteral(h2attack.GetFields("/x")...)
	var rst [4]byte
	for _, tc := range []struct {
		name   string
		bytes  []byte
		ok     bool
		resets int
	}{
		{"16 empty CONTINUATION frames", frames(func(w *bufio.Writer) {
			h2attack.WriteFrame(w, h2attack.FrameHeaders, 0, 1, block)
			for range maxEmptyContinuations {
				h2attack.WriteFrame(w, h2attack.FrameContinuation, 0, 1, nil)
			}
		}), true, 0},
		{"17 empty CONTINUATION frames", frames(func(w *bufio.Writer) {
			h2attack.WriteFrame(w, h2attack.FrameHeaders, 0, 1, block)
			for range maxEmptyContinuations + 1 {
				h2attack.WriteFrame(w, h2attack.FrameContinuation, 0, 1, nil)
			}
		}), false, 0},
		{"empty runs broken by other frames", frames(func(w *bufio.Writer) {
			for i := range uint32(40) {
				h2attack.WriteFrame(w, h2attack.FrameHeaders, 0, 2*i+1, block)
				for range maxEmptyContinuations - 1 {
					h2attack.WriteFrame(w, h2attack.FrameContinuation, 0, 2*i+1, nil)
				}
				h2attack.WriteFrame(w, h2attack.FrameContinuation, h2attack.FlagEndHeaders, 2*i+1, nil)
			}
		}), true, 0}, // 40 runs of 16 empty frames each
		{"513 one-byte CONTINUATION frames", frames(func(w *bufio.Writer) {
			h2attack.WriteFrame(w, h2attack.FrameHeaders, 0, 1, block)
			for range maxContinuations + 1 {
				h2attack.WriteFrame(w, h2attack.FrameContinuation, 0, 1, []byte{0x20})
			}
		}), false, 0},
		{"a header block over CONTINUATION frames", frames(func(w *bufio.Writer) {
			h2attack.WriteFrame(w, h2attack.FrameHeaders, 0, 1, block[:4])
			h2attack.WriteFrame(w, h2attack.FrameContinuation, 0, 1, block[4:8])
			h2attack.WriteFrame(w, h2attack.FrameContinuation, h2attack.FlagEndHeaders, 1, block[8:])
		}), true, 0},
		{"a payload that looks like CONTINUATION headers", frames(func(w *bufio.Writer) {
			var fake bytes.Buffer
			fw := bufio.NewWriter(&fake)
			for range 100 {
				h2attack.WriteFrame(fw, h2attack.FrameContinuation, 0, 1, nil)
			}
			fw.Flush()
			h2attack.WriteFrame(w, 0x0 /* DATA */, 0, 1, fake.Bytes())
		}), true, 0},
		{"64 PINGs at once", frames(func(w *bufio.Writer) {
			for range maxPingBurst {
				h2attack.WriteFrame(w, h2attack.FramePing, 0, 0, make([]byte, 8))
			}
		}), true, 0},
		{"65 PINGs at once", frames(func(w *bufio.Writer) {
			for range maxPingBurst + 1 {
				h2attack.WriteFrame(w, h2attack.FramePing, 0, 0, make([]byte, 8))
			}
		}), false, 0},
		{"1000 PING acknowledgements", frames(func(w *bufio.Writer) {
			for range 1000 {
				h2attack.WriteFrame(w, h2attack.FramePing, 0x1, 0, make([]byte, 8))
			}
		}), true, 0},
		{"RST_STREAM frames", frames(func(w *bufio.Writer) {
			for i := range uint32(7) {
				h2attack.WriteFrame(w, h2attack.FrameHeaders, h2attack.FlagEndHeaders, 2*i+1, block)
				h2attack.WriteFrame(w, h2attack.FrameRSTStream, 0, 2*i+1, rst[:])
			}
		}), true, 7},
	} {
		for _, chunk := range []int{1 << 20, 1, 7, 9, 4096} {
			t.Run(fmt.Sprintf("%s/reads of %d", tc.name, chunk), func(t *testing.T) {
				var f h2Frames
				ok := true
				for b := tc.bytes; len(b) > 0 && ok; {
					n := min(chunk, len(b))
					ok = f.scan(b[:n])
					b = b[n:]
				}
				if ok != tc.ok || f.resets != tc.resets {
					t.Errorf("scan = %v with %d resets, want %v with %d", ok, f.resets, tc.ok, tc.resets)
				}
			})
		}
	}
}

// TestH2FramesPingRate: a connection may send maxPingBurst PINGs at once
// and keep up maxPingsPerSecond for ever; faster, it is a PING flood.
func TestH2FramesPingRate(t *testing.T) {
	var f h2Frames
	now := time.Unix(1e9, 0)
	for i := range maxPingBurst {
		if !f.ping(now) {
			t.Fatalf("PING %d of a burst refused, want %d at once", i+1, maxPingBurst)
		}
	}
	for i := range 100 * maxPingsPerSecond { // 100 s at the rate, after the burst
		now = now.Add(time.Second / maxPingsPerSecond)
		if !f.ping(now) {
			t.Fatalf("PING %d at %d a second refused, want the rate kept up", i+1, maxPingsPerSecond)
		}
	}
	for range 1000 { // twice the rate
		now = now.Add(time.Second / (2 * maxPingsPerSecond))
		if !f.ping(now) {
			return
		}
	}
	t.Fatal("1000 PINGs at twice maxPingsPerSecond were all let through")
}

// TestClientTableBounded: the per-client state is bounded: a client's
// entry goes with its last connection once its resets drained, and among
// clients that hold no connection at most maxResetClients are remembered,
// however many addresses reset streams.
func TestClientTableBounded(t *testing.T) {
	now := time.Unix(1e9, 0)
	tab := newClientTable(func() time.Time { return now })
	tab.resetRate.Store(100)
	tab.maxRequests.Store(2)
	l := &Limiter{clients: tab}
	for i := range 5 * maxResetClients {
		client := net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).String()
		c := &trackedConn{l: l}
		if !tab.admit(client, c) {
			t.Fatalf("client %s refused before it reset anything", client)
		}
		tab.reset(c.client, 5)
		tab.closed(c)
		if n := tab.size(); n > maxResetClients+1 {
			t.Fatalf("after %d clients that reset and left: %d entries, want at most %d", i+1, n, maxResetClients+1)
		}
	}
	// A client that resets nothing leaves nothing behind.
	now = now.Add(time.Hour)
	c := &trackedConn{l: l}
	tab.admit("192.0.2.1", c)
	if why := tab.start(c.client); why != "" {
		t.Fatalf("start = %q, want admitted", why)
	}
	if why := tab.start(c.client); why != "" {
		t.Fatalf("second start = %q, want admitted", why)
	}
	if why := tab.start(c.client); why != refusedStreams {
		t.Fatalf("third start with max_requests_per_client 2 = %q, want %q", why, refusedStreams)
	}
	tab.end(c.client)
	tab.end(c.client)
	tab.closed(c)
	tab.mu.Lock()
	_, kept := tab.clients["192.0.2.1"]
	tab.mu.Unlock()
	if kept {
		t.Errorf("a client that closed its last connection and reset nothing is still remembered")
	}
}

// TestClientTableResetRate: a client is refused once its resets pass ten
// seconds' worth of server.max_client_resets_per_second, its connections
// returned to be closed; it is admitted again once they drained, at most
// ten seconds after it stopped.
func TestClientTableResetRate(t *testing.T) {
	now := time.Unix(1e9, 0)
	tab := newClientTable(func() time.Time { return now })
	tab.resetRate.Store(10)
	l := &Limiter{clients: tab}
	a, b := &trackedConn{l: l}, &trackedConn{l: l}
	tab.admit("192.0.2.7", a)
	tab.admit("192.0.2.7", b)
	if shed := tab.reset(a.client, 100); shed != nil {
		t.Fatalf("100 resets at 10/s (ten seconds' worth) shed %d connections, want none", len(shed))
	}
	if shed := tab.reset(a.client, 1); len(shed) != 2 {
		t.Fatalf("the 101st reset shed %d connections, want both of the client's", len(shed))
	}
	tab.reset(a.client, 1e6) // capped
	if !tab.refusing("192.0.2.7") || tab.start(a.client) != refusedResets {
		t.Fatalf("a client past the rate is not refused")
	}
	if tab.refusing("192.0.2.8") {
		t.Errorf("another client is refused")
	}
	now = now.Add(resetWindow * time.Second)
	if tab.refusing("192.0.2.7") {
		t.Errorf("the client is still refused ten seconds after its last reset")
	}
}

// TestClientLimitsInProcess runs the listener's limits in this process
// (so that the race detector sees them) under a rapid-reset attack from
// one address while another address is served. The attacker is refused
// once its resets pass ten seconds' worth of the rate: the test waits for
// that (as long as the attack lasts), not for the probes, which may end
// first on a loaded machine.
func TestClientLimitsInProcess(t *testing.T) {
	l, addr := clientServer(t, 64, config.Server{MaxRequestsPerClient: 16, MaxClientResetsPerSecond: 50})
	// The attack lasts until the attacker is refused, at most this long.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a := &h2attack.Attacker{Addr: addr, From: []string{"127.0.0.1"}}
	wg := a.Run(ctx, 4)
	defer wg.Wait()
	defer cancel()
	refused := func() uint64 { return l.clients.refused[1].Load() } // reason resets
	probeServed(t, addr, 10)
	for refused() == 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if refused() == 0 {
		t.Errorf("the resetting client was never refused (%d streams reset on %d connections)", a.Streams.Load(), a.Conns.Load())
	}
}

// clientLoad drives one client of tab for secs seconds, in steps of 100
// ms: each step it is served served requests (started and ended) and
// resets resets streams, of which opened also started a handler first (a
// stream reset after its handler started counts as opened; one reset
// before Go's server ran its handler does not). It returns the second at
// which the client was refused (its connections returned to be closed, or
// a request or connection refused for its resets), or 0 if it never was.
func clientLoad(t *testing.T, tab *clientTable, now *time.Time, client string, secs, served, resets, opened int) int {
	t.Helper()
	c := &trackedConn{l: &Limiter{clients: tab}}
	if !tab.admit(client, c) {
		return -1
	}
	defer tab.closed(c)
	for step := 1; step <= secs*10; step++ {
		*now = now.Add(100 * time.Millisecond)
		for range served {
			if why := tab.start(c.client); why != "" {
				return (step + 9) / 10
			}
			tab.end(c.client)
		}
		for i := range resets {
			if i < opened {
				if why := tab.start(c.client); why != "" {
					return (step + 9) / 10
				}
				tab.end(c.client)
			}
			if shed := tab.reset(c.client, 1); shed != nil {
				return (step + 9) / 10
			}
		}
		if tab.refusing(client) {
			return (step + 9) / 10
		}
	}
	return 0
}

// TestResetsJudgedAgainstStreams (the review's
// TestReviewGatewayCancellationsLockOut, with the requests it says the
// gateway is served): a client is refused for its resets only when they
// pass server.max_client_resets_per_second and are more than half the
// streams it opened. A gateway (one address) serving 2,000 requests a
// second whose users cancel 6 % (120 resets a second, over the default
// 100) is served for two minutes; rapid reset, and the padded variants an
// attacker tries next with fewer than one served request per reset, are
// refused (within seconds at these rates, ten seconds' worth of the rate
// over it); one served request per reset or more is not
// refused, each reset costing the attacker a served request.
func TestResetsJudgedAgainstStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		// per 100 ms: requests served, streams reset, of which with a
		// handler started first
		served, resets, opened int
		secs                   int
		refused                bool
	}{
		{"gateway: 2,000 requests a second, 6 % cancelled", 188, 12, 12, 120, false},
		{"gateway: 10 % cancelled, at 5,000 a second", 450, 50, 50, 60, false},
		{"rapid reset, every handler started", 0, 200, 200, 10, true},
		{"rapid reset, reset before the handler ran", 0, 200, 0, 10, true},
		{"slow resets, 150 a second", 0, 15, 15, 30, true},
		{"padded: one served request per two resets", 100, 200, 200, 10, true},
		{"padded: one served request per reset, resets before the handler ran", 200, 200, 0, 10, true},
		{"padded: one served request per reset", 200, 200, 200, 30, false},
		{"padded: three served requests per reset", 600, 200, 200, 30, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1e9, 0)
			tab := newClientTable(func() time.Time { return now })
			tab.resetRate.Store(100)
			got := clientLoad(t, tab, &now, "10.0.0.7", tc.secs, tc.served, tc.resets, tc.opened)
			if tc.refused && got == 0 {
				t.Errorf("never refused in %d s, want refused", tc.secs)
			}
			if !tc.refused && got != 0 {
				t.Errorf("refused after %d s, want served for all %d s", got, tc.secs)
			}
		})
	}
}

// TestVictimIsAResettingClient: at max_connections in flight, a client
// holding requests gives way to another client's stream only when its
// resets are a real share of its streams (at least minShedResets, more
// than half of those it opened), never a gateway whose users cancel a few
// requests, nor a client with one stray reset.
func TestVictimIsAResettingClient(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		served, resets, opened int // per 100 ms for one second, as clientLoad
		shed                   bool
	}{
		{"reset 20 of 28 streams", 1, 2, 2, true},
		{"one stray reset", 0, 0, 0, false}, // the reset is added below
		{"gateway: 6 % cancelled", 188, 12, 12, false},
		{"padded: one served request per reset", 20, 20, 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1e9, 0)
			tab := newClientTable(func() time.Time { return now })
			tab.resetRate.Store(100)
			l := &Limiter{clients: tab}
			holder := &trackedConn{l: l}
			tab.admit("10.0.0.7", holder)
			for range 10 {
				now = now.Add(100 * time.Millisecond)
				for range tc.served {
					tab.start(holder.client)
					tab.end(holder.client)
				}
				for range tc.resets {
					tab.start(holder.client)
					tab.end(holder.client)
					tab.reset(holder.client, 1)
				}
			}
			if tc.resets == 0 {
				tab.start(holder.client)
				tab.end(holder.client)
				tab.reset(holder.client, 1)
			}
			// The holder's requests in flight.
			for range 8 {
				if why := tab.start(holder.client); why != "" {
					t.Fatalf("the holder's request refused: %s", why)
				}
			}
			now = now.Add(200 * time.Millisecond)
			newcomer := &trackedConn{l: l}
			tab.admit("10.0.0.8", newcomer)
			tab.start(newcomer.client)
			got := tab.victim(newcomer.client)
			if tc.shed && len(got) != 1 {
				t.Errorf("victim = %d connections, want the holder's one", len(got))
			}
			if !tc.shed && got != nil {
				t.Errorf("victim = the holder's %d connections, want none (the newcomer is refused)", len(got))
			}
		})
	}
}
