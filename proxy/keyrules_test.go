package proxy_test

import (
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
)

const keyRulesRoutes = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
  - name: by-header
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
`

// Issue 16: "\udc00" and "\udc01" were both U+FFFD in the key and the
// fingerprint, so the second order (two orders to a JavaScript or Python
// upstream) got the first's answer and was never charged. A key decoders
// read differently is a 400, never forwarded.
func TestKeyLoneSurrogateRefused(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, keyRulesRoutes)
	for _, id := range []string{`"\udc00"`, `"\udc01"`, `"\ud800"`, `"A-\udbff"`, `"\udc00\ud800"`} {
		a := e.Do("POST", "/charges", `{"orderId": `+id+`, "amount": 5}`)
		proxytest.WantStatus(t, id, a, 400, "invalid-key")
		if d, _ := a.Field("detail").(string); !strings.Contains(d, "lone UTF-16 surrogate") {
			t.Errorf("%s: detail %q does not name the lone surrogate", id, d)
		}
	}
	// Raw bytes that are not UTF-8 were refused already; still so.
	proxytest.WantStatus(t, "raw \\xff", e.Do("POST", "/charges", "{\"orderId\": \"A\xff\", \"amount\": 5}"), 400, "invalid-key")
	if got := e.TotalCharges(); got != 0 {
		t.Errorf("upstream charged %d times, want never called", got)
	}
	if got := e.Outcomes("charges", proxy.OutcomeBadRequest); got != 6 {
		t.Errorf("bad_request outcomes = %d, want 6", got)
	}
	// A lone surrogate outside the key is kept in the fingerprint: two
	// notes that JavaScript reads differently are not one request.
	first := e.Do("POST", "/charges", `{"orderId": "S-1", "amount": 5, "note": "\udc00"}`)
	proxytest.WantStatus(t, "note \\udc00", first, 201, "")
	second := e.Do("POST", "/charges", `{"orderId": "S-1", "amount": 5, "note": "\udc01"}`)
	proxytest.WantStatus(t, "note \\udc01", second, 422, "fingerprint-mismatch")
	if got := e.TotalCharges(); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// Issue 16: 4200 then 4.2e3 were two keys and two charges, while Go,
// Python and JavaScript upstreams read one order. Now the second is the
// first's replay, and so is every other spelling of 4200.
func TestKeyNumberSpellingsOneKey(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, keyRulesRoutes)
	first := e.Do("POST", "/charges", `{"orderId": 4200, "amount": 5}`)
	proxytest.WantStatus(t, "4200", first, 201, "")
	for _, id := range []string{`4.2e3`, `4200.0`, `42e2`, `4.2E+3`, `4200.000`} {
		a := e.Do("POST", "/charges", `{"orderId": `+id+`, "amount": 5}`)
		proxytest.WantStatus(t, id, a, 201, "")
		if !a.Replayed() || string(a.Body) != string(first.Body) {
			t.Errorf("%s: %s, replayed %v; want the replay of %s", id, a.Body, a.Replayed(), first.Body)
		}
	}
	// The amount too: 5 and 5.0 are one fingerprint.
	if a := e.Do("POST", "/charges", `{"orderId": 4200, "amount": 5.0}`); !a.Replayed() {
		t.Errorf("amount 5.0: %s, want the replay", a)
	}
	if got := e.TotalCharges(); got != 1 {
		t.Errorf("upstream charged %d times, want once", got)
	}
	// Values decoders read differently are a 400 naming the number.
	for id, why := range map[string]string{
		`-0`:                 "negative zero",
		`-0.0`:               "negative zero",
		`9007199254740993`:   "more digits",
		`12345678901234567`:  "beyond ±2^53",
		`1e400`:              "out of the range",
		`1.0000000000000001`: "more digits",
	} {
		a := e.Do("POST", "/charges", `{"orderId": `+id+`, "amount": 5}`)
		proxytest.WantStatus(t, id, a, 400, "invalid-key")
		if d, _ := a.Field("detail").(string); !strings.Contains(d, "the number "+id) || !strings.Contains(d, why) {
			t.Errorf("%s: detail %q, want it to name the number and %q", id, d, why)
		}
	}
	if got := e.TotalCharges(); got != 1 {
		t.Errorf("upstream charged %d times, want once", got)
	}
}

// Issue 16: Idempotency-Key: "k-1" then k-1 were two keys and two charges;
// the IETF draft's header is a Structured Field string. Now one key.
func TestKeyHeaderStructuredString(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, keyRulesRoutes)
	first := e.Do("POST", "/orders/H-1/charges", `{"amount": 5}`, "Idempotency-Key", `"k-1"`)
	proxytest.WantStatus(t, `"k-1"`, first, 201, "")
	for _, k := range []string{`k-1`, `"k-1"`} {
		if a := e.Do("POST", "/orders/H-1/charges", `{"amount": 5}`, "Idempotency-Key", k); a.Status != 201 || !a.Replayed() {
			t.Errorf("Idempotency-Key %s: %s, replayed %v; want the replay", k, a, a.Replayed())
		}
	}
	// And the other way round: bare first, quoted second.
	proxytest.WantStatus(t, "k-2", e.Do("POST", "/orders/H-2/charges", `{"amount": 5}`, "Idempotency-Key", `k-2`), 201, "")
	if a := e.Do("POST", "/orders/H-2/charges", `{"amount": 5}`, "Idempotency-Key", `"k-2"`); !a.Replayed() {
		t.Errorf(`"k-2" after k-2: %s, want the replay`, a)
	}
	if got := e.TotalCharges(); got != 2 {
		t.Errorf("upstream charged %d times, want 2", got)
	}
	for _, k := range []string{`"k-1`, `"k\-1"`, `"k-1";x=1`, `"k-1", "k-1"`, `"k-1"x`} {
		a := e.Do("POST", "/orders/H-3/charges", `{"amount": 5}`, "Idempotency-Key", k)
		proxytest.WantStatus(t, k, a, 400, "invalid-key")
		if d, _ := a.Field("detail").(string); !strings.Contains(d, "structured field string") {
			t.Errorf("%s: detail %q does not name the malformed structured value", k, d)
		}
	}
	// "" is a missing key, as an empty value is.
	proxytest.WantStatus(t, `""`, e.Do("POST", "/orders/H-3/charges", `{"amount": 5}`, "Idempotency-Key", `""`), 400, "missing-key")
	if got := e.Charges("H-3"); got != 0 {
		t.Errorf("H-3 charged %d times, want never", got)
	}
}

// scope.header is not read as a structured string: it names a client (an
// API key, a token), and the upstream's authentication tells "k1" and k1
// apart, so they are two key spaces. At worst a client that changes how
// it writes its own credential is charged again; never does one client
// receive another's stored answer.
func TestKeyScopeHeaderStaysRaw(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: scoped
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
    scope: {header: X-Api-Key}
`)
	a := e.Do("POST", "/orders/S-1/charges", `{"amount": 5}`, "Idempotency-Key", "k-1", "X-Api-Key", `"client-1"`)
	proxytest.WantStatus(t, `scope "client-1"`, a, 201, "")
	b := e.Do("POST", "/orders/S-1/charges", `{"amount": 5}`, "Idempotency-Key", `"k-1"`, "X-Api-Key", `client-1`)
	proxytest.WantStatus(t, "scope client-1", b, 201, "")
	if b.Replayed() {
		t.Errorf("scope client-1 got the answer stored under scope \"client-1\"")
	}
	// A malformed structured value is no error in a scope.
	proxytest.WantStatus(t, `scope "x`, e.Do("POST", "/orders/S-2/charges", `{"amount": 5}`, "Idempotency-Key", "k-2", "X-Api-Key", `"x`), 201, "")
}
