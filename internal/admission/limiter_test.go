package admission

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// limitedServer serves h behind a Limiter of max connections.
func limitedServer(t *testing.T, max int, headerTimeout time.Duration, h http.Handler) (*Limiter, string) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(inner, max, headerTimeout)
	srv := &http.Server{Handler: l.Guard(h), ConnState: l.ConnState, ConnContext: l.ConnContext,
		ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l, inner.Addr().String()
}

func okHandler(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) }

// TestConnLimiterShedsOldestIdle: at the limit, each new client is
// admitted by closing the connection idle the longest; the others stay.
func TestConnLimiterShedsOldestIdle(t *testing.T) {
	l, addr := limitedServer(t, 3, time.Minute, http.HandlerFunc(okHandler))
	var conns []*h2attack.RawConn
	for i := range 6 {
		c := h2attack.DialRaw(t, addr)
		if st, body, err := c.Get(fmt.Sprintf("/%d", i)); err != nil || st != 200 {
			t.Fatalf("client %d: %d %q %v, want 200", i, st, body, err)
		}
		// The client may read its answer before the server has marked
		// the connection idle: wait, so that the idle order is the
		// clients' order.
		h2attack.Eventually(t, "the connection is idle", func() bool { a, _ := l.Counts(); return a == 0 })
		conns = append(conns, c)
	}
	for i, c := range conns {
		want := i < 3 // the three oldest made room for the three newest
		if i < 3 {
			h2attack.Eventually(t, fmt.Sprintf("client %d closed", i), c.ClosedByPeer)
		} else if c.ClosedByPeer() != want {
			t.Errorf("client %d closed = %v, want %v", i, !want, want)
		}
	}
	if got := l.shed.Load(); got != 3 {
		t.Errorf("shed = %d, want 3", got)
	}
	if a, i := l.Counts(); a+i != 3 || i != 3 {
		t.Errorf("active, idle = %d, %d, want 0, 3", a, i)
	}
	// The survivors still serve.
	if st, _, err := conns[5].Get("/again"); err != nil || st != 200 {
		t.Errorf("newest connection after the sheds: %d %v", st, err)
	}
}

// TestConnLimiterNeverShedsARequestUnderWay: a connection whose request is
// being served, or whose next request has started to arrive, is passed
// over for a younger idle one; with no idle connection the newcomer waits
// for a request to finish, and /readyz's check reports it.
func TestConnLimiterNeverShedsARequestUnderWay(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held.Add(1)
			<-release
		}
		okHandler(w, r)
	})
	l, addr := limitedServer(t, 3, time.Minute, h)

	// A: a request held by the handler.
	a := h2attack.DialRaw(t, addr)
	fmt.Fprintf(a, "GET /hold HTTP/1.1\r\nHost: test\r\n\r\n")
	h2attack.Eventually(t, "A's request is being served", func() bool { return held.Load() == 1 })
	// B: served, then half of its next request's header.
	b := h2attack.DialRaw(t, addr)
	if st, _, err := b.Get("/b"); err != nil || st != 200 {
		t.Fatalf("B: %d %v", st, err)
	}
	fmt.Fprintf(b, "GET /b2 HTTP/1.1\r\n")
	h2attack.Eventually(t, "B's next request is being read", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := l.idleHead; c != nil; c = c.next {
			if c.readAt.Load() != 0 {
				return true
			}
		}
		return false
	})
	// C: served and idle, the youngest.
	c := h2attack.DialRaw(t, addr)
	if st, _, err := c.Get("/c"); err != nil || st != 200 {
		t.Fatalf("C: %d %v", st, err)
	}
	if err := l.Saturated(); err != nil {
		t.Errorf("Saturated with an idle connection: %v", err)
	}
	// D sheds C, the only one that is truly idle.
	d := h2attack.DialRaw(t, addr)
	if st, _, err := d.Get("/d"); err != nil || st != 200 {
		t.Fatalf("D: %d %v", st, err)
	}
	h2attack.Eventually(t, "C closed", c.ClosedByPeer)
	// B finishes its request on its connection.
	fmt.Fprintf(b, "Host: test\r\n\r\n")
	if st, body, err := b.ReadAnswer(); err != nil || st != 200 || body != "ok /b2" {
		t.Fatalf("B's second request: %d %q %v", st, body, err)
	}

	// Now hold B and D too: every connection is busy.
	fmt.Fprintf(b, "GET /hold HTTP/1.1\r\nHost: test\r\n\r\n")
	fmt.Fprintf(d, "GET /hold HTTP/1.1\r\nHost: test\r\n\r\n")
	h2attack.Eventually(t, "three requests held", func() bool { return held.Load() == 3 })
	if err := l.Saturated(); err == nil || !strings.Contains(err.Error(), "connection limit reached") {
		t.Errorf("Saturated = %v, want the limit reached", err)
	}
	waited := l.waited.Load() // D may have waited a moment for C to turn idle
	e := h2attack.DialRaw(t, addr)
	fmt.Fprintf(e, "GET /e HTTP/1.1\r\nHost: test\r\n\r\n")
	h2attack.Eventually(t, "E waits", func() bool { return l.waited.Load() == waited+1 })
	close(release)
	for name, conn := range map[string]*h2attack.RawConn{"A": a, "B": b, "D": d, "E": e} {
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if st, _, err := conn.ReadAnswer(); err != nil || st != 200 {
			t.Errorf("%s: %d %v, want 200", name, st, err)
		}
	}
	// C, then the first of A, B and D to finish (once its answer is
	// written), to admit E.
	if got := l.shed.Load(); got != 2 {
		t.Errorf("shed = %d, want 2", got)
	}
}

