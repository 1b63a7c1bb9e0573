package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/store"
)

// bigAnswer is an answer larger than any socket buffers hold, but within
// the max_stored_body_bytes of slowRoutes.
var bigAnswer = bytes.Repeat([]byte("0123456789abcdef"), 12<<20/16)

// bigUpstream answers every request with bigAnswer, counting the requests.
func bigUpstream(t *testing.T, calls *int) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*calls++
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(bigAnswer)))
		w.Write(bigAnswer)
	}))
	t.Cleanup(up.Close)
	return up
}

const slowRoutes = `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: 15s
    lease: 1h
    max_stored_body_bytes: 16777216
`

// rawCharge sends a charge on a new connection with a receive buffer of
// rcvbuf bytes and returns the connection, unread.
func rawCharge(t *testing.T, e *proxytest.Env, key string, rcvbuf int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", e.Server.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.(*net.TCPConn).SetReadBuffer(rcvbuf)
	fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 2\r\n\r\n{}", key)
	return conn
}

// TestSlowClientOfAStoredAnswer: the upstream answers 12 MiB at once; the
// client reads it at its own steady pace (32 KiB every 45 ms, about
// 0.7 MiB/s: 17 s at least), so that it takes longer in all than the
// route's upstream_timeout (15s: a loaded machine under the race detector
// took more than 6 s to read the answer from the upstream, in a CI run).
// The answer belongs to the upstream: it is read at the upstream's pace and
// committed, and the slow client still gets all of it at its own pace;
// the key is completed, not in doubt, and a retry gets the whole answer
// replayed without charging again.
func TestSlowClientOfAStoredAnswer(t *testing.T) {
	t.Parallel()
	calls := 0
	e := &proxytest.Env{T: t}
	e.Start(bigUpstream(t, &calls).URL, slowRoutes)
	conn := rawCharge(t, e, "k-slow", 64<<10)
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReaderSize(&pacedReader{r: conn, chunk: 32 << 10, every: 45 * time.Millisecond}, 32<<10), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, bigAnswer) {
		t.Fatalf("the slow client got %d, %d bytes (%v), want 200 and the whole answer of %d", resp.StatusCode, len(got), err, len(bigAnswer))
	}
	if got := e.State("charges", "", "k-slow"); got != store.StateCompleted {
		t.Errorf("the key is %q, want completed", got)
	}
	wantReplayedOnce(t, e, "k-slow", &calls)
}

// pacedReader reads at most chunk bytes at a time, waiting every between
// two reads: a client on a slow link.
type pacedReader struct {
	r     io.Reader
	chunk int
	every time.Duration
	read  bool
}

func (s *pacedReader) Read(p []byte) (int, error) {
	if s.read {
		time.Sleep(s.every)
	}
	s.read = true
	return s.r.Read(p[:min(len(p), s.chunk)])
}

// TestClientThatNeverReadsAStoredAnswer: the client sends a charge and
// then neither reads nor closes; or reads a little and goes away. The
// upstream's whole answer was sent: the key is completed at once (not in
// doubt at upstream_timeout), and the retry gets the answer replayed.
func TestClientThatNeverReadsAStoredAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		vanish bool
	}{{"stalls", false}, {"vanishes mid-answer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			e := &proxytest.Env{T: t}
			e.Start(bigUpstream(t, &calls).URL, slowRoutes)
			conn := rawCharge(t, e, "k-stall", 4<<10)
			conn.SetReadDeadline(time.Now().Add(time.Minute))
			if tc.vanish {
				io.ReadFull(conn, make([]byte, 64<<10))
				conn.Close()
			}
			proxytest.Eventually(t, "the key is settled", func() bool {
				s := e.State("charges", "", "k-stall")
				return s != "" && s != store.StateInFlight
			})
			if got := e.State("charges", "", "k-stall"); got != store.StateCompleted {
				t.Fatalf("the key is %q, want completed", got)
			}
			wantReplayedOnce(t, e, "k-stall", &calls)
		})
	}
}

