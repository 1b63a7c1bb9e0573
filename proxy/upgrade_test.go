package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
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

// TestInvalidUpgradeIsABadRequest: a request whose Upgrade header is not
// printable ASCII cannot be forwarded. That is the client's error, a 400:
// not a 502 upstream-unreachable counted against the upstream.
func TestInvalidUpgradeIsABadRequest(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	body := `{"orderId": "ORD-U1", "amount": 1}`
	resp := rawRequest(t, e.srv.Listener.Addr().String(), fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: Upgrade\r\nUpgrade: w\xe9bsocket\r\n\r\n%s", len(body), body))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), proxy.ProblemTypePrefix+"invalid-upgrade") {
		t.Errorf("got %d %s, want 400 invalid-upgrade", resp.StatusCode, b)
	}
	if got := upstreamCodes(t, e, "charges"); len(got) != 0 {
		t.Errorf("upstream codes = %v, want none: nothing was sent", got)
	}
	if got := e.state("charges", "", "ORD-U1"); got != "" {
		t.Errorf("the key is %q, want no record", got)
	}
	resp = rawRequest(t, e.srv.Listener.Addr().String(), "GET /page HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: w\xe9bsocket\r\n\r\n")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), proxy.ProblemTypePrefix+"invalid-upgrade") {
		t.Errorf("passthrough: got %d %s, want 400 invalid-upgrade", resp.StatusCode, b)
	}
}
