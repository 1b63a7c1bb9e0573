package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWaiterIsNotGivenAnotherRequestsAnswer: B waits on A's key; A is
// released (429) and C, another request under the same key, takes it and
// is answered. B must not be given C's answer.
func TestWaiterIsNotGivenAnotherRequestsAnswer(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch string(b) {
		case `{"amount":1}`: // A and B
			time.Sleep(200 * time.Millisecond)
			w.WriteHeader(429) // released: nothing happened
		default: // C
			time.Sleep(300 * time.Millisecond)
			w.WriteHeader(201)
			w.Write([]byte("charged 999 for C"))
		}
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    concurrent: wait
    wait_timeout: 5s
`)
	go e.Do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k") // A
	time.Sleep(50 * time.Millisecond)
	bc := make(chan proxytest.Answer)
	go func() { bc <- e.Do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k") }() // B waits
	time.Sleep(100 * time.Millisecond)
	for { // C: a different request under the same key, 422 until A releases
		c := e.Do("POST", "/charges", `{"amount":999}`, "Idempotency-Key", "k")
		if c.Status != 422 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b := <-bc
	if b.Replayed() || string(b.Body) == "charged 999 for C" {
		t.Errorf("B was answered with C's stored answer although its fingerprint differs")
	}
}

// TestWaiterThatStopsWaitingIsNotToldOK: a waiter whose request context
// ends while the key is in flight (here a client that half-closes its
// connection after its request, which ends the context at once; a
// wait_timeout past server.read_timeout does the same) is answered 409
// request-in-flight. Before, the handler returned without an answer and
// the server sent an empty 200 OK: a success for a charge still in flight,
// which may yet fail.
func TestWaiterThatStopsWaitingIsNotToldOK(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(201)
		w.Write([]byte("charged"))
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    concurrent: wait
    wait_timeout: 5s
`)
	first := make(chan proxytest.Answer)
	go func() { first <- e.Do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k") }()
	defer func() {
		close(release)
		if a := <-first; a.Status != 201 {
			t.Errorf("first request: %s, want 201", a)
		}
	}()
	proxytest.Eventually(t, "the first request holds the key", func() bool { return e.State("charges", "", "k") == "in_flight" })
	conn, err := net.Dial("tcp", e.Server.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"amount":1}`
	fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
	proxytest.WantStatus(t, "the waiter that stopped waiting", a, 409, "request-in-flight")
}
