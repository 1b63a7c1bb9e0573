package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bytes"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// The two spellings of one order ID: É as one code point (NFC) and as E
// with a combining acute accent (NFD).
const (
	orderNFC = "CAF\u00c9-1"
	orderNFD = "CAFE\u0301-1"
)

// normalizeCase is a route keyed from one source, and how a charge
// carries order in it.
type normalizeCase struct {
	name  string
	route string // the route's YAML, without key.normalize
	send  func(e *proxytest.Env, order string) proxytest.Answer
	// withNFC is what the other spelling gets under normalize: nfc: a
	// replay (one key, one request), or 422 fingerprint-mismatch (one key,
	// but the path, query or body the fingerprint covers holds the other
	// spelling).
	withNFC string
}

var normalizeCases = []normalizeCase{
	{"header", "match: POST /charges\n    key: {header: Idempotency-Key%s}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", o)
	}, "replayed"},
	{"json", "match: POST /charges\n    key: {json: orderId%s}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, o))
	}, "fingerprint-mismatch"},
	{"json, the key's field out of the fingerprint", "match: POST /charges\n    key: {json: orderId%s}\n    fingerprint: {ignore: [orderId]}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, o))
	}, "replayed"},
	{"query", "match: POST /charges\n    key: {query: id%s}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/charges?id="+url.QueryEscape(o), `{"orderId":"ORD-1","amount":10}`)
	}, "fingerprint-mismatch"},
	{"path", "match: POST /orders/{orderId}/charges\n    key: {path: orderId%s}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/orders/"+url.PathEscape(o)+"/charges", `{"amount":10}`)
	}, "fingerprint-mismatch"},
	{"composite", "match: POST /charges\n    key: {parts: [{header: Idempotency-Key}, {header: X-Tenant}]%s}", func(e *proxytest.Env, o string) proxytest.Answer {
		return e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", o, "X-Tenant", "T-"+o)
	}, "replayed"},
}

// TestKeyNormalize: keys are compared byte for byte, so the NFC and NFD
// spellings of "CAFÉ-1" are two keys and two charges at the upstream, from
// every source; with key.normalize: nfc they are one key and one charge:
// the second spelling is replayed, or, when the path, query string or body
// that the fingerprint covers holds it, a 422 (never a second charge).
func TestKeyNormalize(t *testing.T) {
	t.Parallel()
	for _, c := range normalizeCases {
		for _, normalize := range []string{"", ", normalize: none", ", normalize: nfc"} {
			t.Run(c.name+normalize, func(t *testing.T) {
				route := fmt.Sprintf(c.route, normalize)
				e := proxytest.New(t, "  - name: charges\n    "+route+"\n")
				first := c.send(e, orderNFC)
				if first.Status != 201 || first.Replayed() {
					t.Fatalf("first spelling: %v, want 201 forwarded", first)
				}
				second := c.send(e, orderNFD)
				charges := e.TotalCharges()
				if !strings.Contains(normalize, "nfc") {
					if second.Status != 201 || second.Replayed() || charges != 2 {
						t.Errorf("byte for byte: the other spelling got %v, %d charges; want 201 forwarded, 2 charges (two keys)", second, charges)
					}
					return
				}
				switch c.withNFC {
				case "replayed":
					if second.Status != 201 || !second.Replayed() {
						t.Errorf("nfc: the other spelling got %v, want the first answer replayed", second)
					}
				default:
					proxytest.WantStatus(t, "nfc: the other spelling", second, 422, c.withNFC)
				}
				if charges != 1 {
					t.Errorf("nfc: %d charges at the upstream, want 1", charges)
				}
				if third := c.send(e, orderNFD); third.Status != second.Status || third.Replayed() != second.Replayed() {
					t.Errorf("nfc: the other spelling again got %v, want %v as the first time", third, second)
				}
			})
		}
	}
}

// TestKeyNormalizeRefusals: with normalize: nfc, a key that is not UTF-8
// is still a 400 invalid-key and nothing is forwarded, from the header,
// the query string and the JSON body.
func TestKeyNormalizeRefusals(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `  - name: header
    match: POST /charges
    key: {header: Idempotency-Key, normalize: nfc}
  - name: query
    match: POST /q/charges
    key: {query: id, normalize: nfc}
  - name: json
    match: POST /j/charges
    key: {json: orderId, normalize: nfc}
`)
	for _, tc := range []struct {
		name string
		send func() proxytest.Answer
	}{
		{"header", func() proxytest.Answer {
			return e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", "CAF\xc3-1")
		}},
		{"query", func() proxytest.Answer { return e.Do("POST", "/q/charges?id=CAF%C3-1", `{"amount":10}`) }},
		{"json", func() proxytest.Answer {
			return e.Do("POST", "/j/charges", "{\"orderId\":\"CAF\xc3-1\",\"amount\":10}")
		}},
	} {
		a := tc.send()
		proxytest.WantStatus(t, tc.name+": a key that is not UTF-8", a, 400, "invalid-key")
	}
	if n := e.TotalCharges(); n != 0 {
		t.Errorf("%d charges at the upstream, want 0", n)
	}
}

