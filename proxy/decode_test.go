package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// gzipWith compresses b with a gzip header naming mtime, as clients that
// compress each retry anew do.
func gzipWith(b []byte, mtime time.Time, level int) []byte {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, level)
	w.ModTime = mtime
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func zlibbed(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// recorder is an upstream that answers 201 and records what it received.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
	codes  []string
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.bodies = append(rc.bodies, b)
	rc.codes = append(rc.codes, r.Header.Get("Content-Encoding"))
	rc.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"charged":true}`))
}

func (rc *recorder) calls() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.bodies)
}

// sendBody posts body as sent, with the given Content-Encoding.
func sendBody(t *testing.T, e *proxytest.Env, body []byte, coding string, hdr ...string) proxytest.Answer {
	t.Helper()
	req, _ := http.NewRequest("POST", e.Server.URL+"/charges", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if coding != "" {
		req.Header.Set("Content-Encoding", coding)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.Server.Client().Do(req)
	if err != nil {
		return proxytest.Answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b, Err: err}
}

// TestCompressedRequestBody: a gzip or deflate body on a route that reads
// its key or fingerprint from the body is decoded for them (it used to be
// 400 invalid-json, or, keyed by a header, another fingerprint for each
// compression of the same request) and forwarded as sent. A retry that
// compresses the same request otherwise, or not at all, is replayed.
func TestCompressedRequestBody(t *testing.T) {
	t.Parallel()
	order := []byte(`{"orderId": "ORD-Z1", "amount": 100}`)
	first := gzipWith(order, time.Unix(1000, 0), gzip.BestSpeed)
	for _, route := range []string{chargesByOrder, chargesByHeader} {
		up := &recorder{}
		srv := httptest.NewServer(up)
		e := &proxytest.Env{T: t}
		e.Start(srv.URL, route)
		key := []string{"Idempotency-Key", "ORD-Z1"}
		proxytest.WantStatus(t, "gzip", sendBody(t, e, first, "gzip", key...), 201, "")
		for _, retry := range []struct {
			name   string
			body   []byte
			coding string
		}{
			{"gzip again, another mtime and level", gzipWith(order, time.Unix(2000, 0), gzip.BestCompression), "gzip"},
			{"x-gzip", first, "x-gzip"},
			{"deflate", zlibbed(order), "deflate"},
			{"identity, listed", order, "identity"},
			{"not compressed", order, ""},
		} {
			a := sendBody(t, e, retry.body, retry.coding, key...)
			if a.Status != 201 || !a.Replayed() {
				t.Errorf("retry %s: %s, want the 201 replayed", retry.name, a)
			}
		}
		if up.calls() != 1 || !bytes.Equal(up.bodies[0], first) || up.codes[0] != "gzip" {
			t.Errorf("the upstream got %d requests (first: %d bytes, Content-Encoding %q), want one with the gzip body as sent",
				up.calls(), len(up.bodies[0]), up.codes[0])
		}
		srv.Close()
	}
}

// TestCompressedRequestBodyRefused: a body in a coding the proxy does not
// decode is 415 unsupported-content-encoding; one that does not decode,
// 400 unreadable-body; one that decodes past max_body_bytes (a bomb), 413.
// Nothing is forwarded or stored. A route that reads nothing from the body
// (a header key, no fingerprint) forwards any coding, and so does a route
// in observe mode.
func TestCompressedRequestBodyRefused(t *testing.T) {
	t.Parallel()
	order := []byte(`{"orderId": "ORD-Z2", "amount": 100}`)
	corrupt := gzipWith(order, time.Time{}, gzip.DefaultCompression)
	corrupt[len(corrupt)-6] ^= 0xff // the CRC
	truncated := gzipWith(order, time.Time{}, gzip.DefaultCompression)
	truncated = truncated[:len(truncated)-8]
	bomb := gzipWith(make([]byte, 64<<20), time.Time{}, gzip.BestCompression)
	up := &recorder{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	e := &proxytest.Env{T: t}
	e.Start(srv.URL, chargesByOrder)
	for _, tc := range []struct {
		name, coding string
		body         []byte
		status       int
		problem      string
	}{
		{"br", "br", order, 415, "unsupported-content-encoding"},
		{"zstd", "zstd", order, 415, "unsupported-content-encoding"},
		{"two codings", "gzip, gzip", gzipWith(gzipWith(order, time.Time{}, 1), time.Time{}, 1), 415, "unsupported-content-encoding"},
		{"corrupt gzip", "gzip", corrupt, 400, "unreadable-body"},
		{"truncated gzip", "gzip", truncated, 400, "unreadable-body"},
		{"not deflate", "deflate", order, 400, "unreadable-body"},
		{"gzip bomb", "gzip", bomb, 413, "body-too-large"},
	} {
		proxytest.WantStatus(t, tc.name, sendBody(t, e, tc.body, tc.coding), tc.status, tc.problem)
	}
	if up.calls() != 0 {
		t.Errorf("the upstream got %d requests, want none", up.calls())
	}
	if got := e.State("charges", "", "ORD-Z2"); got != "" {
		t.Errorf("the key is %q, want no record", got)
	}

	e2 := &proxytest.Env{T: t}
	e2.Start(srv.URL, chargesByHeader+"    fingerprint: {disabled: true}\n")
	proxytest.WantStatus(t, "br, nothing read from the body", sendBody(t, e2, order, "br", "Idempotency-Key", "k1"), 201, "")

	// The decoded copy counts in server.max_buffered_bytes too: with room
	// for one body of max_body_bytes, a compressed body that decodes to
	// nearly that much does not fit beside its compressed bytes.
	e4 := &proxytest.Env{T: t}
	cfg := proxytest.ParseConfig(t, srv.URL, chargesByOrder+"    max_body_bytes: 65536\n")
	cfg.Server.MaxBufferedBytes = 65536
	e4.StartConfig(cfg)
	big := []byte(`{"orderId": "ORD-Z3", "pad": "` + strings.Repeat("x", 60<<10) + `"}`)
	proxytest.WantStatus(t, "decoded past the budget", sendBody(t, e4, gzipWith(big, time.Time{}, 9), "gzip"), 503, "overloaded")
	proxytest.WantStatus(t, "the same, not compressed", sendBody(t, e4, big, ""), 201, "")
	e3 := &proxytest.Env{T: t}
	e3.Start(srv.URL, chargesByOrder+"    mode: observe\n")
	proxytest.WantStatus(t, "br, in observe mode", sendBody(t, e3, order, "br"), 201, "")
}

// TestCompressedEmptyBody: a gzip body that decodes to nothing (clients
// that compress every request send one for an empty POST) is an empty
// body, not 503 overloaded: that retry would fail the same way for ever.
func TestCompressedEmptyBody(t *testing.T) {
	t.Parallel()
	up := &recorder{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	e := &proxytest.Env{T: t}
	e.Start(srv.URL, chargesByHeader)
	empty := gzipWith(nil, time.Time{}, gzip.DefaultCompression)
	proxytest.WantStatus(t, "gzip of nothing", sendBody(t, e, empty, "gzip", "Idempotency-Key", "k-empty"), 201, "")
	a := sendBody(t, e, nil, "", "Idempotency-Key", "k-empty")
	if a.Status != 201 || !a.Replayed() {
		t.Errorf("the retry without a body: %s, want the 201 replayed", a)
	}
	if up.calls() != 1 {
		t.Errorf("the upstream got %d requests, want 1", up.calls())
	}
}
