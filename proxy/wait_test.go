package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWaiterIsNotGivenAnotherRequestsAnswer: B waits on A's key; A is
// released (429) and C, another request under the same key, takes it and
// is answered. B must not be given C's answer.
func TestWaiterIsNotGivenAnotherRequestsAnswer(t *testing.T) {
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
	e := &env{t: t}
	e.start(up.URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    concurrent: wait
    wait_timeout: 5s
`)
	go e.do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k") // A
	time.Sleep(50 * time.Millisecond)
	bc := make(chan answer)
	go func() { bc <- e.do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k") }() // B waits
	time.Sleep(100 * time.Millisecond)
	for { // C: a different request under the same key, 422 until A releases
		c := e.do("POST", "/charges", `{"amount":999}`, "Idempotency-Key", "k")
		if c.status != 422 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b := <-bc
	if b.replayed() || string(b.body) == "charged 999 for C" {
		t.Errorf("B was answered with C's stored answer although its fingerprint differs")
	}
}