// TestConnLimiterGuard: a request that starts on a connection the limiter
// has shed is never handled.
func TestConnLimiterGuard(t *testing.T) {
	l := newLimiter(nil, 1, 0)
	handled := false
	h := l.Guard(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled = true }))
	c := &trackedConn{Conn: nopConn{}, l: l}
	c.shed.Store(true)
	r, _ := http.NewRequestWithContext(l.ConnContext(t.Context(), c), "POST", "/charges", nil)
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		h.ServeHTTP(nil, r)
	}()
	if handled {
		t.Error("a request on a shed connection was handled")
	}
}

type nopConn struct{ net.Conn }

// TestConnLimiterSheddable is the rule of what may be closed, by state.
func TestConnLimiterSheddable(t *testing.T) {
	now := time.Now()
	const hdr = 10 * time.Second
	tests := []struct {
		name   string
		state  http.ConnState
		since  time.Duration // ago
		readAt time.Duration // ago; 0: nothing read since
		h2     bool
		want   bool
	}{
		{"idle keep-alive", http.StateIdle, time.Millisecond, 0, false, true},
		{"new, silent, in its grace", http.StateNew, newConnGrace / 2, 0, false, false},
		{"new, silent past its grace", http.StateNew, newConnGrace, 0, false, true},
		{"new, header arriving", http.StateNew, 2 * newConnGrace, time.Second, false, false},
		{"new, header overdue", http.StateNew, 2 * hdr, hdr, false, true},
		{"idle, next header arriving", http.StateIdle, time.Minute, time.Second, false, false},
		{"idle, next header overdue", http.StateIdle, time.Minute, hdr, false, true},
		{"HTTP/2 without a stream, frames arriving", http.StateIdle, time.Millisecond, time.Millisecond, true, true},
		{"HTTP/2 preface read, not yet set up", http.StateNew, time.Millisecond, time.Millisecond, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &trackedConn{state: tt.state, since: now.Add(-tt.since)}
			if tt.readAt != 0 {
				c.readAt.Store(now.Add(-tt.readAt).UnixNano())
			}
			c.h2.Store(tt.h2)
			if got := c.sheddable(now, hdr); got != tt.want {
				t.Errorf("sheddable = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestConnLimiterSniffsHTTP2: the preface marks a connection HTTP/2, even
// sent a byte at a time; an HTTP/1.1 request does not.
func TestConnLimiterSniffsHTTP2(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chunks []string
		want   bool
	}{
		{"preface", []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}, true},
		{"preface byte by byte", strings.Split("PRI * HTTP/2.0\r\n", ""), true},
		{"HTTP/1.1", []string{"POST /charges HTTP/1.1\r\n"}, false},
		{"PRI as an HTTP/1.1 method", []string{"PRI / HTTP/1.1\r\n"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &trackedConn{}
			for _, ch := range tt.chunks {
				if c.headN >= 0 {
					c.sniff([]byte(ch))
				}
			}
			if got := c.h2.Load(); got != tt.want {
				t.Errorf("h2 = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHeaderLinesCount: the lines of a request header are counted as its
// bytes arrive, in any split, up to the empty line that ends it; what
// follows (a body, a pipelined request) is not counted, and an empty line
// before the request line does not end the count.
func TestHeaderLinesCount(t *testing.T) {
	tests := []struct {
		name     string
		reads    []string
		want     int
		wantDone bool
	}{
		{"whole header", []string{"POST / HTTP/1.1\r\nHost: x\r\n\r\n"}, 2, true},
		{"bare line feeds", []string{"POST / HTTP/1.1\nHost: x\n\n"}, 2, true},
		{"split everywhere", []string{"POST / HTTP/1.1\r", "\nHost: x\r\n", "\r", "\n"}, 2, true},
		{"unfinished", []string{"POST / HTTP/1.1\r\nA: b\r\nC: d"}, 2, false},
		{"body and pipelined request not counted", []string{"POST / HTTP/1.1\r\nA: b\r\n\r\n{\n\n\n}GET / HTTP/1.1\r\n\r\n"}, 2, true},
		{"empty line first does not end it", []string{"\r\n\r\nPOST / HTTP/1.1\r\nA: b\r\nC: d\r\n"}, 5, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h headerLines
			got := 0
			for _, r := range tt.reads {
				if h.done {
					break
				}
				got = h.count([]byte(r))
			}
			if got != tt.want || h.done != tt.wantDone {
				t.Errorf("count = %d, done %v; want %d, done %v", got, h.done, tt.want, tt.wantDone)
			}
		})
	}
}
