//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// socketsOf counts the open sockets of process pid.
func socketsOf(pid int) int {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// TestIdleConnectionsDoNotLockOutNewClients is the case: more
// keep-alive connections than max_connections, each idle after one
// request. Every newcomer is served, the oldest idle connections are the
// ones closed to admit it, and the process never holds more client
// connections than the limit (plus the one being admitted).
//
// The 1100 clients connect one after the other, which on a busy machine
// takes longer than the default idle_timeout (120 s): the oldest would
// then be closed for their idleness, not shed to admit a newcomer, and
// the counts below would not add up. idle_timeout is an hour, so only
// shedding closes them, however long the machine takes.
func TestIdleConnectionsDoNotLockOutNewClients(t *testing.T) {
	for _, tt := range []struct {
		name      string
		max, idle int
	}{
		{"50 of 60", 50, 60},
		{"the default 1024, 1100 idle", 0, 1100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			limit := tt.max
			if limit == 0 {
				limit = 1024
			}
			up := startStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
				serverLimits(tt.max, "idle_timeout: 1h"), chargesRoute))
			pid := p.cmd.Process.Pid
			// The baseline: listeners, the store, a pooled upstream connection.
			if r := do("GET", p.url("/charges"), ""); r.status != 200 {
				t.Fatalf("warm-up: %d %v", r.status, r.err)
			}
			base := socketsOf(pid)
			var peak atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					if n := int64(socketsOf(pid)); n > peak.Load() {
						peak.Store(n)
					}
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}()

			conns := make([]*h2attack.RawConn, tt.idle)
			admitted := func() float64 { // idle now, or idle once and shed since: one scrape
				scrape := do("GET", p.adminURL("/metrics"), "").body
				var sum float64
				for _, series := range []string{"idemproxy_connections_idle", "idemproxy_connections_shed_total"} {
					v, _ := metricValue(scrape, series)
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						t.Fatalf("%s = %q: %v", series, v, err)
					}
					sum += f
				}
				return sum
			}
			wantShed := tt.idle + 2 - limit // the idle ones, the warm-up's and the charge's, over the limit
			// The count only grows, by one for each client (one shed to
			// admit it takes nothing off): each wait starts from where
			// the last one ended, one scrape per check.
			before, pending := admitted(), 0
			for i := range conns {
				conns[i] = h2attack.DialRaw(t, p.addr)
				if st, body, err := conns[i].Get("/charges"); err != nil || st != 200 {
					t.Fatalf("idle client %d of %d (limit %d): %d %q %v", i+1, tt.idle, limit, st, body, err)
				}
				pending++
				// The server marks a connection idle after its answer is
				// on the wire, and sheds the one idle longest: wait for
				// each, so that the connections turn idle, and are shed,
				// in the order they were opened. The clients between the
				// ones that will be shed (and a margin) and the last few
				// below the limit are shed by no one: they only have to
				// be idle before the limit is reached, and are waited
				// for together.
				if i >= wantShed+5 && i < limit-3 {
					continue
				}
				eventually(t, fmt.Sprintf("idle client %d turns idle", i+1), func() bool {
					n := admitted()
					if n >= before+float64(pending) {
						before, pending = n, 0
						return true
					}
					return false
				})
			}
			// A new client is served while they all stay idle.
			if r := charge(p, "ORD-CONN-1"); r.status != 201 {
				t.Fatalf("new client = %d %s %v, want 201", r.status, r.body, r.err)
			}
			close(stop)
			<-sampled

			if got := scrapeValue(t, p, "idemproxy_connections_shed_total"); got != float64(wantShed) {
				t.Errorf("idemproxy_connections_shed_total = %v, want %d", got, wantShed)
			}
			active := scrapeValue(t, p, "idemproxy_connections_active")
			idle := scrapeValue(t, p, "idemproxy_connections_idle")
			if active+idle != float64(limit) {
				t.Errorf("connections active %v + idle %v, want %d in all", active, idle, limit)
			}
			// The upstream side may add a few pooled connections.
			if got := int(peak.Load()) - base; got > limit+1+4 {
				t.Errorf("the proxy held %d more sockets than at the start, want at most the limit %d + 1 (+4 upstream)", got, limit)
			}
			// The oldest were closed; the newest are still open.
			for i := range wantShed - 2 {
				eventually(t, fmt.Sprintf("idle client %d closed", i+1), conns[i].ClosedByPeer)
			}
			for i := tt.idle - 5; i < tt.idle; i++ {
				if conns[i].ClosedByPeer() {
					t.Errorf("idle client %d of %d was closed, not one of the oldest", i+1, tt.idle)
				}
			}
		})
	}
}