// turnedOnCases are routes keyed from every source and composite, each
// with a charge whose key holds orderNFD: %s in route is where
// ", normalize: nfc" goes.
var turnedOnCases = []struct {
	name  string
	route string
	send  func(e *proxytest.Env) proxytest.Answer
}{
	{"header", "match: POST /charges\n    key: {header: Idempotency-Key%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", orderNFD)
	}},
	{"json", "match: POST /charges\n    key: {json: orderId%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, orderNFD))
	}},
	{"query", "match: POST /charges\n    key: {query: id%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges?id="+url.QueryEscape(orderNFD), `{"orderId":"ORD-1","amount":10}`)
	}},
	{"path", "match: POST /orders/{orderId}/charges\n    key: {path: orderId%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/orders/"+url.PathEscape(orderNFD)+"/charges", `{"amount":10}`)
	}},
	// The header part a quoted structured string (the IETF draft's form):
	// the legacy key keeps its quotes, so it is neither the NFC key nor
	// the key as sent.
	{"composite quoted header and json", "match: POST /charges\n    key: {parts: [{header: Idempotency-Key}, {json: orderId}]%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, orderNFD), "Idempotency-Key", `"tok-1"`)
	}},
	{"composite header and header", "match: POST /charges\n    key: {parts: [{header: Idempotency-Key}, {header: X-Tenant}]%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", orderNFD, "X-Tenant", "T-"+orderNFD)
	}},
	// A number written as 4200.0: the legacy key keeps it so, the key as
	// sent reads 4200.
	{"composite json and json", "match: POST /charges\n    key: {parts: [{json: customer}, {json: orderId}]%s}", func(e *proxytest.Env) proxytest.Answer {
		return e.Do("POST", "/charges", fmt.Sprintf(`{"customer":4200.0,"orderId":%q,"amount":10}`, orderNFD))
	}},
}

// TestKeyNormalizeTurnedOn: a route that turns normalize: nfc on by a
// reload still finds the keys it stored byte for byte before, from every
// source and composite: the identical retry of a charge whose key was sent
// in NFD before the reload gets the stored answer replayed, again and
// again, and is never charged a second time.
func TestKeyNormalizeTurnedOn(t *testing.T) {
	t.Parallel()
	for _, c := range turnedOnCases {
		t.Run(c.name, func(t *testing.T) {
			route := "  - name: charges\n    " + c.route + "\n"
			e := proxytest.New(t, fmt.Sprintf(route, ""))
			first := c.send(e)
			if first.Status != 201 || first.Replayed() {
				t.Fatalf("before the reload: %v, want 201 forwarded", first)
			}
			if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, fmt.Sprintf(route, ", normalize: nfc"))); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				a := c.send(e)
				if a.Status != 201 || !a.Replayed() || !bytes.Equal(a.Body, first.Body) {
					t.Errorf("identical retry %d after the reload: got %v (replayed %t), want the stored answer replayed: %v", i+1, a, a.Replayed(), first)
				}
			}
			if n := e.TotalCharges(); n != 1 {
				t.Errorf("%d charges at the upstream, want 1", n)
			}
		})
	}
}

// TestKeyNormalizeTurnedOnKeySpace: the lookup of the key as sent stays in
// its route and scope: after the reload, another client (scope) and
// another route sending the same NFD key are forwarded, never answered
// with the record stored before the reload.
func TestKeyNormalizeTurnedOnKeySpace(t *testing.T) {
	t.Parallel()
	const routes = `  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key%[1]s}
    scope: {header: X-Api-Key}
  - name: orders
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key%[1]s}
    scope: {header: X-Api-Key}
`
	e := proxytest.New(t, fmt.Sprintf(routes, ""))
	body := `{"orderId":"ORD-1","amount":10}`
	if a := e.Do("POST", "/charges", body, "Idempotency-Key", orderNFD, "X-Api-Key", "client-a"); a.Status != 201 {
		t.Fatalf("before the reload: %v", a)
	}
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, fmt.Sprintf(routes, ", normalize: nfc"))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, client string }{
		{"another scope", "/charges", "client-b"},
		{"another route", "/orders/ORD-1/charges", "client-a"},
	} {
		a := e.Do("POST", tc.path, body, "Idempotency-Key", orderNFD, "X-Api-Key", tc.client)
		if a.Status != 201 || a.Replayed() {
			t.Errorf("%s, same NFD key after the reload: got %v (replayed %t), want 201 forwarded", tc.name, a, a.Replayed())
		}
	}
	if a := e.Do("POST", "/charges", body, "Idempotency-Key", orderNFD, "X-Api-Key", "client-a"); !a.Replayed() {
		t.Errorf("the first client's retry after the reload: got %v, want it replayed", a)
	}
	if n := e.TotalCharges(); n != 3 {
		t.Errorf("%d charges at the upstream, want 3 (one per client and route)", n)
	}
}

// TestKeyNormalizeLookupCost: under normalize: nfc, a key sent in NFC (an
// ASCII key included) costs no store read more than without the option;
// a key sent in another spelling costs one Get more, for its spelling as
// sent.
func TestKeyNormalizeLookupCost(t *testing.T) {
	t.Parallel()
	route := "  - name: charges\n    match: POST /charges\n    key: {header: Idempotency-Key%s}\n"
	gets := func(e *proxytest.Env, key string) uint64 {
		t.Helper()
		before := storeGets(t, e)
		if a := e.Do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", key); a.Status != 201 || a.Replayed() {
			t.Fatalf("key %q: %v, want 201 forwarded", key, a)
		}
		return storeGets(t, e) - before
	}
	off := proxytest.New(t, fmt.Sprintf(route, ""))
	base := gets(off, "ORD-1")
	on := proxytest.New(t, fmt.Sprintf(route, ", normalize: nfc"))
	for _, tc := range []struct {
		key  string
		want uint64
	}{
		{"ORD-2", base},
		{"CAF\u00c9-2", base},      // NFC
		{"CAFE\u0301-3", base + 1}, // NFD
	} {
		if got := gets(on, tc.key); got != tc.want {
			t.Errorf("key %q: %d store reads, want %d", tc.key, got, tc.want)
		}
	}
}

// storeGets counts the store's Get operations observed so far.
func storeGets(t *testing.T, e *proxytest.Env) uint64 {
	t.Helper()
	mfs, err := e.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "idemproxy_store_operation_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == "get" {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}
