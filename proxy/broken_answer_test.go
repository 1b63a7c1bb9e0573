package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAnswerBrokenOffIsNotPassedAsComplete: the upstream charges, starts
// an answer, then its connection breaks (or it closes the connection short
// of the Content-Length it announced). The client must never see a short
// answer that looks complete, and the key is in doubt. An answer that is
// read ahead of the client (it fits max_stored_body_bytes) broke off
// before the client got anything: it gets 502 upstream-reset. One that is
// streamed (too large to store) breaks off at the client too.
func TestAnswerBrokenOffIsNotPassedAsComplete(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxStore int
		lie      bool
		want     int // 0: a broken answer
	}{
		{"read ahead", 1 << 20, false, 502},
		{"read ahead, Content-Length a lie", 1 << 20, true, 502},
		{"streamed", 4, false, 0},
		{"streamed, Content-Length a lie", 4, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if tc.lie {
					w.Header().Set("Content-Length", "1000")
				}
				w.WriteHeader(200)
				w.Write([]byte(`{"status":"decl`))
				http.NewResponseController(w).Flush()
				panic(http.ErrAbortHandler) // connection reset mid-body
			}))
			defer up.Close()
			e := &proxytest.Env{T: t}
			e.Start(up.URL, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    max_stored_body_bytes: %d
`, tc.maxStore))
			a := e.Do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k1")
			switch {
			case tc.want == 0 && a.Err == nil:
				t.Errorf("the client received a truncated upstream body as a complete %d answer", a.Status)
			case tc.want != 0:
				proxytest.WantStatus(t, "the broken answer", a, tc.want, "upstream-reset")
			}
			proxytest.WantStatus(t, "retry", e.Do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k1"), 409, "outcome-in-doubt")
		})
	}
}

// TestAnswerBodyThatStalls: the upstream sends its headers, then nothing
// until upstream_timeout. The answer is read ahead of the client, which
// has had nothing yet: it gets 504 upstream-timeout (not a 200 that breaks
// off), and the key is in doubt.
func TestAnswerBodyThatStalls(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.Write([]byte(`{"status":`))
		http.NewResponseController(w).Flush()
		<-release
	}))
	defer up.Close()
	defer close(release)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    upstream_timeout: 300ms
`)
	proxytest.WantStatus(t, "stalled answer", e.Do("POST", "/charges", `{}`, "Idempotency-Key", "k1"), 504, "upstream-timeout")
	proxytest.WantStatus(t, "retry", e.Do("POST", "/charges", `{}`, "Idempotency-Key", "k1"), 409, "outcome-in-doubt")
}
