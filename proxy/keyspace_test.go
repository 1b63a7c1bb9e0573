package proxy_test

import (
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestHeldRoute: a held route answers 503 keyspace-held naming the route,
// its keyspace and why, and forwards nothing; another route serves, and a
// held route in mode: observe forwards. Hold(nil) serves it again.
func TestHeldRoute(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `  - name: charges-v2
    match: POST /charges
    key: {json: orderId}
  - name: watched
    mode: observe
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
`)
	e.Proxy.Hold(map[string]string{"charges-v2": "keyspace charges has live keys", "watched": "a test"})
	a := e.Charge(`"ORD-H1"`, 10)
	proxytest.WantStatus(t, "a held route", a, 503, "keyspace-held")
	if a.Field("route") != "charges-v2" || a.Field("keyspace") != "charges-v2" || a.Header.Get("Retry-After") != "30" {
		t.Errorf("held answer = %s, want route and keyspace charges-v2 and Retry-After: 30", a)
	}
	if d, _ := a.Field("detail").(string); d == "" || !strings.Contains(d, "keyspace charges has live keys") {
		t.Errorf("held answer's detail %q does not say why", d)
	}
	if got := e.Charges("ORD-H1"); got != 0 {
		t.Errorf("ORD-H1 charged %d times while held, want 0", got)
	}
	if got := e.Outcomes("charges-v2", proxy.OutcomeStoreError); got != 1 {
		t.Errorf("outcome store_error counted %d times, want 1", got)
	}
	if a := e.Do("POST", "/orders/ORD-H2/charges", `{"amount": 1}`); a.Status != 201 {
		t.Errorf("the held route in observe mode = %s, want it forwarded", a)
	}
	e.Proxy.Hold(nil)
	if a := e.Charge(`"ORD-H1"`, 10); a.Status != 201 {
		t.Errorf("after Hold(nil) = %s, want 201", a)
	}
}

// TestKeyspaceSharedAndKept: a route renamed with its keyspace kept finds
// the keys stored under its old name, and two routes sharing a keyspace
// replay each other's answers.
func TestKeyspaceSharedAndKept(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `  - name: charges
    match: POST /charges
    key: {json: orderId}
  - name: charges-by-order
    keyspace: charges
    match: POST /orders/{orderId}/charges
    key: {json: orderId}
`)
	if a := e.Charge(`"ORD-S1"`, 10); a.Status != 201 {
		t.Fatalf("first charge = %s", a)
	}
	if a := e.Do("POST", "/orders/ORD-S1/charges", `{"orderId": "ORD-S1", "amount": 10}`); a.Status != 422 {
		// Same key in the shared keyspace, another path: another fingerprint.
		t.Errorf("the same key on the other route of the keyspace = %s, want 422 (found, with another request's fingerprint)", a)
	}
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, `  - name: charges-v2
    keyspace: charges
    match: POST /charges
    key: {json: orderId}
`)); err != nil {
		t.Fatal(err)
	}
	if a := e.Charge(`"ORD-S1"`, 10); !a.Replayed() || e.Charges("ORD-S1") != 1 {
		t.Errorf("retry on the renamed route = %s, want the stored answer replayed, charged once", a)
	}
}
