package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// rawH2 is a hand-driven HTTP/2 connection (see h2attack for why by
// hand).
type rawH2 struct {
	net.Conn
	w *bufio.Writer
	r *bufio.Reader
}

// dialH2 opens an HTTP/2 connection from the address from and sends the
// preface and an empty SETTINGS frame.
func dialH2(t *testing.T, addr, from string) *rawH2 {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &rawH2{Conn: c, w: bufio.NewWriter(c), r: bufio.NewReader(c)}
	h.w.WriteString(h2attack.Preface)
	h2attack.WriteFrame(h.w, h2attack.FrameSettings, 0, 0, nil)
	return h
}

func (h *rawH2) flush() error {
	h.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return h.w.Flush()
}

// request opens stream id with the given fields (pseudo-header fields
// included); endStream ends it without a body.
func (h *rawH2) request(id uint32, endStream bool, fields ...string) {
	flags := byte(h2attack.FlagEndHeaders)
	if endStream {
		flags |= h2attack.FlagEndStream
	}
	h2attack.WriteFrame(h.w, h2attack.FrameHeaders, flags, id, h2attack.HPACKLiteral(fields...))
}

func (h *rawH2) reset(id uint32) {
	var code [4]byte
	binary.BigEndian.PutUint32(code[:], h2attack.ErrCodeCancel)
	h2attack.WriteFrame(h.w, h2attack.FrameRSTStream, 0, id, code[:])
}

// next reads the next frame's type, flags and stream, skipping its
// payload.
func (h *rawH2) next() (typ, flags byte, stream uint32, err error) {
	var hdr [9]byte
	if _, err = io.ReadFull(h.r, hdr[:]); err != nil {
		return 0, 0, 0, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	if _, err = io.CopyN(io.Discard, h.r, int64(n)); err != nil {
		return 0, 0, 0, err
	}
	return hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff, nil
}

// answered waits up to 10 s for a HEADERS frame on stream id. It returns
// nil if one came, else why not (the connection closed, or the wait ran
// out).
func (h *rawH2) answered(id uint32) error {
	h.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer h.SetReadDeadline(time.Time{})
	for {
		typ, _, stream, err := h.next()
		if err != nil {
			return err
		}
		if typ == h2attack.FrameHeaders && stream == id {
			return nil
		}
	}
}

// closedWithin reports whether the proxy closes the connection within d,
// and what else it did.
func (h *rawH2) closedWithin(d time.Duration) (bool, error) {
	h.SetReadDeadline(time.Now().Add(d))
	defer h.SetReadDeadline(time.Time{})
	for {
		if _, _, _, err := h.next(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return false, err
			}
			return true, err
		}
	}
}

// postAwaitingBody is a POST /charges whose body is announced, not sent.
var postAwaitingBody = []string{":method", "POST", ":scheme", "http", ":path", "/charges", ":authority", "proxy",
	"content-type", "application/json", "content-length", "40"}

// TestEmptyContinuationFloodClosesTheConnection: Go's server bounds the
// header bytes a header block decodes to, not its frames: a HEADERS frame
// followed by CONTINUATION frames that add nothing was read for ever. Such
// a run closes the connection, as does the variant with frames holding one
// HPACK table-size update each (a byte that decodes to no field); a header
// block split over a few CONTINUATION frames is served.
func TestEmptyContinuationFloodClosesTheConnection(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	floods := 0.0
	for _, tc := range []struct {
		name   string
		frames int
		frag   []byte // each CONTINUATION frame's payload
		closed bool
	}{
		{"empty CONTINUATION frames", 10000, nil, true},
		{"CONTINUATION frames of a table-size update each", 10000, []byte{0x20}, true},
		{"a header block over three CONTINUATION frames", 3, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := dialH2(t, p.addr, "127.0.0.1")
			block := h2attack.HPACKLiteral(h2attack.GetFields("/orders/ORD-CONT/charges")...)
			if tc.closed {
				h2attack.WriteFrame(h.w, h2attack.FrameHeaders, h2attack.FlagEndStream, 1, block)
				for range tc.frames {
					h2attack.WriteFrame(h.w, h2attack.FrameContinuation, 0, 1, tc.frag)
				}
				h.flush() // the proxy may close the connection before all is written
				closed, err := h.closedWithin(10 * time.Second)
				if !closed {
					t.Fatalf("after %d CONTINUATION frames the connection is still open (%v), want it closed", tc.frames, err)
				}
				floods++
				if got := scrapeValue(t, p, "idemproxy_http2_continuation_floods_total"); got != floods {
					t.Errorf("idemproxy_http2_continuation_floods_total = %v, want %v", got, floods)
				}
				return
			}
			// HEADERS and three CONTINUATION frames, each a part of the block.
			third := len(block) / 4
			h2attack.WriteFrame(h.w, h2attack.FrameHeaders, h2attack.FlagEndStream, 1, block[:third])
			h2attack.WriteFrame(h.w, h2attack.FrameContinuation, 0, 1, block[third:2*third])
			h2attack.WriteFrame(h.w, h2attack.FrameContinuation, 0, 1, block[2*third:3*third])
			h2attack.WriteFrame(h.w, h2attack.FrameContinuation, h2attack.FlagEndHeaders, 1, block[3*third:])
			if err := h.flush(); err != nil {
				t.Fatal(err)
			}
			if err := h.answered(1); err != nil {
				t.Fatalf("a header block over CONTINUATION frames: no answer: %v", err)
			}
		})
	}
}

