package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The attacks of issue 25's hostile pass that the proxy already held,
// pinned so that they keep holding: request smuggling, a 1 MB key, JSON
// nested 100,000 deep.

// rawAnswers writes raw to a new connection to addr and reads every
// answer the server sends until it closes the connection or goes quiet.
func rawAnswers(t *testing.T, addr, raw string) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	var out []*http.Response
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp)
	}
}

// TestSmuggledRequestsAreNeverForwarded: a request that frames its body
// two ways (Content-Length and Transfer-Encoding, two lengths, an
// obfuscated coding) never lets a second request hidden in its body reach
// the upstream past the key check. The proxy may read the hidden bytes as
// a pipelined request of its own (then its key is checked like any
// other), or refuse the whole: each attack is sent twice, and the hidden
// order is charged at most once.
func TestSmuggledRequestsAreNeverForwarded(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
`)
	addr := strings.TrimPrefix(e.Server.URL, "http://")
	hidden := `{"orderId":"SMUGGLED","amount":1}`
	inner := fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(hidden), hidden)
	outer := `{"orderId":"OUTER-%d","amount":1}`
	tests := []struct {
		name string
		raw  func(i int) string
	}{
		{"content-length and chunked", func(i int) string {
			body := fmt.Sprintf(outer, i)
			chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
			return fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s%s",
				len(chunked), chunked, inner)
		}},
		{"chunked then content-length", func(i int) string {
			body := fmt.Sprintf(outer, i)
			return fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n%x\r\n%s\r\n0\r\n\r\n%s",
				len(body), len(body), body, inner)
		}},
		{"two content-lengths", func(i int) string {
			body := fmt.Sprintf(outer, i)
			return fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n%s%s",
				len(body), len(body)+len(inner), body, inner)
		}},
		{"obfuscated transfer-encoding", func(i int) string {
			body := fmt.Sprintf(outer, i)
			return fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: xchunked\r\n\r\n%s%s",
				len(body), body, inner)
		}},
		{"transfer-encoding with a space before the colon", func(i int) string {
			body := fmt.Sprintf(outer, i)
			return fmt.Sprintf("POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding : chunked\r\n\r\n%s%s",
				len(body), body, inner)
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 2 {
				for _, resp := range rawAnswers(t, addr, tt.raw(i)) {
					// 501: Go's answer to a coding it does not know.
					if resp.StatusCode/100 == 5 && resp.StatusCode != http.StatusNotImplemented {
						t.Errorf("answered %s", resp.Status)
					}
				}
			}
			if got := e.Charges("SMUGGLED"); got > 1 {
				t.Fatalf("the request hidden in the body was charged %d times, want at most 1", got)
			}
			if got := e.Charges(fmt.Sprintf("OUTER-%d", i)); got > 1 {
				t.Fatalf("the outer request was charged %d times, want at most 1", got)
			}
		})
	}
	// The hidden request, sent on its own, is served once: the checks
	// above could not pass because nothing reached the stub.
	for range 2 {
		if a := e.Do("POST", "/charges", hidden); a.Status != 201 {
			t.Fatalf("the plain request: %s", a)
		}
	}
	if got := e.Charges("SMUGGLED"); got != 1 {
		t.Fatalf("charged %d times, want 1", got)
	}
}

// TestOversizedAndDeepKeysAreRefused: a 1 MB key, in the body or in a
// header, and a JSON body nested 100,000 deep get a problem answer, never
// reach the upstream, and leave the proxy serving.
func TestOversizedAndDeepKeysAreRefused(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
  - name: header-charges
    match: POST /header/charges
    key: {header: Idempotency-Key}
`)
	big := strings.Repeat("k", 1_000_000)
	deep := strings.Repeat(`{"a":`, 100_000) + `1` + strings.Repeat("}", 100_000)
	deepArray := `{"orderId":"DEEP","x":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}`
	tests := []struct {
		name    string
		path    string
		body    string
		hdr     []string
		status  int
		problem string // "" when the answer is the HTTP server's own (431)
	}{
		{"1 MB key in the body", "/charges", `{"orderId":"` + big + `","amount":1}`, nil, 400, "invalid-key"},
		// The binary's 64 KiB header limit answers 431 first; behind Go's
		// default limit of 1 MB the key rule does.
		{"1 MB key in a header", "/header/charges", `{"amount":1}`, []string{"Idempotency-Key", big[:900_000]}, 400, "invalid-key"},
		{"object nested 100,000 deep", "/charges", deep, nil, 400, "invalid-json"},
		{"arrays nested 100,000 deep beside the key", "/charges", deepArray, nil, 400, "invalid-json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := e.Do("POST", tt.path, tt.body, tt.hdr...)
			if a.Err != nil {
				t.Fatalf("no answer: %v", a.Err)
			}
			if a.Status != tt.status {
				t.Fatalf("status = %d, want %d: %.200s", a.Status, tt.status, a.Body)
			}
			if got := a.ProblemType(); got != tt.problem {
				t.Errorf("problem = %q, want %q", got, tt.problem)
			}
		})
	}
	if n := e.TotalCharges(); n != 0 {
		t.Errorf("the upstream charged %d times, want 0", n)
	}
	if a := e.Charge(`"ORD-AFTER"`, 1); a.Status != 201 {
		t.Fatalf("a charge after the attacks: %s", a)
	}
}
