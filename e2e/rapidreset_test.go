package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The attacker below writes HTTP/2 frames by hand over a raw TCP
// connection: golang.org/x/net is not a dependency of this module (the
// standard library's HTTP/2 is not exported), and the few frames an
// attack needs (HEADERS with literal HPACK fields, RST_STREAM,
// CONTINUATION) take a few lines each.

// HTTP/2 frame types and flags (RFC 9113 section 6).
const (
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagEndHeaders = 0x4

	errCodeCancel = 0x8
)

// writeFrame appends one frame to w.
func writeFrame(w *bufio.Writer, typ, flags byte, stream uint32, payload []byte) {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream&0x7fffffff)
	w.Write(h[:])
	w.Write(payload)
}

// hpackLiteral encodes header fields as literals without indexing, no
// Huffman coding (RFC 7541 section 6.2.2); every name and value is
// shorter than 127 bytes.
func hpackLiteral(fields ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(fields); i += 2 {
		b = append(b, 0x00, byte(len(fields[i])))
		b = append(b, fields[i]...)
		b = append(b, byte(len(fields[i+1])))
		b = append(b, fields[i+1]...)
	}
	return b
}

// h2Attacker opens HTTP/2 connections to addr from the address from and,
// on each, opens streams and resets them at once, reconnecting whenever
// the proxy closes a connection. It stops when ctx is done.
type h2Attacker struct {
	addr string
	from []string // the addresses its connections come from, in turn
	// endStream sends each HEADERS with END_STREAM (a request without a
	// body); otherwise the stream stays open for a body that never comes,
	// then is reset.
	endStream bool
	// pause, if set, is waited between streams (a slow reset).
	pause time.Duration
	// pad is how many requests it completes (a GET the upstream answers)
	// for each stream it resets: the variant that pads its resets with
	// served requests so that they are not most of its streams.
	pad int

	streams, conns atomic.Int64
}

func (a *h2Attacker) run(ctx context.Context, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range n {
		from := a.from[i%len(a.from)]
		wg.Go(func() {
			for ctx.Err() == nil {
				a.conn(ctx, from)
			}
		})
	}
	return &wg
}

// conn runs one connection until the proxy closes it or ctx is done.
func (a *h2Attacker) conn(ctx context.Context, from string) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", a.addr)
	if err != nil {
		time.Sleep(10 * time.Millisecond)
		return
	}
	a.conns.Add(1)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, c); close(done); c.Close() }()
	w := bufio.NewWriterSize(c, 64<<10)
	w.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	writeFrame(w, frameSettings, 0, 0, nil)
	hdr := hpackLiteral(":method", "POST", ":scheme", "http", ":path", "/charges",
		":authority", "proxy", "content-type", "application/json", "content-length", "40")
	flags := byte(flagEndHeaders)
	if a.endStream {
		flags |= flagEndStream
	}
	padHdr := hpackLiteral(get("/orders/ORD-PAD/charges")...)
	var rst [4]byte
	binary.BigEndian.PutUint32(rst[:], errCodeCancel)
	for id := uint32(1); id < 1<<30; id += 2 {
		writeFrame(w, frameHeaders, flags, id, hdr)
		writeFrame(w, frameRSTStream, 0, id, rst[:])
		a.streams.Add(1)
		for range a.pad {
			id += 2
			writeFrame(w, frameHeaders, flagEndHeaders|flagEndStream, id, padHdr)
		}
		if a.pause > 0 || id%64 == 63 {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if w.Flush() != nil {
				return
			}
		}
		if a.pause > 0 {
			select {
			case <-time.After(a.pause):
			case <-done:
				return
			}
		}
		select {
		case <-done:
			return
		default:
		}
	}
}

// probeClients returns an HTTP/1.1 and an HTTP/2 client whose connections
// come from the address from.
func probeClients(from string) (h1, h2 *http.Client) {
	dial := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}).DialContext
	var p1, p2 http.Protocols
	p1.SetHTTP1(true)
	p2.SetUnencryptedHTTP2(true)
	h1 = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: &p1, DialContext: dial, DisableKeepAlives: true}}
	h2 = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: &p2, DialContext: dial}}
	return h1, h2
}