// TestClientStreamCap: one client (one address) has at most
// server.max_requests_per_client requests in flight over all its
// connections and protocols; one more is answered 503 overloaded naming the
// setting and the client, at once and without reaching the upstream, while
// another client is served.
func TestClientStreamCap(t *testing.T) {
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(0, "max_requests_per_client: 2"), chargesRoute))
	h1, h2 := h2attack.ProbeClients("127.0.0.1")
	held := make(chan result, 2)
	for _, c := range []*http.Client{h1, h2} {
		go func() {
			r, _ := doWith(c, "GET", p.url("/hold"), "")
			held <- r
		}()
	}
	eventually(t, "two requests held at the upstream", func() bool { return up.held.Load() == 2 })
	for _, tc := range []struct {
		name  string
		c     *http.Client
		proto int
	}{{"HTTP/2", h2, 2}, {"HTTP/1.1", h1, 1}} {
		r, proto := doWith(tc.c, "POST", p.url("/charges"), `{"orderId": "ORD-CAP", "amount": 1}`)
		if r.status != 503 || problemType(r) != "overloaded" || proto != tc.proto || r.header.Get("Retry-After") != "1" {
			t.Fatalf("a third request over %s = %d %q (HTTP/%d) %v, want 503 overloaded with Retry-After: 1", tc.name, r.status, r.body, proto, r.err)
		}
		var prob struct {
			Detail, Setting, Client string
			Limit                   int
		}
		json.Unmarshal([]byte(r.body), &prob)
		if prob.Setting != "server.max_requests_per_client" || prob.Client != "127.0.0.1" || prob.Limit != 2 ||
			!strings.Contains(prob.Detail, "server.max_requests_per_client") {
			t.Errorf("the refusal = %s, want setting server.max_requests_per_client, client 127.0.0.1, limit 2", r.body)
		}
	}
	up.mu.Lock()
	seen := len(up.seen)
	up.mu.Unlock()
	if seen != 2 {
		t.Errorf("the upstream saw %d requests, want the 2 held (the refused ones never reach it)", seen)
	}
	o1, o2 := h2attack.ProbeClients("127.0.0.2")
	for _, c := range []*http.Client{o1, o2} {
		if r, _ := doWith(c, "POST", p.url("/charges"), `{"orderId": "ORD-OTHER", "amount": 1}`); r.status != 200 {
			t.Errorf("another client = %d %q %v, want its answer", r.status, r.body, r.err)
		}
	}
	if got := scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="streams"}`); got != 2 {
		t.Errorf(`idemproxy_client_streams_refused_total{reason="streams"} = %v, want 2`, got)
	}
	if l := p.log.logLines("request refused: this client has server.max_requests_per_client requests in flight"); len(l) == 0 ||
		l[0]["reason"] != "streams" || l[0]["client"] != "127.0.0.1" || l[0]["setting"] != "server.max_requests_per_client" {
		t.Errorf("the refusal's log line = %v, want reason, client and setting", l)
	}
	close(up.release)
	for range 2 {
		if r := <-held; r.status != 200 {
			t.Errorf("a held request = %d %v, want 200", r.status, r.err)
		}
	}
}

// TestClientStreamCapReload: a reload applies server.max_requests_per_client
// to the requests that start from then on.
func TestClientStreamCapReload(t *testing.T) {
	t.Parallel()
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	path, data := filepath.Join(dir, "c.yaml"), filepath.Join(dir, "data")
	writeConfig(t, path, up.URL, data, serverLimits(0, "max_requests_per_client: 1"), chargesRoute)
	p := startProxy(t, path)
	h1, _ := h2attack.ProbeClients("127.0.0.1")
	held := make(chan result, 1)
	go func() {
		r, _ := doWith(h1, "GET", p.url("/hold"), "")
		held <- r
	}()
	eventually(t, "a request held at the upstream", func() bool { return up.held.Load() == 1 })
	if r, _ := doWith(h1, "GET", p.url("/warm"), ""); r.status != 503 {
		t.Fatalf("a second request with max_requests_per_client 1 = %d, want 503", r.status)
	}
	writeConfig(t, path, up.URL, data, serverLimits(0, "max_requests_per_client: 2"), chargesRoute)
	p.signal(syscall.SIGHUP)
	eventually(t, "the reload", func() bool { return len(p.log.logLines("configuration reloaded")) == 1 })
	if r, _ := doWith(h1, "GET", p.url("/warm"), ""); r.status != 200 {
		t.Errorf("a second request after the reload to 2 = %d %q, want 200", r.status, r.body)
	}
	close(up.release)
	<-held
}

// TestResettingClientIsRefused: a client that resets streams faster than
// server.max_client_resets_per_second (for ten seconds' worth at once) has
// its connection closed; a new connection from it is closed at once, while
// other clients are served; once its resets drain (within ten seconds) it
// is served again.
func TestResettingClientIsRefused(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(0, "max_client_resets_per_second: 10"), chargesRoute))
	h := dialH2(t, p.addr, "127.0.0.1")
	// 100 resets are allowed at once (ten seconds' worth); 300 are sent,
	// each stream's handler waiting for its body when it is reset.
	for id := uint32(1); id < 600; id += 2 {
		h.request(id, false, postAwaitingBody...)
		h.reset(id)
		h.flush()
		time.Sleep(time.Millisecond)
	}
	if closed, err := h.closedWithin(10 * time.Second); !closed {
		t.Fatalf("the resetting client's connection is still open (%v), want it closed", err)
	}
	again := dialH2(t, p.addr, "127.0.0.1")
	again.request(1, true, h2attack.GetFields("/orders/ORD-R/charges")...)
	again.flush()
	if closed, err := again.closedWithin(10 * time.Second); !closed {
		t.Errorf("a new connection from the resetting client is open (%v), want it closed at once", err)
	}
	o1, o2 := h2attack.ProbeClients("127.0.0.2")
	for _, c := range []*http.Client{o1, o2} {
		if r, _ := doWith(c, "POST", p.url("/charges"), `{"orderId": "ORD-R-OTHER", "amount": 1}`); r.status != 201 {
			t.Errorf("another client = %d %q %v, want 201", r.status, r.body, r.err)
		}
	}
	if got := scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="resets"}`); got < 1 {
		t.Errorf(`idemproxy_client_streams_refused_total{reason="resets"} = %v, want at least 1`, got)
	}
	if got := scrapeValue(t, p, "idemproxy_client_stream_resets_total"); got < 100 {
		t.Errorf("idemproxy_client_stream_resets_total = %v, want at least 100", got)
	}
	// Served again once its resets drained.
	c1, _ := h2attack.ProbeClients("127.0.0.1")
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, _ := doWith(c1, "POST", p.url("/charges"), `{"orderId": "ORD-R-LATER", "amount": 1}`)
		if r.status == 201 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client, 30 s after it stopped resetting: %d %v, want 201", r.status, r.err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestGlobalLimitShedsTheResettingClient: with many addresses each under
