package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// The admission tests run the real binary: what is pinned is what one
// client, or many, can do to everyone else through the listener.

// slowBody is a raw HTTP/1.1 request whose body is announced in full and
// sent in part (or not at all) from a given source address.
type slowBody struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	// answer receives the proxy's answer once it comes.
	answer chan slowAnswer
}

type slowAnswer struct {
	status  int
	problem string
	close   bool // Connection: close
	closed  bool // and the connection was closed after it
	err     error
}

// startSlowBody dials the proxy from source (a 127.x.y.z address, which
// Linux loopback accepts), announces a body of length bytes and sends
// prefix of it.
func startSlowBody(t *testing.T, p *proc, source string, length int, prefix string) *slowBody {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", source, err)
	}
	t.Cleanup(func() { c.Close() })
	s := &slowBody{t: t, conn: c, br: bufio.NewReader(c), answer: make(chan slowAnswer, 1)}
	head := fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", length)
	if _, err := io.WriteString(c, head+prefix); err != nil {
		t.Fatalf("write from %s: %v", source, err)
	}
	go func() {
		c.SetReadDeadline(time.Now().Add(40 * time.Second)) // a test that hangs fails instead
		resp, err := http.ReadResponse(s.br, nil)
		if err != nil {
			s.answer <- slowAnswer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a := slowAnswer{status: resp.StatusCode, close: resp.Close, problem: problemType(result{body: string(b)})}
		_, err = s.br.ReadByte()
		a.closed = err != nil && !isTimeout(err)
		s.answer <- a
	}()
	return s
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// wait returns the proxy's answer.
func (s *slowBody) wait() slowAnswer {
	select {
	case a := <-s.answer:
		return a
	case <-time.After(45 * time.Second):
		s.t.Fatal("no answer to a slow body within 45s")
		return slowAnswer{}
	}
}

// answered reports whether the proxy answered already, without waiting.
func (s *slowBody) answered() (slowAnswer, bool) {
	select {
	case a := <-s.answer:
		s.answer <- a // keep it for wait
		return a, true
	default:
		return slowAnswer{}, false
	}
}

// metric returns one series' value from the admin listener's /metrics
// (-1 if missing).
func (p *proc) metric(series string) float64 {
	r := do("GET", p.adminURL("/metrics"), "")
	v, ok := metricValue(r.body, series)
	if !ok {
		return -1
	}
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

// chargeFrom posts a small charge from source.
func chargeFrom(p *proc, source, order string) result {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	resp, err := c.Post(p.url("/charges"), "application/json", strings.NewReader(fmt.Sprintf(`{"orderId": %q, "amount": 10}`, order)))
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func wantAnswer(t *testing.T, what string, a slowAnswer, status int, problem string) {
	t.Helper()
	if a.err != nil || a.status != status || a.problem != problem {
		t.Errorf("%s: got %d %q (err %v), want %d %s", what, a.status, a.problem, a.err, status, problem)
	}
}

func wantCut(t *testing.T, what string, a slowAnswer) {
	t.Helper()
	wantAnswer(t, what, a, 408, "body-timeout")
	if a.err == nil && (!a.close || !a.closed) {
		t.Errorf("%s: Connection: close %v, connection closed %v; want both", what, a.close, a.closed)
	}
}

// TestStalledBodiesDoNotTakeTheBudget is the row: connections that
// announce a 1 MiB body and send one byte took the whole buffer budget
// from the announcement (every protected request 503 until read_timeout,
// /readyz ready). Now each holds one first chunk (4 KiB), other clients
// are served and /readyz stays truthful, and body_timeout cuts them: 408
// body-timeout with Connection: close, no key reserved.
func TestStalledBodiesDoNotTakeTheBudget(t *testing.T) {
	for _, n := range []int{66, 200} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			up := startStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
				"server:\n  body_timeout: 3s\n", chargesRoute))
			stalled := make([]*slowBody, n)
			for i := range stalled {
				prefix := "{"
				if i == 0 { // the key arrives, the body does not end
					prefix = `{"orderId": "ORD-STALLED", "amount": 10`
				}
				stalled[i] = startSlowBody(t, p, "127.0.0.1", 1<<20, prefix)
			}
			eventually(t, "every stalled body read by the proxy", func() bool {
				return p.metric(`idemproxy_requests_in_flight{route="charges"}`) == float64(n)
			})
			if got, want := p.metric("idemproxy_buffered_bytes"), float64(n*4096); got != want {
				t.Errorf("buffered bytes with %d stalled bodies = %v, want %v (one 4 KiB chunk each)", n, got, want)
			}
			if r := charge(p, "ORD-MEANWHILE"); r.status != 201 {
				t.Errorf("a charge while %d bodies stall: %d %s, want 201", n, r.status, r.body)
			}
			if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
				t.Errorf("/readyz with %d KiB of 64 MiB buffered: %d %s, want 200", n*4, r.status, r.body)
			}
			for i, s := range stalled {
				wantCut(t, fmt.Sprintf("stalled body %d", i), s.wait())
			}
			if got := p.metric("idemproxy_request_body_timeouts_total"); got != float64(n) {
				t.Errorf("idemproxy_request_body_timeouts_total = %v, want %d", got, n)
			}
			eventually(t, "every body's budget given back", func() bool { return p.metric("idemproxy_buffered_bytes") == 0 })
			// The cut request's key was never reserved: its retry is a
			// new request, charged once.
			if r := charge(p, "ORD-STALLED"); r.status != 201 {
				t.Errorf("retry of the cut request: %d %s, want 201", r.status, r.body)
			}
			if got := chargeCount(t, up.URL, "ORD-STALLED"); got != 1 {
				t.Errorf("ORD-STALLED charged %d times, want 1", got)
			}
		})
	}
}

