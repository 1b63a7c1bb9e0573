package proxy_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// h2env is a proxytest.Env whose proxy is also served over cleartext
// HTTP/2 (prior knowledge), with a client that speaks only that: every
// request is a stream of one connection.
func h2env(t *testing.T, cfg func(*config.Config)) (*proxytest.Env, *httptest.Server, *http.Client) {
	t.Helper()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.Stub.Close)
	c := proxytest.ParseConfig(t, e.Stub.URL, chargesByOrder)
	cfg(c)
	e.StartConfig(c)
	srv := httptest.NewUnstartedServer(e.Proxy)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return e, srv, &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// stalledStream starts a request whose body sends prefix and then stalls
// until the test ends; its answer arrives on the channel.
func stalledStream(t *testing.T, c *http.Client, url, prefix string) <-chan proxytest.Answer {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.CloseWithError(io.ErrClosedPipe) })
	go pw.Write([]byte(prefix))
	out := make(chan proxytest.Answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", url+"/charges", pr)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			out <- proxytest.Answer{Err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b, Err: err}
	}()
	return out
}

func bufferedBytes(e *proxytest.Env) float64 {
	return proxytest.CounterValue(e.T, e.Registry, "idemproxy_buffered_bytes", nil)
}

// TestHTTP2StreamsShareTheClientsBuffers: HTTP/2 streams of one connection
// are one client: a second stalled stream is held to the client's share
// like a second connection, and a stalled stream is cut by body_timeout
// (408, the stream alone: the connection keeps serving).
func TestHTTP2StreamsShareTheClientsBuffers(t *testing.T) {
	t.Parallel()
	e, srv, c := h2env(t, func(c *config.Config) {
		c.Server.MaxBufferedBytes = 1 << 20
		c.Server.MaxBufferedBytesPerClient = 128 << 10
		c.Server.BodyTimeout = config.Duration(2 * time.Second)
	})
	// 100 KiB arrive into chunks of 4, 4, 8, 16, 32 and 64 KiB.
	first := stalledStream(t, c, srv.URL, `{"orderId": "ORD-H2", "note": "`+strings.Repeat("x", 100<<10))
	proxytest.Eventually(t, "the first stream's body held", func() bool { return bufferedBytes(e) == 128<<10 })
	second := stalledStream(t, c, srv.URL, `{"note": "`+strings.Repeat("x", 10<<10))
	a := <-second
	proxytest.WantStatus(t, "a second stream over the client's share", a, 503, "overloaded")
	a = proxytest.Send(c, "POST", srv.URL+"/charges", `{"orderId": "ORD-H2-OTHER", "amount": 1}`)
	proxytest.WantStatus(t, "a charge from the client holding its share", a, 503, "overloaded")
	if got := proxytest.CounterValue(t, e.Registry, "idemproxy_buffer_refusals_total", map[string]string{"reason": "client"}); got != 2 {
		t.Errorf(`idemproxy_buffer_refusals_total{reason="client"} = %v, want 2`, got)
	}
	a = <-first
	proxytest.WantStatus(t, "the stalled stream", a, 408, "body-timeout")
	if got := proxytest.CounterValue(t, e.Registry, "idemproxy_request_body_timeouts_total", nil); got != 1 {
		t.Errorf("idemproxy_request_body_timeouts_total = %v, want 1", got)
	}
	proxytest.Eventually(t, "the budget given back", func() bool { return bufferedBytes(e) == 0 })
	// The same connection (the transport keeps one) serves on; the cut
	// request's key was never reserved.
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"orderId": "ORD-H2", "amount": 1}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || resp.ProtoMajor != 2 {
		t.Errorf("the cut request's retry: %d over HTTP/%d, want 201 over HTTP/2", resp.StatusCode, resp.ProtoMajor)
	}
}

// TestBodyCharges: what a request body holds of the budget while it
// arrives is what arrived, in chunks of 4, 4, 8, 16, 32, then 64 KiB (the
// next chunk is taken when the one before is full), never more than its
// Content-Length; not what it announces.
func TestBodyCharges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		length   int64 // announced; -1: none (chunked)
		sent     int
		wantHeld float64
	}{
		{"1 MiB announced, 1 byte sent", 1 << 20, 1, 4 << 10},
		{"1 MiB announced, 4 KiB sent: the next chunk is taken", 1 << 20, 4 << 10, 8 << 10},
		{"1 MiB announced, 4 KiB and a byte sent", 1 << 20, 4<<10 + 1, 8 << 10},
		{"1 MiB announced, 8 KiB and a byte sent", 1 << 20, 8<<10 + 1, 16 << 10},
		{"1 MiB announced, 100 KiB sent", 1 << 20, 100 << 10, 128 << 10},
		{"1 MiB announced, 200 KiB sent", 1 << 20, 200 << 10, 256 << 10},
		{"100 bytes announced, 1 sent", 100, 1, 100},
		{"6 KiB announced, 5 KiB sent", 6 << 10, 5 << 10, 6 << 10},
		{"no length, 1 byte sent", -1, 1, 4 << 10},
		{"no length, 100 KiB sent", -1, 100 << 10, 128 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &proxytest.Env{T: t}
			e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
			t.Cleanup(e.Stub.Close)
			e.StartConfig(proxytest.ParseConfig(t, e.Stub.URL, chargesByOrder))
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.CloseWithError(io.ErrClosedPipe) })
			go pw.Write([]byte(strings.Repeat(" ", tt.sent)))
			req, _ := http.NewRequest("POST", e.Server.URL+"/charges", pr)
			req.ContentLength = tt.length
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := e.Server.Client().Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			proxytest.Eventually(t, fmt.Sprintf("%v bytes held", tt.wantHeld), func() bool { return bufferedBytes(e) == tt.wantHeld })
			pw.CloseWithError(io.ErrClosedPipe) // the client goes away
			<-done
			proxytest.Eventually(t, "the budget given back", func() bool { return bufferedBytes(e) == 0 })
		})
	}
}