// TestAnswerOverTheBudget: an answer that server.max_buffered_bytes cannot
// hold reaches its client whole, streamed, and is committed as too large
// to store (as an answer over max_stored_body_bytes): the retry gets 409
// response-not-replayable, never a second charge, and the answer is
// counted by reason.
func TestAnswerOverTheBudget(t *testing.T) {
	t.Parallel()
	calls := 0
	up := bigUpstream(t, &calls)
	e := &proxytest.Env{T: t}
	cfg := proxytest.ParseConfig(t, up.URL, slowRoutes+"    max_body_bytes: 1024\n")
	cfg.Server.MaxBufferedBytes = 4 << 20
	e.StartConfig(cfg)
	a := e.Do("POST", "/charges", "{}", "Idempotency-Key", "k-budget")
	if a.Status != 200 || !bytes.Equal(a.Body, bigAnswer) {
		t.Fatalf("first: %d, %d bytes (%v); want the whole answer", a.Status, len(a.Body), a.Err)
	}
	proxytest.WantStatus(t, "retry", e.Do("POST", "/charges", "{}", "Idempotency-Key", "k-budget"), 409, "response-not-replayable")
	if calls != 1 {
		t.Errorf("the upstream was called %d times, want 1", &calls)
	}
	for reason, want := range map[string]float64{"over_budget": 1, "too_large": 0} {
		if got := proxytest.CounterValue(t, e.Registry, "idemproxy_answers_not_stored_total", map[string]string{"route": "charges", "reason": reason}); got != want {
			t.Errorf("idemproxy_answers_not_stored_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	// The budget was given back: a small answer is stored again.
	proxytest.WantStatus(t, "a small body", e.Do("POST", "/charges", "{}", "Idempotency-Key", "k-2"), 200, "")
}

// TestClientThatClosesMidReplay: a retry that goes away in the middle of
// a large replay changes nothing: the key stays completed and the next
// retry gets the whole answer.
func TestClientThatClosesMidReplay(t *testing.T) {
	t.Parallel()
	calls := 0
	e := &proxytest.Env{T: t}
	e.Start(bigUpstream(t, &calls).URL, slowRoutes)
	if a := e.Do("POST", "/charges", "{}", "Idempotency-Key", "k-mid"); a.Status != 200 || len(a.Body) != len(bigAnswer) {
		t.Fatalf("first: %d, %d bytes (%v)", a.Status, len(a.Body), a.Err)
	}
	for range 3 {
		conn := rawCharge(t, e, "k-mid", 4<<10)
		conn.SetReadDeadline(time.Now().Add(time.Minute))
		io.ReadFull(conn, make([]byte, 64<<10))
		conn.Close()
	}
	wantReplayedOnce(t, e, "k-mid", &calls)
}

// TestShutdownCutsOffADelivery: a client that does not read its committed
// answer does not hold the proxy past its shutdown deadline: Abort ends
// the delivery at once (the answer is committed), so Wait returns well
// before the route's upstream_timeout (1h here).
func TestShutdownCutsOffADelivery(t *testing.T) {
	t.Parallel()
	calls := 0
	e := &proxytest.Env{T: t}
	e.Start(bigUpstream(t, &calls).URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: 1h
    lease: 2h
    max_stored_body_bytes: 16777216
`)
	rawCharge(t, e, "k-shut", 4<<10)
	proxytest.Eventually(t, "the answer is committed", func() bool { return e.State("charges", "", "k-shut") == store.StateCompleted })
	e.Proxy.Abort()
	done := make(chan struct{})
	go func() { e.Proxy.Wait(); close(done) }()
	proxytest.Eventually(t, "Wait returns after Abort", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

// wantReplayedOnce checks that a retry of key gets bigAnswer whole,
// replayed, and that the upstream was called once (*calls, read after the
// retry) in all.
func wantReplayedOnce(t *testing.T, e *proxytest.Env, key string, calls *int) {
	t.Helper()
	a := e.Do("POST", "/charges", "{}", "Idempotency-Key", key)
	if a.Status != 200 || !a.Replayed() || !bytes.Equal(a.Body, bigAnswer) {
		t.Errorf("retry: %d replayed=%v, %d bytes; want the whole answer replayed", a.Status, a.Replayed(), len(a.Body))
	}
	if *calls != 1 {
		t.Errorf("the upstream was called %d times, want 1", *calls)
	}
}
