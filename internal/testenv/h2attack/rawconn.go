package h2attack

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// RawConn is a client connection that sends HTTP/1.1 requests, or any
// bytes, by hand. Read what the peer sends through R, not through the
// connection itself, so that nothing R has buffered is lost.
type RawConn struct {
	net.Conn
	R *bufio.Reader
}

// DialRaw connects to addr, failing the test if it cannot; the connection
// is closed when the test ends.
func DialRaw(t testing.TB, addr string) *RawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &RawConn{Conn: c, R: bufio.NewReader(c)}
}

// Get sends GET path and reads its answer, waiting at most 20 s; the
// connection stays open. It returns the status and body, or 0 with the
// error.
func (c *RawConn) Get(path string) (int, string, error) {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	return c.ReadAnswer()
}

// ReadAnswer reads one HTTP/1.1 response and returns its status and body,
// or 0 with the error. It sets no deadline: the caller does.
func (c *RawConn) ReadAnswer() (int, string, error) {
	resp, err := http.ReadResponse(c.R, nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), err
}

// ClosedByPeer reports whether the other end closed c (EOF or reset),
// waiting at most a moment (50 ms) for a connection that stays open.
func (c *RawConn) ClosedByPeer() bool {
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.R.Peek(1)
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// Eventually waits, at most 30 s (enough for a loaded machine: a test that
// passes waits only as long as cond takes), for cond to hold, polling it
// every 10 ms; it fails the test, naming what, if cond never does.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
	}
}