// TestTricklingBodyIsCut: a body that keeps arriving, one byte a second,
// is cut by body_timeout as a stalled one is: a deadline, not an idle
// timer that each byte would reset.
func TestTricklingBodyIsCut(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		"server:\n  body_timeout: 2s\n", chargesRoute))
	s := startSlowBody(t, p, "127.0.0.1", 1000, `{"orderId": "ORD-TRICKLE", "note": "`)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := s.conn.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	a := s.wait()
	close(stop)
	wg.Wait()
	wantCut(t, "trickling body", a)
	if r := charge(p, "ORD-TRICKLE"); r.status != 201 {
		t.Errorf("retry of the cut request: %d %s, want 201", r.status, r.body)
	}
}

// sendUntilHeld starts a slow body from source sending prefix bytes and
// waits until the proxy holds want buffered bytes or answers it.
func sendUntilHeld(t *testing.T, p *proc, source string, length, prefix int, want float64) *slowBody {
	t.Helper()
	s := startSlowBody(t, p, source, length, `{"note": "`+strings.Repeat("x", prefix-10))
	eventually(t, fmt.Sprintf("a body from %s held or answered", source), func() bool {
		_, done := s.answered()
		return done || p.metric("idemproxy_buffered_bytes") == want
	})
	return s
}

