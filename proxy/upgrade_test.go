package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/store"
)

// rawRequest sends req on a new connection to addr and returns the answer.
func rawRequest(t *testing.T, addr, req string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	io.WriteString(conn, req)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

// upgradeCharge sends a charge for order that asks to switch to the
// protocol upgrade (Connection: Upgrade), as raw bytes: net/http's client
// would refuse a protocol that is not printable ASCII.
func upgradeCharge(t *testing.T, e *proxytest.Env, order, upgrade string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order)
	return rawRequest(t, e.Server.Listener.Addr().String(), fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n%s", len(body), upgrade, body))
}

// TestInvalidUpgradeIsABadRequest: a request whose Upgrade header is not
// printable ASCII cannot be forwarded. That is the client's error, a 400:
// not a 502 upstream-unreachable counted against the upstream.
func TestInvalidUpgradeIsABadRequest(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	resp := upgradeCharge(t, e, "ORD-U1", "w\xe9bsocket")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), problem.TypePrefix+"invalid-upgrade") {
		t.Errorf("got %d %s, want 400 invalid-upgrade", resp.StatusCode, b)
	}
	if got := upstreamCodes(t, e, "charges"); len(got) != 0 {
		t.Errorf("upstream codes = %v, want none: nothing was sent", got)
	}
	if got := e.State("charges", "", "ORD-U1"); got != "" {
		t.Errorf("the key is %q, want no record", got)
	}
	resp = rawRequest(t, e.Server.Listener.Addr().String(), "GET /page HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: w\xe9bsocket\r\n\r\n")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), problem.TypePrefix+"invalid-upgrade") {
		t.Errorf("passthrough: got %d %s, want 400 invalid-upgrade", resp.StatusCode, b)
	}
}

// TestSwitchingProtocolsOnAProtectedRoute: the upstream answers a protected
// request with 101 Switching Protocols. The proxy cannot store a switched
// connection: the key is in doubt (502 upstream-reset), and the upstream's
// switched connection must be closed, not left open forever.
func TestSwitchingProtocolsOnAProtectedRoute(t *testing.T) {
	t.Parallel()
	ln, closed := switchingUpstream(t)
	e := &proxytest.Env{T: t}
	e.Start("http://"+ln.Addr().String(), chargesByOrder)
	resp := upgradeCharge(t, e, "ORD-S1", "websocket")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || !strings.Contains(string(b), problem.TypePrefix+"upstream-reset") {
		t.Errorf("got %d %s, want 502 upstream-reset", resp.StatusCode, b)
	}
	if got := e.State("charges", "", "ORD-S1"); got != store.StateInDoubt {
		t.Errorf("the key is %q, want in doubt: the upstream took the request", got)
	}
	proxytest.Eventually(t, "the proxy closes the upstream's switched connection", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
}

// TestUpgradeIsNotAskedOfTheUpstream: a client asks to upgrade a protected
// charge (curl --http2 sends Upgrade: h2c on every request) and the
// upstream accepts upgrades. The proxy must not pass the request on: the
// upstream would process it behind a 101 that has no answer to store,
// leaving a charged key in doubt. Forwarded without it, the answer is
// stored and replayed.
func TestUpgradeIsNotAskedOfTheUpstream(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if req.Header.Get("Upgrade") != "" {
						io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
						io.Copy(io.Discard, br)
						return
					}
					io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"charged\":1}")
				}
			}()
		}
	}()
	e := &proxytest.Env{T: t}
	e.Start("http://"+ln.Addr().String(), chargesByOrder)
	body := `{"orderId": "ORD-H1", "amount": 1}`
	req := fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"+
		"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n%s", len(body), body)
	resp := rawRequest(t, e.Server.Listener.Addr().String(), req)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || string(b) != `{"charged":1}` {
		t.Errorf("got %d %s, want the upstream's 201", resp.StatusCode, b)
	}
	if got := e.State("charges", "", "ORD-H1"); got != store.StateCompleted {
		t.Errorf("the key is %q, want completed", got)
	}
	a := e.Do("POST", "/charges", body)
	if a.Status != 201 || !a.Replayed() {
		t.Errorf("retry: %s, want the 201 replayed", a)
	}
}

// TestSwitchingProtocolsUnprotected: a request on a route that is
// forwarded without a reservation (on_missing_key: forward) is answered
// 101 by the upstream, which the route never asked for (it does not pass
// Upgrade on). The upstream's switched connection must be closed too.
func TestSwitchingProtocolsUnprotected(t *testing.T) {
	t.Parallel()
	ln, closed := switchingUpstream(t)
	e := &proxytest.Env{T: t}
	e.Start("http://"+ln.Addr().String(), `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    on_missing_key: forward
`)
	proxytest.WantStatus(t, "unprotected", e.Do("POST", "/charges", `{"amount":1}`), 502, "upstream-reset")
	proxytest.Eventually(t, "the proxy closes the upstream's switched connection", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
}

// switchingUpstream is an upstream that answers its first request with
// 101 Switching Protocols; closed is closed once the proxy has closed
// that connection.
func switchingUpstream(t *testing.T) (ln net.Listener, closed <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		io.Copy(io.Discard, br) // until the proxy closes the connection
		close(done)
	}()
	return ln, done
}
