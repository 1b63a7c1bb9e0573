package admission

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// testAnswers stand for the proxy's problem answers (the program wires
// those; admission does not import the proxy): a 503 with Retry-After: 1,
// and a 431 that closes the connection.
var testAnswers = Answers{
	Overloaded: func(w http.ResponseWriter, r *http.Request, detail string, ext map[string]any) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "overloaded: "+detail, http.StatusServiceUnavailable)
	},
	HeaderFields: func(max int) []byte {
		body := "more than " + strconv.Itoa(max) + " header lines"
		return []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	},
}

// rawConn is a client connection that sends requests by hand.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// get sends GET path and reads its answer; the connection stays open.
func (c *rawConn) get(path string) (int, string, error) {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	return c.readAnswer()
}

func (c *rawConn) readAnswer() (int, string, error) {
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), err
}

// closedByPeer reports whether the other end closed c (EOF or reset),
// waiting at most a moment for a connection that stays open.
func (c *rawConn) closedByPeer() bool {
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.br.Peek(1)
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// eventually waits, at most 15 s, for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
	}
}