// its own caps, the requests in flight (max_connections) decide. A client
// that has reset streams lately and holds requests gives way to a new
// stream from a client that has not: its connections are closed and the
// newcomer served. A client that holds requests without resetting is not
// shed: the newcomer is refused, as before.
func TestGlobalLimitShedsTheResettingClient(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resets int
		want   int
	}{
		{"the holder reset streams", 20, 200},
		{"the holder reset none", 0, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startHoldingUpstream(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
				serverLimits(8, "max_requests_per_client: 8"), chargesRoute))
			h := dialH2(t, p.addr, "127.0.0.3")
			id := uint32(1)
			for range tc.resets {
				h.request(id, false, postAwaitingBody...)
				h.flush()
				time.Sleep(5 * time.Millisecond)
				h.reset(id)
				h.flush()
				id += 2
			}
			eventually(t, "the resets counted", func() bool {
				return scrapeValue(t, p, "idemproxy_client_stream_resets_total") == float64(tc.resets)
			})
			for range 8 {
				h.request(id, true, h2attack.GetFields("/hold")...)
				id += 2
			}
			h.flush()
			eventually(t, "eight streams held at the upstream", func() bool { return up.held.Load() == 8 })
			_, h2 := h2attack.ProbeClients("127.0.0.2")
			r, _ := doWith(h2, "POST", p.url("/charges"), `{"orderId": "ORD-SHED", "amount": 1}`)
			if r.status != tc.want {
				t.Errorf("a stream from another client at the limit = %d %q %v, want %d", r.status, r.body, r.err, tc.want)
			}
			shed := scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="shed"}`)
			closed, _ := h.closedWithin(time.Second)
			if tc.want == 200 && (shed != 1 || !closed) {
				t.Errorf("the resetting holder: shed %v, its connection closed %v; want 1, true", shed, closed)
			}
			if tc.want == 503 && (shed != 0 || closed) {
				t.Errorf("the holder that reset nothing: shed %v, its connection closed %v; want 0, false", shed, closed)
			}
		})
	}
}

// TestGatewayCancellationsAreServed: a gateway (one address, here with
// server.max_client_resets_per_second at 1 so that a short run is far
// over it) whose users cancel one request in ten, each cancellation an
// RST_STREAM sent while its body is on the way, is served throughout:
// its resets are a small share of the streams it opens. Before resets
// were judged against streams, its connections were closed after about a
// dozen cancellations and it was refused.
func TestGatewayCancellationsAreServed(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(0, "max_client_resets_per_second: 1", "max_requests_per_client: 1024"), chargesRoute))
	_, gw := h2attack.ProbeClients("127.0.0.1")
	const workers, each = 8, 150 // 1,200 requests, 120 of them cancelled
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if i%10 == 9 {
					// A user cancels: the body never completes.
					pr, pw := io.Pipe()
					ctx, cancel := context.WithCancel(context.Background())
					req, _ := http.NewRequestWithContext(ctx, "POST", p.url("/charges"), pr)
					req.ContentLength = 40
					req.Header.Set("Content-Type", "application/json")
					go func() { pw.Write([]byte(`{"orderId": `)); time.Sleep(5 * time.Millisecond); cancel() }()
					if resp, err := gw.Do(req); err == nil {
						resp.Body.Close()
					}
					pw.Close()
					continue
				}
				r, proto := doWith(gw, "POST", p.url("/charges"), fmt.Sprintf(`{"orderId": "GW-%d-%d", "amount": 1}`, w, i))
				if r.status != 201 || proto != 2 {
					if failed.Add(1) <= 5 {
						t.Errorf("gateway request %d/%d = %d HTTP/%d %q %v, want 201 over HTTP/2", w, i, r.status, proto, r.body, r.err)
					}
				}
			}
		})
	}
	wg.Wait()
	resets := scrapeValue(t, p, "idemproxy_client_stream_resets_total")
	refused := scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="resets"}`)
	t.Logf("gateway: %d requests, %v resets counted, %d failed, %v refusals for resets", workers*each, resets, failed.Load(), refused)
	if resets < 20 {
		t.Errorf("idemproxy_client_stream_resets_total = %v, want the cancellations counted (at least 20, twice the allowance at once)", resets)
	}
	if refused != 0 {
		t.Errorf(`idemproxy_client_streams_refused_total{reason="resets"} = %v, want 0 for a gateway`, refused)
	}
}
