package admission

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// adminServer serves h behind the admin listener's limiter of max
// connections, with a header timeout of a minute (so that only the
// limiter's fairness, not a timeout, lets a newcomer in).
func adminServer(t *testing.T, max int, h http.Handler) (*Limiter, string) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewAdminLimiter(inner, max, time.Minute)
	srv := &http.Server{Handler: l.Guard(h), ConnState: l.ConnState, ConnContext: l.ConnContext,
		ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l, inner.Addr().String()
}

// TestAdminLimiterIsFair: connections that never finish their header
// (slowloris) fill the admin limiter, from one address or one each from
// many; the limiter never holds more than its bound, and a request from
// another address is still served (it takes the place of a connection of
// the client holding the most), while the flooding address's newcomers
// are closed at once rather than held.
func TestAdminLimiterIsFair(t *testing.T) {
	const max = 8
	tests := []struct {
		name    string
		sources func(i int) string // the address of the ith slow connection
		n       int
	}{
		{"one address", func(int) string { return "127.0.0.1" }, 40},
		{"one each from many", func(i int) string { return fmt.Sprintf("127.0.1.%d", 10+i) }, 40},
		{"two addresses", func(i int) string { return fmt.Sprintf("127.0.2.%d", 10+i%2) }, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, addr := adminServer(t, max, http.HandlerFunc(okHandler))
			for i := range tt.n {
				c := h2attack.DialFrom(t, tt.sources(i), addr)
				c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: a")) // and never the rest
				if a, i := l.Counts(); a+i > max {
					t.Fatalf("%d connections admitted, want at most %d", a+i, max)
				}
			}
			for probe := range 3 {
				from := fmt.Sprintf("127.0.3.%d", 1+probe)
				st, _, err := h2attack.GetFrom(t, from, addr, "/readyz")
				if err != nil || st != 200 {
					t.Fatalf("probe %d from %s with %d slow connections open: %d %v, want 200", probe, from, tt.n, st, err)
				}
			}
			if a, i := l.Counts(); a+i > max {
				t.Errorf("%d connections admitted, want at most %d", a+i, max)
			}
			if l.shed.Load()+l.refused.Load() < uint64(tt.n-max) {
				t.Errorf("shed %d + refused %d, want at least the %d slow connections beyond the bound",
					l.shed.Load(), l.refused.Load(), tt.n-max)
			}
		})
	}
}

// TestAdminLimiterOneClientReplacesItsOwn: a client alone at the bound
// replaces its own idle keep-alive connections (as a scraper reconnecting
// does), and its slow connections are not displaced by its own newcomer:
// the newcomer is closed at once.
func TestAdminLimiterOneClientReplacesItsOwn(t *testing.T) {
	l, addr := adminServer(t, 2, http.HandlerFunc(okHandler))
	for i := range 4 {
		c := h2attack.DialRaw(t, addr)
		if st, _, err := c.Get("/metrics"); err != nil || st != 200 {
			t.Fatalf("keep-alive client %d: %d %v", i, st, err)
		}
		h2attack.Eventually(t, "the connection is idle", func() bool { a, _ := l.Counts(); return a == 0 })
	}
	if got := l.shed.Load(); got != 2 {
		t.Errorf("shed = %d, want 2 (the two oldest idle connections)", got)
	}
	l2, addr2 := adminServer(t, 2, http.HandlerFunc(okHandler))
	for range 2 {
		h2attack.DialRaw(t, addr2).Write([]byte("GET / HTTP/1.1\r\n"))
	}
	h2attack.Eventually(t, "both slow connections are reading", func() bool { _, i := l2.Counts(); return i == 2 })
	late := h2attack.DialRaw(t, addr2)
	h2attack.Eventually(t, "the newcomer of the same client is closed", late.ClosedByPeer)
	if l2.refused.Load() != 1 || l2.shed.Load() != 0 {
		t.Errorf("refused %d, shed %d; want 1 and 0", l2.refused.Load(), l2.shed.Load())
	}
}