// TestEveryConnectionBusy: when every connection serves a request (an
// HTTP/1.1 request, or an HTTP/2 stream), /readyz is 503 naming the limit,
// a newcomer waits (counted) instead of taking a busy connection's place,
// and every request is answered once they end.
func TestEveryConnectionBusy(t *testing.T) {
	for _, tt := range []struct {
		name   string
		client func() *http.Client
	}{
		{"HTTP/1.1", func() *http.Client { return &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second} }},
		{"HTTP/2 with prior knowledge", h2cClient},
	} {
		t.Run(tt.name, func(t *testing.T) { everyConnectionBusy(t, tt.client) })
	}
}

func everyConnectionBusy(t *testing.T, client func() *http.Client) {
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(4, "max_requests_per_client: 4"), chargesRoute)) // one client may hold them all
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
		t.Fatalf("/readyz at rest = %d %s", r.status, r.body)
	}
	answers := make(chan string, 5)
	get := func(path string) {
		resp, err := client().Get(p.url(path))
		if err != nil {
			answers <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	for range 4 {
		go get("/hold")
	}
	eventually(t, "four requests held at the upstream", func() bool { return up.held.Load() == 4 })
	r := do("GET", p.adminURL("/readyz"), "")
	if r.status != 503 || !strings.Contains(r.body, "connection limit reached") {
		t.Errorf("/readyz with every connection busy = %d %q, want 503 naming the connection limit", r.status, r.body)
	}
	if got := scrapeValue(t, p, "idemproxy_connections_active"); got != 4 {
		t.Errorf("idemproxy_connections_active = %v, want 4", got)
	}
	go get("/next")
	eventually(t, "the fifth client waits", func() bool { return scrapeValue(t, p, "idemproxy_connections_waited_total") == 1 })
	close(up.release)
	got := map[string]int{}
	for range 5 {
		got[<-answers]++
	}
	if got["200 upstream /hold"] != 4 || got["200 upstream /next"] != 1 {
		t.Errorf("answers = %v, want four held ones and the fifth, all 200", got)
	}
	eventually(t, "/readyz ready again", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if got := scrapeValue(t, p, "idemproxy_connections_shed_total"); got != 1 {
		// The fifth took the place of the first connection to finish.
		t.Errorf("idemproxy_connections_shed_total = %v, want 1", got)
	}
}

// TestConnectionAttacksDoNotLockOutNewClients: the variants an attacker
// tries after idle keep-alive connections all lose their place to a new
// client: connections that send nothing, connections whose next request's
// header trickles in, HTTP/2 connections that open no stream (but ping).
func TestConnectionAttacksDoNotLockOutNewClients(t *testing.T) {
	const limit = 5
	for _, tt := range []struct {
		name  string
		extra string
		hold  func(t *testing.T, c *h2attack.RawConn)
	}{
		{"silent connections", "read_header_timeout: 60s", func(t *testing.T, c *h2attack.RawConn) {}},
		{"a header trickling after a request", "read_header_timeout: 1s", func(t *testing.T, c *h2attack.RawConn) {
			if st, _, err := c.Get("/charges"); err != nil || st != 200 {
				t.Fatalf("first request: %d %v", st, err)
			}
			c.Write([]byte("GE")) // and no more: Go waits for idle_timeout
		}},
		{"HTTP/2 connections without a stream", "read_header_timeout: 60s", func(t *testing.T, c *h2attack.RawConn) {
			w := bufio.NewWriter(c)
			w.WriteString(h2attack.Preface)
			h2attack.WriteFrame(w, h2attack.FrameSettings, 0, 0, nil)
			w.Flush()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			hdr := make([]byte, 9)
			if _, err := io.ReadFull(c.R, hdr); err != nil || hdr[3] != h2attack.FrameSettings {
				t.Fatalf("the proxy did not answer the HTTP/2 preface with SETTINGS: % x %v", hdr, err)
			}
			c.SetReadDeadline(time.Time{})
			h2attack.WriteFrame(w, h2attack.FramePing, 0, 0, make([]byte, 8)) // frames, but no request
			w.Flush()
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
				serverLimits(limit, tt.extra, "idle_timeout: 120s"), chargesRoute))
			for range limit {
				tt.hold(t, h2attack.DialRaw(t, p.addr))
			}
			if r := charge(p, "ORD-ATTACK"); r.status != 201 {
				t.Fatalf("new client = %d %s %v, want 201", r.status, r.body, r.err)
			}
			if got := scrapeValue(t, p, "idemproxy_connections_shed_total"); got < 1 {
				t.Errorf("idemproxy_connections_shed_total = %v, want at least 1", got)
			}
		})
	}
}

