package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
)

// frames returns the preface followed by the frames each call of add
// writes.
func frames(add func(w *bufio.Writer)) []byte {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	w.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	writeFrame(w, frameSettings, 0, 0, nil)
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
	block := hpackLiteral(get("/x")...)
	var rst [4]byte
	for _, tc := range []struct {
		name   string
		bytes  []byte
		ok     bool
		resets int
	}{
		{"16 empty CONTINUATION frames", frames(func(w *bufio.Writer) {
			writeFrame(w, frameHeaders, 0, 1, block)
			for range maxEmptyContinuations {
				writeFrame(w, frameContinuation, 0, 1, nil)
			}
		}), true, 0},
		{"17 empty CONTINUATION frames", frames(func(w *bufio.Writer) {
			writeFrame(w, frameHeaders, 0, 1, block)
			for range maxEmptyContinuations + 1 {
				writeFrame(w, frameContinuation, 0, 1, nil)
			}
		}), false, 0},
		{"empty runs broken by other frames", frames(func(w *bufio.Writer) {
			for i := range uint32(40) {
				writeFrame(w, frameHeaders, 0, 2*i+1, block)
				for range maxEmptyContinuations - 1 {
					writeFrame(w, frameContinuation, 0, 2*i+1, nil)
				}
				writeFrame(w, frameContinuation, flagEndHeaders, 2*i+1, nil)
			}
		}), true, 0}, // 40 runs of 16 empty frames each
		{"513 one-byte CONTINUATION frames", frames(func(w *bufio.Writer) {
			writeFrame(w, frameHeaders, 0, 1, block)
			for range maxContinuations + 1 {
				writeFrame(w, frameContinuation, 0, 1, []byte{0x20})
			}
		}), false, 0},
		{"a header block over CONTINUATION frames", frames(func(w *bufio.Writer) {
			writeFrame(w, frameHeaders, 0, 1, block[:4])
			writeFrame(w, frameContinuation, 0, 1, block[4:8])
			writeFrame(w, frameContinuation, flagEndHeaders, 1, block[8:])
		}), true, 0},
		{"a payload that looks like CONTINUATION headers", frames(func(w *bufio.Writer) {
			var fake bytes.Buffer
			fw := bufio.NewWriter(&fake)
			for range 100 {
				writeFrame(fw, frameContinuation, 0, 1, nil)
			}
			fw.Flush()
			writeFrame(w, 0x0 /* DATA */, 0, 1, fake.Bytes())
		}), true, 0},
		{"RST_STREAM frames", frames(func(w *bufio.Writer) {
			for i := range uint32(7) {
				writeFrame(w, frameHeaders, flagEndHeaders, 2*i+1, block)
				writeFrame(w, frameRSTStream, 0, 2*i+1, rst[:])
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

// TestClientTableBounded: the per-client state is bounded: a client's
// entry goes with its last connection once its resets drained, and among
// clients that hold no connection at most maxResetClients are remembered,
// however many addresses reset streams.
func TestClientTableBounded(t *testing.T) {
	now := time.Unix(1e9, 0)
	tab := newClientTable(func() time.Time { return now })
	tab.resetRate.Store(100)
	tab.maxRequests.Store(2)
	l := &connLimiter{clients: tab}
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
	l := &connLimiter{clients: tab}
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
// (so that the race detector sees them) under a short rapid-reset attack
// from one address while another address is served.
func TestClientLimitsInProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newConnLimiter(ln, 64, time.Second)
	l.setClientLimits(config.Server{MaxRequestsPerClient: 16, MaxClientResetsPerSecond: 50})
	srv := &http.Server{
		Handler: l.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		})),
		ConnState: l.ConnState, ConnContext: l.ConnContext,
		Protocols: serverProtocols(), HTTP2: serverHTTP2(),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	a := &h2Attacker{addr: ln.Addr().String(), from: []string{"127.0.0.1"}}
	wg := a.run(ctx, 4)
	defer wg.Wait()
	defer cancel()
	h1, h2 := probeClients("127.0.0.2")
	for i := range 10 {
		for _, c := range []*http.Client{h1, h2} {
			r, _ := doWith(c, "POST", "http://"+ln.Addr().String()+"/charges", `{}`)
			if r.status != 200 {
				t.Errorf("probe %d = %d %v, want 200", i, r.status, r.err)
			}
		}
	}
	if got := l.clients.refused[1].Load(); got == 0 {
		t.Errorf("the resetting client was never refused")
	}
}
