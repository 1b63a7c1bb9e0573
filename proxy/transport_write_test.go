package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/badger"
)

// countingConn counts the writes on a connection to the upstream.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A protected request's body was buffered before it is forwarded: its
// headers and body go out in one write (one packet, one read upstream),
// not the two the reverse proxy's own body wrapper would cause.
func TestBufferedBodyOneWrite(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		w.WriteHeader(201)
	}))
	defer up.Close()
	var writes atomic.Int64
	tr := proxy.NewTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &writes}, nil
	}
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := proxy.New(proxytest.ParseConfig(t, up.URL, chargesByOrder), proxy.Options{Store: st, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{`{"orderId":"W-1","amount":10}`, `{"orderId":"W-2","amount":` + strings.Repeat("1", 3000) + `}`} {
		writes.Store(0)
		req := httptest.NewRequest("POST", "/charges", strings.NewReader(body))
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		if rec.Code != 201 {
			t.Fatalf("request %d: status %d: %s", i, rec.Code, rec.Body)
		}
		if g := got.Load(); g != body {
			t.Errorf("request %d: upstream got body %q, want %q", i, g, body)
		}
		if n := writes.Load(); n != 1 {
			t.Errorf("request %d: %d writes to the upstream, want 1 (headers and body together)", i, n)
		}
	}
}