// h2cClient speaks cleartext HTTP/2 with prior knowledge only.
func h2cClient() *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &protos}, Timeout: 30 * time.Second}
}

// TestH2CPriorKnowledge: a client that speaks cleartext HTTP/2 from the
// first byte (a service mesh's sidecar, curl --http2-prior-knowledge) gets
// the same protection as an HTTP/1.1 one: one charge, a replay, 409 while
// in flight, 422 for another body under the key; passthrough works.
func TestH2CPriorKnowledge(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	c := h2cClient()
	body := func(order string, amount int) string {
		return fmt.Sprintf(`{"orderId": %q, "amount": %d}`, order, amount)
	}

	first, proto := doWith(c, "POST", p.url("/charges"), body("ORD-H2", 10))
	if first.err != nil || first.status != 201 || proto != 2 {
		t.Fatalf("first charge over h2c = %d (HTTP/%d) %s %v, want 201 over HTTP/2", first.status, proto, first.body, first.err)
	}
	second, _ := doWith(c, "POST", p.url("/charges"), body("ORD-H2", 10))
	if second.status != 201 || second.header.Get("Idempotent-Replayed") != "true" || second.body != first.body {
		t.Errorf("retry over h2c = %d replayed=%q %s, want the first answer replayed", second.status,
			second.header.Get("Idempotent-Replayed"), second.body)
	}
	if r, _ := doWith(c, "POST", p.url("/charges"), body("ORD-H2", 99)); r.status != 422 || problemType(r) != "fingerprint-mismatch" {
		t.Errorf("another body under the key = %d %s, want 422 fingerprint-mismatch", r.status, r.body)
	}
	// A duplicate while the first is at the upstream: 409, on the same
	// connection (another stream).
	slow := make(chan result, 1)
	go func() {
		r, _ := doWith(c, "POST", p.url("/charges"), body("ORD-H2-SLOW", 10), "X-Stub-Fault", "delay", "X-Stub-Delay", "2s")
		slow <- r
	}()
	eventually(t, "the slow charge is in flight", func() bool {
		return scrapeValue(t, p, `idemproxy_requests_in_flight{route="charges"}`) == 1
	})
	if r, _ := doWith(c, "POST", p.url("/charges"), body("ORD-H2-SLOW", 10)); r.status != 409 || problemType(r) != "request-in-flight" {
		t.Errorf("duplicate in flight = %d %s, want 409 request-in-flight", r.status, r.body)
	}
	if r := <-slow; r.status != 201 {
		t.Errorf("slow charge = %d %s %v", r.status, r.body, r.err)
	}
	if r, proto := doWith(c, "GET", p.url("/orders/ORD-H2/charges"), ""); r.status != 200 || proto != 2 {
		t.Errorf("passthrough over h2c = %d (HTTP/%d) %s", r.status, proto, r.body)
	}
	for order, want := range map[string]int{"ORD-H2": 1, "ORD-H2-SLOW": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charged %d times, want %d", order, got, want)
		}
	}
	// A header list over the limit never reaches the upstream (Go's client
	// refuses to send what the proxy's SETTINGS forbid; a client that sent
	// it would get 431).
	big := strings.Repeat("x", admission.MaxHeaderBytes+1024)
	if r, _ := doWith(c, "POST", p.url("/charges"), body("ORD-H2-BIG", 10), "X-Big", big); r.err == nil && r.status != 431 {
		t.Errorf("a %d-byte header over HTTP/2 = %d %s, want refused", len(big), r.status, r.body)
	}
	if got := chargeCount(t, up.URL, "ORD-H2-BIG"); got != 0 {
		t.Errorf("a charge with an oversized header list was forwarded (%d charges)", got)
	}
	// The connection, between requests, counts as idle.
	if got := scrapeValue(t, p, "idemproxy_connections_idle"); got < 1 {
		t.Errorf("idemproxy_connections_idle = %v with an HTTP/2 connection open between requests", got)
	}
}

