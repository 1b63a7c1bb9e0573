package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bufio"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestTransportNeverResendsAProtectedRequest: http.Transport resends an
// empty-bodied request with an Idempotency-Key on a reused connection that
// broke before the answer; the proxy must not let it. An upstream that processes every POST /capture/... it reads ("charges"),
// but hangs up without answering the first charge that arrives on a
// connection that already served a request (a crash / LB reset after the
// side effect).
func TestTransportNeverResendsAProtectedRequest(t *testing.T) {
	t.Parallel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	var charges, dropped atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.URL.Path != "/warm" {
						charges.Add(1)
						if n > 0 && dropped.Add(1) == 1 {
							return // charged, then the connection drops
						}
					}
					c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
				}
			}(c)
		}
	}()
	e := &proxytest.Env{T: t}
	e.Start("http://"+ln.Addr().String(), `
  - name: capture
    match: POST /capture/{id}
    key: {header: Idempotency-Key}
`)
	if a := e.Do("GET", "/warm", ""); a.Status != 200 { // passthrough: leaves an idle upstream conn
		t.Fatal(a)
	}
	a := e.Do("POST", "/capture/1", "", "Idempotency-Key", "k1")
	proxytest.WantStatus(t, "dropped after the charge", a, 502, "upstream-reset")
	if charges.Load() != 1 {
		t.Errorf("one client request with one key was processed %d times by the upstream", charges.Load())
	}
}