// TestClientShare: one client (one address, any number of connections)
// holds at most max_buffered_bytes_per_client beyond one body; its next
// body is 503 overloaded while other clients are served.
//
// Everything until the held bodies are cut must happen within
// body_timeout: about 20 round trips to the proxy. body_timeout is the
// machine's: 60 times the slowest of three charges and /metrics reads on
// a first proxy (5 s at least), so that a busy machine does not cut the
// held bodies before the test has seen what their share refuses.
func TestClientShare(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	paced := startProxy(t, writeConfig(t, filepath.Join(dir, "pace.yaml"), up.URL, filepath.Join(dir, "pace"), "", chargesRoute))
	var n int
	step := testrun.Pace(func() {
		n++
		chargeFrom(paced, "127.0.0.3", fmt.Sprintf("ORD-PACE-%d", n))
		paced.metric("idemproxy_buffered_bytes")
	})
	bodyTimeout := max(5*time.Second, 60*step).Round(time.Millisecond)
	t.Logf("a charge and a /metrics read take %v: body_timeout %v", step, bodyTimeout)
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		fmt.Sprintf("server:\n  body_timeout: %v\n  max_buffered_bytes_per_client: 524288\n", bodyTimeout), chargesRoute))
	// 200 KiB of a 1 MiB body arrives into chunks of 4, 4, 8, 16, 32, 64,
	// 64 and 64 KiB: 256 KiB held.
	const held = 256 << 10
	first := sendUntilHeld(t, p, "127.0.0.1", 1<<20, 200<<10, held)
	second := sendUntilHeld(t, p, "127.0.0.1", 1<<20, 200<<10, 2*held)
	for i := range 8 {
		s := startSlowBody(t, p, "127.0.0.1", 1<<20, `{"note": "`+strings.Repeat("x", 200<<10))
		wantAnswer(t, fmt.Sprintf("body %d over the client's share", i+3), s.wait(), 503, "overloaded")
	}
	if r := chargeFrom(p, "127.0.0.1", "ORD-SAME-CLIENT"); r.status != 503 || problemType(r) != "overloaded" {
		t.Errorf("a charge from the client holding its share: %d %s, want 503 overloaded", r.status, r.body)
	}
	if r := chargeFrom(p, "127.0.0.2", "ORD-OTHER-CLIENT"); r.status != 201 {
		t.Errorf("a charge from another client: %d %s, want 201", r.status, r.body)
	}
	if got := p.metric(`idemproxy_buffer_refusals_total{reason="client"}`); got != 9 {
		t.Errorf(`idemproxy_buffer_refusals_total{reason="client"} = %v, want 9`, got)
	}
	if got := p.metric("idemproxy_buffered_bytes"); got != 2*held {
		t.Errorf("buffered bytes = %v, want %d (the client's share)", got, 2*held)
	}
	wantCut(t, "first held body", first.wait())
	wantCut(t, "second held body", second.wait())
	if r := chargeFrom(p, "127.0.0.1", "ORD-SAME-CLIENT"); r.status != 201 {
		t.Errorf("the client's charge once its bodies were cut: %d %s, want 201", r.status, r.body)
	}
}

// TestManyClientsUnderTheShare: many clients (one address each) that each
// stay under the per-client share can still fill the budget together;
// /readyz says so, and body_timeout is what gives the budget back.
func TestManyClientsUnderTheShare(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	route := chargesRoute + "    max_body_bytes: 262144\n"
	// Budget 1 MiB, so a share of 128 KiB; each client holds 64 KiB.
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		"server:\n  body_timeout: 4s\n  max_buffered_bytes: 1048576\n", route))
	var clients []*slowBody
	for i := range 40 {
		clients = append(clients, startSlowBody(t, p, fmt.Sprintf("127.0.1.%d", i+1), 256<<10,
			`{"note": "`+strings.Repeat("x", 60<<10)))
	}
	eventually(t, "/readyz reports the saturated budget", func() bool {
		r := do("GET", p.adminURL("/readyz"), "")
		return r.status == 503 && strings.Contains(r.body, "buffers saturated")
	})
	var cut, refused int
	for i, c := range clients {
		switch a := c.wait(); a.status {
		case 408:
			wantCut(t, fmt.Sprintf("client %d", i), a)
			cut++
		case 503:
			wantAnswer(t, fmt.Sprintf("client %d", i), a, 503, "overloaded")
			refused++
		default:
			t.Errorf("client %d: %d %s (err %v), want 408 body-timeout or 503 overloaded", i, a.status, a.problem, a.err)
		}
	}
	if cut == 0 || refused == 0 {
		t.Errorf("%d cut, %d refused: want both (the budget held some, refused the rest)", cut, refused)
	}
	if got := p.metric(`idemproxy_buffer_refusals_total{reason="client"}`); got != 0 {
		t.Errorf("client-share refusals = %v, want 0: every client stayed under its share", got)
	}
	if r := chargeFrom(p, "127.0.0.1", "ORD-AFTER"); r.status != 201 {
		t.Errorf("a charge after the bodies were cut: %d %s, want 201", r.status, r.body)
	}
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
		t.Errorf("/readyz after the bodies were cut: %d %s, want 200", r.status, r.body)
	}
}