// TestH2CUpgradeIsNotPassedOn: Go's server does not switch to h2c on an
// HTTP/1.1 Upgrade, so the request is served as HTTP/1.1; the h2c offer is
// not passed on to the upstream either, on a passthrough path (an upstream
// that accepted it would make the connection a tunnel past the proxy) as
// on a route. A WebSocket upgrade on a passthrough path still is.
func TestH2CUpgradeIsNotPassedOn(t *testing.T) {
	t.Parallel()
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	for _, tt := range []struct {
		name, upgrade, settings string
		wantUpgrade             string
	}{
		{"h2c", "h2c", "AAMAAABkAARAAAAAAAIAAAAA", ""},
		{"h2c in capitals", "H2C", "AAMAAABkAARAAAAAAAIAAAAA", ""},
		{"h2c among others", "foo/2, h2c", "AAMAAABkAARAAAAAAAIAAAAA", "foo/2"},
		{"websocket", "websocket", "", "websocket"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up.mu.Lock()
			up.seen = nil
			up.mu.Unlock()
			c := h2attack.DialRaw(t, p.addr)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			req := "GET /status HTTP/1.1\r\nHost: test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: " + tt.upgrade + "\r\n"
			if tt.settings != "" {
				req += "HTTP2-Settings: " + tt.settings + "\r\n"
			}
			fmt.Fprint(c, req+"\r\n")
			st, body, err := c.ReadAnswer()
			if err != nil || st != 200 || body != "upstream /status" {
				t.Fatalf("answer = %d %q %v, want the upstream's 200 over HTTP/1.1", st, body, err)
			}
			up.mu.Lock()
			defer up.mu.Unlock()
			if len(up.seen) != 1 {
				t.Fatalf("upstream saw %d requests, want 1", len(up.seen))
			}
			if got := up.seen[0].Get("Upgrade"); got != tt.wantUpgrade {
				t.Errorf("upstream saw Upgrade %q, want %q", got, tt.wantUpgrade)
			}
			if got := up.seen[0].Get("HTTP2-Settings"); got != "" {
				t.Errorf("upstream saw HTTP2-Settings %q", got)
			}
		})
	}
	// And on a protected route, the charge is made once, over HTTP/1.1.
	c := h2attack.DialRaw(t, p.addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	b := `{"orderId": "ORD-UPG", "amount": 1}`
	fmt.Fprintf(c, "POST /charges HTTP/1.1\r\nHost: test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"+
		"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	if st, body, err := c.ReadAnswer(); err != nil || st != 200 || !bytes.Contains([]byte(body), []byte("upstream /charges")) {
		t.Errorf("protected request with Upgrade: h2c = %d %q %v", st, body, err)
	}
}

// TestHTTP2StreamsAreBoundedLikeConnections: HTTP/2 multiplexes requests
// on one connection, so streams could take the process far past what
// max_connections allows over HTTP/1.1 (an upstream connection and a
// goroutine each). Requests in flight over all connections are bounded by
// max_connections too: a stream beyond it is answered 503 overloaded at
// once, and /readyz says so.
func TestHTTP2StreamsAreBoundedLikeConnections(t *testing.T) {
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(4, "max_requests_per_client: 4"), chargesRoute)) // one client may hold them all
	c := h2cClient()
	// One connection first: six requests started together before any
	// exists may each dial one, and connections beyond max_connections
	// are shed, which is not what this test is about.
	if r, proto := doWith(c, "GET", p.url("/warm"), ""); r.status != 200 || proto != 2 {
		t.Fatalf("warm-up over h2c = %d HTTP/%d %v, want 200 over HTTP/2", r.status, proto, r.err)
	}
	answers := make(chan result, 6)
	for range 6 {
		go func() {
			r, _ := doWith(c, "GET", p.url("/hold"), "")
			answers <- r
		}()
	}
	var refused []result
	for len(refused) < 2 {
		r := <-answers
		if r.status != 503 || problemType(r) != "overloaded" || r.header.Get("Retry-After") != "1" {
			t.Fatalf("a stream beyond the bound = %d %q %v, want 503 overloaded with Retry-After: 1", r.status, r.body, r.err)
		}
		refused = append(refused, r)
	}
	eventually(t, "four streams held at the upstream", func() bool { return up.held.Load() == 4 })
	r := do("GET", p.adminURL("/readyz"), "")
	if r.status != 503 || !strings.Contains(r.body, "request limit reached") {
		t.Errorf("/readyz with max requests in flight = %d %q, want 503 naming the request limit", r.status, r.body)
	}
	if got := scrapeValue(t, p, "idemproxy_http2_streams_refused_total"); got != 2 {
		t.Errorf("idemproxy_http2_streams_refused_total = %v, want 2", got)
	}
	close(up.release)
	for range 4 {
		if r := <-answers; r.status != 200 {
			t.Errorf("held stream = %d %q %v, want 200", r.status, r.body, r.err)
		}
	}
	eventually(t, "/readyz ready again", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
}
