package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAnswerBrokenOffIsNotPassedAsComplete: the upstream charges, starts a
// chunked answer, then its connection breaks. The client must see a broken
// answer, not a short one that looks complete, and the key is in doubt.
func TestAnswerBrokenOffIsNotPassedAsComplete(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.Write([]byte(`{"status":"decl`))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // connection reset mid-body
	}))
	defer up.Close()
	e := &env{t: t}
	e.start(up.URL, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
`)
	a := e.do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k1")
	if a.err == nil {
		t.Errorf("the client received a truncated upstream body as a complete %d answer", a.status)
	}
	wantStatus(t, "retry", e.do("POST", "/charges", `{"amount":1}`, "Idempotency-Key", "k1"), 409, "outcome-in-doubt")
}