// probe sends n charges, one at a time, from each client and returns
// their latencies; it fails the test for any answer but 201.
func probe(t *testing.T, p *proc, name string, c *http.Client, n int, wantProto int) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for i := range n {
		start := time.Now()
		r, proto := doWith(c, "POST", p.url("/charges"), fmt.Sprintf(`{"orderId": "PROBE-%s-%d", "amount": 10}`, name, i))
		d := time.Since(start)
		lat = append(lat, d)
		if r.status != 201 || proto != wantProto {
			t.Errorf("%s probe %d during the attack = %d HTTP/%d %q %v after %v, want 201 over HTTP/%d", name, i, r.status, proto, r.body, r.err, d, wantProto)
		} else if d > 10*time.Second {
			t.Errorf("%s probe %d took %v, want well under 10s", name, i, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return lat
}

func summary(lat []time.Duration) string {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var parts []string
	for _, d := range s {
		parts = append(parts, d.Round(100*time.Microsecond).String())
	}
	return strings.Join(parts, " ")
}

// TestRapidResetDoesNotLockOutOtherClients is the attack: 24
// reconnecting HTTP/2 connections from one address, each opening streams
// and resetting them at once. Every probe from another address, over
// HTTP/1.1 and HTTP/2, gets its real answer.
func TestRapidResetDoesNotLockOutOtherClients(t *testing.T) {
	var spread []string
	for i := range 24 {
		spread = append(spread, fmt.Sprintf("127.0.0.%d", 10+i))
	}
	for _, tc := range []struct {
		name      string
		from      []string
		endStream bool
		pause     time.Duration
		pad       int
	}{
		{"streams reset while their body is awaited", []string{"127.0.0.1"}, false, 0, 0},
		{"streams reset after END_STREAM", []string{"127.0.0.1"}, true, 0, 0},
		// The variants an attacker tries next: resets spread out in time
		// (each connection a stream every 2 ms), and the connections
		// spread over 24 addresses, one each.
		{"slow resets", []string{"127.0.0.1"}, false, 2 * time.Millisecond, 0},
		{"one connection from each of 24 addresses", spread, false, 0, 0},
		// Resets padded with served requests, one or three per reset, so
		// that they are at most half the client's streams: not refused
		// for its resets, but each reset costs it a request the upstream
		// answers, and its requests stay within max_requests_per_client.
		{"one served request per reset", []string{"127.0.0.1"}, false, 0, 1},
		{"three served requests per reset", []string{"127.0.0.1"}, false, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
			h1, h2 := probeClients("127.0.0.2")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			a := &h2Attacker{addr: p.addr, from: tc.from, endStream: tc.endStream, pause: tc.pause, pad: tc.pad}
			wg := a.run(ctx, 24)
			defer wg.Wait()
			defer cancel()
			time.Sleep(2 * time.Second) // the attack under way
			cpu0 := procCPU(p.cmd.Process.Pid)
			t0 := time.Now()
			l1 := probe(t, p, "h1", h1, 5, 1)
			l2 := probe(t, p, "h2", h2, 5, 2)
			cpu := (procCPU(p.cmd.Process.Pid) - cpu0).Seconds() / time.Since(t0).Seconds()
			t.Logf("attack: %d streams opened and reset (written) on %d connections; proxy CPU during the probes %.0f%% of a core", a.streams.Load(), a.conns.Load(), cpu*100)
			t.Logf("HTTP/1.1 probe latencies: %s", summary(l1))
			t.Logf("HTTP/2 probe latencies: %s", summary(l2))
			if got := scrapeValue(t, p, "idemproxy_client_stream_resets_total"); got == 0 {
				t.Errorf("idemproxy_client_stream_resets_total = 0 after the attack, want the resets counted")
			}
			t.Logf("refused: streams %v, resets %v, shed %v; global %v",
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="streams"}`),
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="resets"}`),
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="shed"}`),
				scrapeValue(t, p, "idemproxy_http2_streams_refused_total"))
		})
	}
}
