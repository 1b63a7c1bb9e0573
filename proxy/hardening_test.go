package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// hostPost sends a charge with the given Host header.
func (e *env) hostPost(host, body string) answer {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.srv.URL+"/charges", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Host = host
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// TestHostPatternsMatchAsDNSNames: a host-bound route protects its host
// however the client spells it; before, "API.EXAMPLE.COM" and
// "api.example.com." passed through unprotected and were charged each time.
func TestHostPatternsMatchAsDNSNames(t *testing.T) {
	for _, pattern := range []string{"POST api.example.com/charges", "POST API.Example.com./charges"} {
		e := newEnv(t, fmt.Sprintf(`
  - name: charges
    match: %s
    key: {json: orderId}
`, pattern))
		for i, host := range []string{"api.example.com", "API.EXAMPLE.COM", "api.example.com.", "api.example.com:8080", "Api.Example.Com.:443"} {
			order := fmt.Sprintf("ORD-H%d", i)
			for range 3 {
				a := e.hostPost(host, fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order))
				if a.status != 201 {
					t.Fatalf("%s, Host %s: %s", pattern, host, a)
				}
			}
			if got := e.charges(order); got != 1 {
				t.Errorf("%s, Host %q: charged %d times, want 1", pattern, host, got)
			}
		}
		// Another host is not this route's.
		e.hostPost("other.example.com", `{"orderId": "ORD-OTHER", "amount": 1}`)
		e.hostPost("other.example.com", `{"orderId": "ORD-OTHER", "amount": 1}`)
		if got := e.charges("ORD-OTHER"); got != 2 {
			t.Errorf("%s: another host charged %d times, want 2 (passthrough)", pattern, got)
		}
	}
}

// TestRepeatedScopeHeader: two scope values are a 400, never scoped by
// the first (eve's request in alice's key space, or the reverse).
func TestRepeatedScopeHeader(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    scope: {header: X-Api-Key}
`)
	a := e.charge(`"ORD-S"`, 1, "X-Api-Key", "eve", "X-Api-Key", "alice")
	wantStatus(t, "repeated scope", a, 400, "invalid-scope")
	if got := e.charges("ORD-S"); got != 0 {
		t.Errorf("charged %d times, want 0", got)
	}
	wantStatus(t, "one scope", e.charge(`"ORD-S"`, 1, "X-Api-Key", "alice"), 201, "")
}

// TestValidationErrorIsReleased: an upstream 400 ("amount must be greater
// than zero") keeps nothing, so the corrected request under the same key
// is charged, not a 422 for the key's whole TTL.
func TestValidationErrorIsReleased(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	wantStatus(t, "amount 0", e.charge(`"ORD-V"`, 0), 400, "")
	if st := e.state("charges", "", "ORD-V"); st != "" {
		t.Errorf("after the upstream's 400 the key is %q, want released", st)
	}
	wantStatus(t, "corrected", e.charge(`"ORD-V"`, 10), 201, "")
	wantStatus(t, "retry", e.charge(`"ORD-V"`, 10), 201, "")
	if got := e.charges("ORD-V"); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	if got := e.outcomes("charges", proxy.OutcomeReleased); got != 1 {
		t.Errorf("released = %d, want 1", got)
	}
}

// TestKeyNameInAnotherCase: with on_missing_key: forward, {"OrderId": "X"}
// is read as the key (a Go upstream decodes it as orderId), not forwarded
// unprotected on every retry.
func TestKeyNameInAnotherCase(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    on_missing_key: forward
`)
	for range 3 {
		e.do("POST", "/charges", `{"OrderId": "ORD-C", "amount": 5}`)
	}
	if got := e.charges("ORD-C"); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	a := e.do("POST", "/charges", `{"orderId": "ORD-D", "OrderId": "ORD-E", "amount": 5}`)
	wantStatus(t, "two cases", a, 400, "invalid-json")
	if got := e.totalCharges(); got != 1 {
		t.Errorf("total charges %d, want 1", got)
	}
}
