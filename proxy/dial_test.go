package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestNoConnectionInTimeIsNotSent: an upstream whose accept queue is full
// (connect hangs until the upstream timeout) never received the request,
// so its key is released, not in doubt.
func TestNoConnectionInTimeIsNotSent(t *testing.T) {
	t.Parallel()
	fd, _ := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	defer syscall.Close(fd)
	syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; i < 4; i++ { // fill the backlog
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			defer c.Close()
		}
	}
	e := &proxytest.Env{T: t}
	e.Start("http://"+addr, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: 1s
    lease: 2s
`)
	a := e.Do("POST", "/charges", `{}`, "Idempotency-Key", "k")
	b := e.Do("POST", "/charges", `{}`, "Idempotency-Key", "k")
	proxytest.WantStatus(t, "no connection", a, 502, "upstream-unreachable")
	proxytest.WantStatus(t, "retry", b, 502, "upstream-unreachable")
}
