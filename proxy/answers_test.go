package proxy_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
	"github.com/idemproxy/idemproxy/store"
)

// upstreamCodes returns the code labels of
// idemproxy_upstream_request_duration_seconds observed for route.
func upstreamCodes(t *testing.T, e *proxytest.Env, route string) map[string]uint64 {
	t.Helper()
	mfs, err := e.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "idemproxy_upstream_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var r, c string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "route":
					r = l.GetValue()
				case "code":
					c = l.GetValue()
				}
			}
			if r == route && m.GetHistogram().GetSampleCount() > 0 {
				codes[c] += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return codes
}

// TestPassthroughEarlyHintsStatus: an upstream that sends 103 Early Hints
// before its 200 is a 200 to the client, and must be a 200 in the metrics
// and the access log too, not the informational 103.
func TestPassthroughEarlyHintsStatus(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByOrder)
	proxytest.WantStatus(t, "passthrough", e.Do("GET", "/page", ""), 200, "")
	if got := upstreamCodes(t, e, ""); got["200"] != 1 || len(got) != 1 {
		t.Errorf("upstream codes of the passthrough = %v, want one 200", got)
	}
}

// TestClientThatStopsReading: the client sends a charge and then stops
// reading (its window stays shut) while a large answer streams. The
// exchange with the upstream is bounded by upstream_timeout, body
// included; the request must end then too and settle its key, instead of
// holding the handler, the connection and the reservation for as long as
// the client keeps its connection open. A slow client never turns a
// finished answer into in doubt.
//
// upstream_timeout is set from the machine's pace: the proxy cuts the slow
// client a quarter of it before its end and then takes the rest of the
// upstream's answer, so that quarter must hold that read with room to
// spare, on a busy machine too: 10 times the slowest of three reads of the
// whole answer straight from the upstream, and 3 s at least. The
// kept-alive connection's part runs on a route of its own whose
// upstream_timeout need only hold a small answer (4 such reads, 3 s at
// least): the test sleeps past it, and sleeping past the large one took
// as long again as the rest of the test.
func TestClientThatStopsReading(t *testing.T) {
	t.Parallel()
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if r.Header.Get("Idempotency-Key") != "k1" {
			w.Write([]byte("small"))
			return
		}
		for range 256 { // 16 MiB, more than any socket buffers hold
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer up.Close()
	read := testrun.Pace(func() {
		proxytest.WantStatus(t, "the whole answer from the upstream", proxytest.Send(up.Client(), "POST", up.URL+"/charges", "{}", "Idempotency-Key", "k1"), 200, "")
	})
	timeout := max(3*time.Second, 40*read).Round(time.Millisecond)
	small := max(3*time.Second, 4*read).Round(time.Millisecond)
	t.Logf("the answer takes %v to read: upstream_timeout %v (%v for the small answers)", read, timeout, small)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: %v
    lease: 1h
  - name: small
    match: POST /small
    key: {header: Idempotency-Key}
    upstream_timeout: %v
    lease: 1h
`, timeout, small))
	conn, err := net.Dial("tcp", e.Server.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Length: 2\r\n\r\n{}")
	proxytest.Eventually(t, "the charge is reserved", func() bool { return e.State("charges", "", "k1") != "" })
	proxytest.EventuallyWithin(t, timeout+proxytest.EventuallyLimit, "the key settles although the client stopped reading", func() bool {
		return e.State("charges", "", "k1") != store.StateInFlight
	})
	// The answer, too large to store, was streamed: the client, too slow
	// for it, was cut off a quarter of upstream_timeout before its end,
	// and the rest of the upstream's answer read in that time. The upstream
	// finished, so the key is completed (not replayable), not in doubt.
	if got := e.State("charges", "", "k1"); got != store.StateCompleted {
		t.Errorf("the key is %q, want completed: the upstream's answer ended", got)
	}
	proxytest.WantStatus(t, "retry", proxytest.Send(e.Server.Client(), "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1"), 409, "response-not-replayable")
	// The deadline is the answer's, not the connection's: the next
	// request on a kept-alive connection, after it, is answered.
	c := e.Server.Client()
	proxytest.WantStatus(t, "first on the connection", proxytest.Send(c, "POST", e.Server.URL+"/small", "{}", "Idempotency-Key", "k2"), 200, "")
	time.Sleep(small + 500*time.Millisecond) // past the first request's upstream_timeout
	proxytest.WantStatus(t, "next on the connection", proxytest.Send(c, "POST", e.Server.URL+"/small", "{}", "Idempotency-Key", "k3"), 200, "")
}

// TestPassthroughUpstreamDurationEndsAtHeaders: the upstream duration of a
// passthrough request is, as on a route, the time until the upstream's
// response headers, not until the client has taken the whole body (for a
// WebSocket or a stream, the whole session).
func TestPassthroughUpstreamDurationEndsAtHeaders(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("done"))
	}))
	defer up.Close()
	defer close(release)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByOrder)
	resp, err := http.Get(e.Server.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	proxytest.Eventually(t, "the passthrough's upstream duration observed once its headers came", func() bool {
		return upstreamCodes(t, e, "")["200"] == 1
	})
}
