package app

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A copy of e2e's raw-connection and HTTP/2 frame helpers, for the admission
// unit tests in this package.

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

// scrapeValue reads one series of the proxy's /metrics as a number.
type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func do(method, url, body string, hdr ...string) result {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return result{err: err}
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
	}
}
func doWith(c *http.Client, method, url, body string, hdr ...string) (result, int) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return result{err: err}, 0
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}, resp.ProtoMajor
}

// get is a GET of path as HPACK literal fields.
func get(path string) []string {
	return []string{":method", "GET", ":scheme", "http", ":path", path, ":authority", "proxy"}
}
