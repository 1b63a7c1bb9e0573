package h2attack

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// serve runs h on a loopback listener that speaks HTTP/1.1 and cleartext
// HTTP/2 with prior knowledge, as the proxy does.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestProbeClients: each probe client speaks its protocol from the address
// it was given, and GetFrom reaches the server from its own.
func TestProbeClients(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		io.WriteString(w, host)
	}))
	h1, h2 := ProbeClients("127.0.0.2")
	for _, tc := range []struct {
		name  string
		c     *http.Client
		proto int
	}{{"HTTP/1.1", h1, 1}, {"HTTP/2", h2, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			r, proto := Do(tc.c, "POST", "http://"+addr+"/charges", `{}`, "Idempotency-Key", "k")
			if r.Err != nil || r.Status != 200 || proto != tc.proto || r.Body != "127.0.0.2" {
				t.Errorf("got %d over HTTP/%d from %q (%v), want 200 over HTTP/%d from 127.0.0.2", r.Status, proto, r.Body, r.Err, tc.proto)
			}
		})
	}
	if st, body, err := GetFrom(t, "127.0.0.3", addr, "/readyz"); err != nil || st != 200 || body != "127.0.0.3" {
		t.Errorf("GetFrom = %d %q %v, want 200 from 127.0.0.3", st, body, err)
	}
}

// TestAttackerOpensAndResetsStreams: the attacker's streams reach the
// server's handlers as HTTP/2 requests, and it keeps resetting them,
// reconnecting when a connection is closed, until its context ends.
func TestAttackerOpensAndResetsStreams(t *testing.T) {
	var handled atomic.Int64
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && r.URL.Path == "/charges" {
			handled.Add(1)
		}
	}))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a := &Attacker{Addr: addr, From: []string{"127.0.0.1", "127.0.0.2"}, EndStream: true}
	wg := a.Run(ctx, 2)
	// Until all three hold: on a loaded machine one worker's connection
	// made the 1000 streams before the other had dialled (a CI run).
	for (a.Streams.Load() < 1000 || handled.Load() == 0 || a.Conns.Load() < 2) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the attacker did not stop with its context")
	}
	if a.Streams.Load() < 1000 || handled.Load() == 0 || a.Conns.Load() < 2 {
		t.Errorf("%d streams reset on %d connections, %d handled; want 1000 or more, on 2 or more, some handled",
			a.Streams.Load(), a.Conns.Load(), handled.Load())
	}
}

// TestRawConn: a raw connection reads its answers in order and stays open
// between them, ClosedByPeer tells an open connection from one the server
// closed, and Eventually returns once its condition holds.
func TestRawConn(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		io.WriteString(w, r.URL.Path)
	}))
	c := DialRaw(t, addr)
	for _, path := range []string{"/a", "/b"} {
		if st, body, err := c.Get(path); err != nil || st != 200 || body != path {
			t.Fatalf("Get(%q) = %d %q %v, want 200 %q", path, st, body, err, path)
		}
	}
	if c.ClosedByPeer() {
		t.Fatal("ClosedByPeer = true on a kept-alive connection, want false")
	}
	if st, _, err := c.Get("/close"); err != nil || st != 200 {
		t.Fatalf("Get(/close) = %d %v, want 200", st, err)
	}
	Eventually(t, "the server closes the connection", c.ClosedByPeer)
}
