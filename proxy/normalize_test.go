package proxy_test

import (
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
	send  func(e *env, order string) answer
	// withNFC is what the other spelling gets under normalize: nfc: a
	// replay (one key, one request), or 422 fingerprint-mismatch (one key,
	// but the path, query or body the fingerprint covers holds the other
	// spelling).
	withNFC string
}

var normalizeCases = []normalizeCase{
	{"header", "match: POST /charges\n    key: {header: Idempotency-Key%s}", func(e *env, o string) answer {
		return e.do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", o)
	}, "replayed"},
	{"json", "match: POST /charges\n    key: {json: orderId%s}", func(e *env, o string) answer {
		return e.do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, o))
	}, "fingerprint-mismatch"},
	{"json, the key's field out of the fingerprint", "match: POST /charges\n    key: {json: orderId%s}\n    fingerprint: {ignore: [orderId]}", func(e *env, o string) answer {
		return e.do("POST", "/charges", fmt.Sprintf(`{"orderId":%q,"amount":10}`, o))
	}, "replayed"},
	{"query", "match: POST /charges\n    key: {query: id%s}", func(e *env, o string) answer {
		return e.do("POST", "/charges?id="+url.QueryEscape(o), `{"orderId":"ORD-1","amount":10}`)
	}, "fingerprint-mismatch"},
	{"path", "match: POST /orders/{orderId}/charges\n    key: {path: orderId%s}", func(e *env, o string) answer {
		return e.do("POST", "/orders/"+url.PathEscape(o)+"/charges", `{"amount":10}`)
	}, "fingerprint-mismatch"},
	{"composite", "match: POST /charges\n    key: {parts: [{header: Idempotency-Key}, {header: X-Tenant}]%s}", func(e *env, o string) answer {
		return e.do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", o, "X-Tenant", "T-"+o)
	}, "replayed"},
}

// TestKeyNormalize: keys are compared byte for byte, so the NFC and NFD
// spellings of "CAFÉ-1" are two keys and two charges at the upstream, from
// every source; with key.normalize: nfc they are one key and one charge:
// the second spelling is replayed, or, when the path, query string or body
// that the fingerprint covers holds it, a 422 (never a second charge).
func TestKeyNormalize(t *testing.T) {
	for _, c := range normalizeCases {
		for _, normalize := range []string{"", ", normalize: none", ", normalize: nfc"} {
			t.Run(c.name+normalize, func(t *testing.T) {
				route := fmt.Sprintf(c.route, normalize)
				e := newEnv(t, "  - name: charges\n    "+route+"\n")
				first := c.send(e, orderNFC)
				if first.status != 201 || first.replayed() {
					t.Fatalf("first spelling: %v, want 201 forwarded", first)
				}
				second := c.send(e, orderNFD)
				charges := e.totalCharges()
				if !strings.Contains(normalize, "nfc") {
					if second.status != 201 || second.replayed() || charges != 2 {
						t.Errorf("byte for byte: the other spelling got %v, %d charges; want 201 forwarded, 2 charges (two keys)", second, charges)
					}
					return
				}
				switch c.withNFC {
				case "replayed":
					if second.status != 201 || !second.replayed() {
						t.Errorf("nfc: the other spelling got %v, want the first answer replayed", second)
					}
				default:
					wantStatus(t, "nfc: the other spelling", second, 422, c.withNFC)
				}
				if charges != 1 {
					t.Errorf("nfc: %d charges at the upstream, want 1", charges)
				}
				if third := c.send(e, orderNFD); third.status != second.status || third.replayed() != second.replayed() {
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
	e := newEnv(t, `  - name: header
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
		send func() answer
	}{
		{"header", func() answer {
			return e.do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", "CAF\xc3-1")
		}},
		{"query", func() answer { return e.do("POST", "/q/charges?id=CAF%C3-1", `{"amount":10}`) }},
		{"json", func() answer { return e.do("POST", "/j/charges", "{\"orderId\":\"CAF\xc3-1\",\"amount\":10}") }},
	} {
		a := tc.send()
		wantStatus(t, tc.name+": a key that is not UTF-8", a, 400, "invalid-key")
	}
	if n := e.totalCharges(); n != 0 {
		t.Errorf("%d charges at the upstream, want 0", n)
	}
}

// TestKeyNormalizeTurnedOn: a route that turns normalize: nfc on by a
// reload still finds the keys it stored byte for byte before: the retry of
// a charge made in NFD before the reload is replayed, not charged again.
func TestKeyNormalizeTurnedOn(t *testing.T) {
	const route = "  - name: charges\n    match: POST /charges\n    key: {header: Idempotency-Key%s}\n"
	e := newEnv(t, fmt.Sprintf(route, ""))
	send := func(o string) answer {
		return e.do("POST", "/charges", `{"orderId":"ORD-1","amount":10}`, "Idempotency-Key", o)
	}
	if a := send(orderNFD); a.status != 201 {
		t.Fatalf("before the reload: %v", a)
	}
	if err := e.p.Reload(parseConfig(t, e.stub.URL, fmt.Sprintf(route, ", normalize: nfc"))); err != nil {
		t.Fatal(err)
	}
	if a := send(orderNFD); a.status != 201 || !a.replayed() {
		t.Errorf("the NFD retry after the reload got %v, want the stored answer replayed", a)
	}
	if n := e.totalCharges(); n != 1 {
		t.Errorf("%d charges at the upstream, want 1", n)
	}
}
