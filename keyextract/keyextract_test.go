package keyextract

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func jsonKey(path string) Spec   { return Spec{Parts: []Source{{Kind: JSON, Name: path}}} }
func headerKey(name string) Spec { return Spec{Parts: []Source{{Kind: Header, Name: name}}} }
func queryKey(name string) Spec  { return Spec{Parts: []Source{{Kind: Query, Name: name}}} }

// extractCase is one request and the key (or error) expected from it.
type extractCase struct {
	name    string
	spec    Spec
	target  string      // request target, default /charges
	headers http.Header // request headers
	body    string
	want    string // the key, when wantErr is nil
	wantErr error  // ErrMissing, errInvalid or ErrBadJSON
}

func runExtract(t *testing.T, tc extractCase, r *http.Request) {
	t.Helper()
	got, err := tc.spec.Extract(r, []byte(tc.body))
	if tc.wantErr == nil {
		if err != nil {
			t.Fatalf("Extract() error = %v, want key %q", err, tc.want)
		}
		if got != tc.want {
			t.Fatalf("Extract() = %q, want %q", got, tc.want)
		}
		return
	}
	if !errors.Is(err, tc.wantErr) {
		t.Fatalf("Extract() = %q, %v; want error %v", got, err, tc.wantErr)
	}
	var ke *extractError
	if !errors.As(err, &ke) {
		t.Fatalf("Extract() error %T (%v) is not a *keyextract.extractError", err, err)
	}
	if got != "" {
		t.Errorf("Extract() returned key %q along with error %v, want \"\"", got, err)
	}
	if !strings.HasPrefix(err.Error(), "key ") {
		t.Errorf("error message %q does not start with the key source", err.Error())
	}
}

func newRequest(tc extractCase) *http.Request {
	target := tc.target
	if target == "" {
		target = "/charges"
	}
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(tc.body))
	for name, vs := range tc.headers {
		for _, v := range vs {
			r.Header.Add(name, v)
		}
	}
	return r
}

func TestExtractHeader(t *testing.T) {
	spec := headerKey("Idempotency-Key")
	tests := []extractCase{
		{name: "present", headers: http.Header{"Idempotency-Key": {"abc-123"}}, want: "abc-123"},
		{name: "name is case-insensitive", spec: headerKey("idempotency-key"),
			headers: http.Header{"Idempotency-Key": {"abc"}}, want: "abc"},
		{name: "spaces inside are printable", headers: http.Header{"Idempotency-Key": {"a b"}}, want: "a b"},
		{name: "unicode", headers: http.Header{"Idempotency-Key": {"commande-été-№7"}}, want: "commande-été-№7"},
		{name: "absent", wantErr: ErrMissing},
		{name: "empty", headers: http.Header{"Idempotency-Key": {""}}, wantErr: ErrMissing},
		{name: "repeated", headers: http.Header{"Idempotency-Key": {"a", "b"}}, wantErr: errInvalid},
		{name: "repeated with the same value", headers: http.Header{"Idempotency-Key": {"a", "a"}}, wantErr: errInvalid},
		{name: "other header only", headers: http.Header{"X-Correlation-Id": {"a"}}, wantErr: ErrMissing},
		{name: "body is not looked at", body: "not json", headers: http.Header{"Idempotency-Key": {"k"}}, want: "k"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.spec.Parts == nil {
				tc.spec = spec
			}
			runExtract(t, tc, newRequest(tc))
		})
	}
}

func TestExtractJSON(t *testing.T) {
	tests := []extractCase{
		{name: "top-level string", spec: jsonKey("orderId"), body: `{"orderId":"1001"}`, want: "1001"},
		{name: "top-level number", spec: jsonKey("orderId"), body: `{"orderId":1001}`, want: "1001"},
		{name: "white space around", spec: jsonKey("orderId"), body: " {\n\t\"orderId\" :  1001 \n} ", want: "1001"},
		{name: "negative number in canonical form", spec: jsonKey("n"), body: `{"n":-12.50}`, want: "-12.5"},
		{name: "exponent in canonical form", spec: jsonKey("n"), body: `{"n":1e3}`, want: "1000"},
		{name: "true", spec: jsonKey("b"), body: `{"b":true}`, want: "true"},
		{name: "false", spec: jsonKey("b"), body: `{"b":false}`, want: "false"},
		{name: "nested object", spec: jsonKey("order.id"), body: `{"order":{"id":"o-7","total":3}}`, want: "o-7"},
		{name: "nested number", spec: jsonKey("order.id"), body: `{"order":{"id":7}}`, want: "7"},
		{name: "array element", spec: jsonKey("items.0.sku"), body: `{"items":[{"sku":"A-1"},{"sku":"B-2"}]}`, want: "A-1"},
		{name: "second array element", spec: jsonKey("items.1.sku"), body: `{"items":[{"sku":"A-1"},{"sku":"B-2"}]}`, want: "B-2"},
		{name: "escaped string", spec: jsonKey("k"), body: `{"k":"a\"b\\c\u0041\u00e9"}`, want: `a"b\cAé`},
		{name: "escaped member name", spec: jsonKey("orderId"), body: `{"order\u0049d":"x"}`, want: "x"},
		{name: "other members ignored", spec: jsonKey("orderId"), body: `{"a":[1,{"b":null}],"orderId":"z","c":{}}`, want: "z"},

		{name: "null", spec: jsonKey("orderId"), body: `{"orderId":null}`, wantErr: ErrMissing},
		{name: "absent", spec: jsonKey("orderId"), body: `{"other":1}`, wantErr: ErrMissing},
		{name: "empty string", spec: jsonKey("orderId"), body: `{"orderId":""}`, wantErr: ErrMissing},
		{name: "nested absent", spec: jsonKey("order.id"), body: `{"order":{}}`, wantErr: ErrMissing},
		{name: "nested parent not an object", spec: jsonKey("order.id"), body: `{"order":5}`, wantErr: ErrMissing},
		{name: "index out of range", spec: jsonKey("items.2.sku"), body: `{"items":[{"sku":"A"}]}`, wantErr: ErrMissing},
		{name: "top-level array body", spec: jsonKey("orderId"), body: `[1,2]`, wantErr: ErrMissing},
		{name: "top-level array index", spec: jsonKey("1"), body: ` [1,2]`, want: "2"},
		// Found by FuzzExtractJSON: gjson would find the '[' inside the string.
		{name: "body is a string", spec: jsonKey("0"), body: `"[0"`, wantErr: ErrMissing},
		{name: "body is a string holding an object", spec: jsonKey("a"), body: `"{\"a\":1} {"`, wantErr: ErrMissing},
		{name: "body is a number", spec: jsonKey("0"), body: `1001`, wantErr: ErrMissing},
		{name: "body is null", spec: jsonKey("orderId"), body: `null`, wantErr: ErrMissing},
		{name: "object", spec: jsonKey("order"), body: `{"order":{"id":1}}`, wantErr: errInvalid},
		{name: "empty object", spec: jsonKey("order"), body: `{"order":{}}`, wantErr: errInvalid},
		{name: "array", spec: jsonKey("items"), body: `{"items":[1]}`, wantErr: errInvalid},
		{name: "empty array", spec: jsonKey("items"), body: `{"items":[]}`, wantErr: errInvalid},
		{name: "control character in string", spec: jsonKey("k"), body: `{"k":"a\u0000b"}`, wantErr: errInvalid},
		{name: "newline in string", spec: jsonKey("k"), body: `{"k":"a\nb"}`, wantErr: errInvalid},

		{name: "empty body", spec: jsonKey("orderId"), body: ``, wantErr: ErrBadJSON},
		{name: "white space body", spec: jsonKey("orderId"), body: "  \n", wantErr: ErrBadJSON},
		{name: "not JSON", spec: jsonKey("orderId"), body: `orderId=1001`, wantErr: ErrBadJSON},
		{name: "truncated", spec: jsonKey("orderId"), body: `{"orderId":1001`, wantErr: ErrBadJSON},
		{name: "trailing data", spec: jsonKey("orderId"), body: `{"orderId":1001} x`, wantErr: ErrBadJSON},
		{name: "two values", spec: jsonKey("orderId"), body: `{"orderId":1}{"orderId":2}`, wantErr: ErrBadJSON},
		{name: "single quotes", spec: jsonKey("orderId"), body: `{'orderId':1}`, wantErr: ErrBadJSON},
		{name: "trailing comma", spec: jsonKey("orderId"), body: `{"orderId":1,}`, wantErr: ErrBadJSON},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runExtract(t, tc, newRequest(tc))
		})
	}
}

// The article's point: the same order is the same key however the client
// typed the number.
func TestExtractJSONNumberStringEquivalence(t *testing.T) {
	for _, path := range []string{"orderId", "order.id", "items.0.id"} {
		spec := jsonKey(path)
		var bodies []string
		switch path {
		case "orderId":
			bodies = []string{`{"orderId":1001}`, `{"orderId":"1001"}`, `{ "orderId" : 1001 }`}
		case "order.id":
			bodies = []string{`{"order":{"id":1001}}`, `{"order":{"id":"1001"}}`}
		case "items.0.id":
			bodies = []string{`{"items":[{"id":1001}]}`, `{"items":[{"id":"1001"}]}`}
		}
		for _, b := range bodies {
			got, err := spec.Extract(httptest.NewRequest("POST", "/", nil), []byte(b))
			if err != nil || got != "1001" {
				t.Errorf("%s from %s: got %q, %v; want \"1001\", nil", path, b, got, err)
			}
		}
	}
}

func TestExtractQuery(t *testing.T) {
	spec := queryKey("orderId")
	tests := []extractCase{
		{name: "present", target: "/charges?orderId=1001", want: "1001"},
		{name: "among others", target: "/charges?a=1&orderId=x-9&b=2", want: "x-9"},
		{name: "percent-decoded", target: "/charges?orderId=a%20b%7Cc", want: "a b|c"},
		{name: "plus is a space", target: "/charges?orderId=a+b", want: "a b"},
		{name: "absent", target: "/charges?other=1", wantErr: ErrMissing},
		{name: "no query", target: "/charges", wantErr: ErrMissing},
		{name: "empty", target: "/charges?orderId=", wantErr: ErrMissing},
		{name: "name only", target: "/charges?orderId", wantErr: ErrMissing},
		{name: "repeated", target: "/charges?orderId=1&orderId=2", wantErr: errInvalid},
		{name: "repeated with the same value", target: "/charges?orderId=1&orderId=1", wantErr: errInvalid},
		{name: "name is case-sensitive", target: "/charges?orderid=1", wantErr: ErrMissing},
		{name: "control character", target: "/charges?orderId=a%00b", wantErr: errInvalid},
		{name: "invalid UTF-8", target: "/charges?orderId=a%FFb", wantErr: errInvalid},
		// Go leaves these pairs out; other upstreams read them.
		{name: "bad escape", target: "/charges?orderId=50%off", wantErr: errInvalid},
		{name: "semicolon in the value", target: "/charges?orderId=A;B", wantErr: errInvalid},
		{name: "semicolon before the name", target: "/charges?x=1;orderId=A", wantErr: errInvalid},
		{name: "escaped name with a bad escape", target: "/charges?order%49d=50%off", wantErr: errInvalid},
		{name: "another parameter unparsable", target: "/charges?orderId=7&x=50%off&y=a;b", want: "7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec = spec
			runExtract(t, tc, newRequest(tc))
		})
	}
}

// TestExtractPath routes requests through a ServeMux, as the proxy does, so
// that r.PathValue is set by the pattern.
func TestExtractPath(t *testing.T) {
	tests := []struct {
		name    string
		spec    Spec
		target  string
		want    string
		wantErr error
	}{
		{name: "wildcard", spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, target: "/orders/1001/charges", want: "1001"},
		{name: "percent-decoded", spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, target: "/orders/a%20b/charges", want: "a b"},
		{name: "escaped slash", spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, target: "/orders/a%2Fb/charges", want: "a/b"},
		{name: "name not in the pattern", spec: Spec{Parts: []Source{{Kind: Path, Name: "orderId"}}}, target: "/orders/1001/charges", wantErr: ErrMissing},
		{name: "control character", spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, target: "/orders/a%01b/charges", wantErr: errInvalid},
		{name: "composite with header", spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}, {Kind: Header, Name: "X-Attempt"}}},
			target: "/orders/1001/charges", want: "1001|2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			served := false
			mux.HandleFunc("POST /orders/{id}/charges", func(w http.ResponseWriter, r *http.Request) {
				served = true
				runExtract(t, extractCase{spec: tc.spec, want: tc.want, wantErr: tc.wantErr}, r)
			})
			r := httptest.NewRequest(http.MethodPost, tc.target, nil)
			r.Header.Set("X-Attempt", "2")
			mux.ServeHTTP(httptest.NewRecorder(), r)
			if !served {
				t.Fatalf("%s did not match the pattern", tc.target)
			}
		})
	}

	t.Run("outside a mux", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/orders/1001/charges", nil)
		runExtract(t, extractCase{spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, wantErr: ErrMissing}, r)
		r.SetPathValue("id", "1001")
		runExtract(t, extractCase{spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, want: "1001"}, r)
	})
}

func TestExtractComposite(t *testing.T) {
	orderAndAttempt := Spec{Parts: []Source{{Kind: JSON, Name: "orderId"}, {Kind: Header, Name: "X-Charge"}}}
	tests := []extractCase{
		{name: "two parts", spec: orderAndAttempt, body: `{"orderId":1001}`,
			headers: http.Header{"X-Charge": {"deposit"}}, want: "1001|deposit"},
		{name: "number and string equal", spec: orderAndAttempt, body: `{"orderId":"1001"}`,
			headers: http.Header{"X-Charge": {"deposit"}}, want: "1001|deposit"},
		{name: "pipe escaped", spec: orderAndAttempt, body: `{"orderId":"a|b"}`,
			headers: http.Header{"X-Charge": {"c"}}, want: "a%7Cb|c"},
		{name: "percent escaped", spec: orderAndAttempt, body: `{"orderId":"50%"}`,
			headers: http.Header{"X-Charge": {"%7C"}}, want: "50%25|%257C"},
		{name: "three parts", spec: Spec{Parts: []Source{{Kind: JSON, Name: "a"}, {Kind: JSON, Name: "b"}, {Kind: Query, Name: "c"}}},
			target: "/charges?c=3", body: `{"a":1,"b":true}`, want: "1|true|3"},
		{name: "first part missing", spec: orderAndAttempt, body: `{}`,
			headers: http.Header{"X-Charge": {"deposit"}}, wantErr: ErrMissing},
		{name: "second part missing", spec: orderAndAttempt, body: `{"orderId":1}`, wantErr: ErrMissing},
		{name: "second part repeated", spec: orderAndAttempt, body: `{"orderId":1}`,
			headers: http.Header{"X-Charge": {"a", "b"}}, wantErr: errInvalid},
		{name: "part is an object", spec: orderAndAttempt, body: `{"orderId":{}}`,
			headers: http.Header{"X-Charge": {"a"}}, wantErr: errInvalid},
		{name: "bad JSON", spec: orderAndAttempt, body: `{`,
			headers: http.Header{"X-Charge": {"a"}}, wantErr: ErrBadJSON},
		{name: "part not printable", spec: orderAndAttempt, body: `{"orderId":"a\tb"}`,
			headers: http.Header{"X-Charge": {"a"}}, wantErr: errInvalid},
		// 127 + 1 + 127 = 255 bytes.
		{name: "joined 255 bytes", spec: orderAndAttempt, body: `{"orderId":"` + strings.Repeat("a", 127) + `"}`,
			headers: http.Header{"X-Charge": {strings.Repeat("b", 127)}}, want: strings.Repeat("a", 127) + "|" + strings.Repeat("b", 127)},
		// Each part fits alone; joined they do not.
		{name: "joined 256 bytes", spec: orderAndAttempt, body: `{"orderId":"` + strings.Repeat("a", 128) + `"}`,
			headers: http.Header{"X-Charge": {strings.Repeat("b", 127)}}, wantErr: errInvalid},
		// Escaping counts: 85 '|' become 255 bytes, plus the separator.
		{name: "escaping makes it too long", spec: orderAndAttempt, body: `{"orderId":"` + strings.Repeat("|", 85) + `"}`,
			headers: http.Header{"X-Charge": {"b"}}, wantErr: errInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runExtract(t, tc, newRequest(tc))
		})
	}
}

// Without escaping, a|b + c and a + b|c would both be "a|b|c": two orders,
// one key.
func TestExtractCompositeUnambiguous(t *testing.T) {
	spec := Spec{Parts: []Source{{Kind: Header, Name: "A"}, {Kind: Header, Name: "B"}}}
	key := func(a, b string) string {
		t.Helper()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("A", a)
		r.Header.Set("B", b)
		k, err := spec.Extract(r, nil)
		if err != nil {
			t.Fatalf("Extract(%q, %q): %v", a, b, err)
		}
		return k
	}
	pairs := [][2][2]string{
		{{"a|b", "c"}, {"a", "b|c"}},
		{{"a%7Cb", "c"}, {"a|b", "c"}},
		{{"a%", "7Cb"}, {"a", "%7Cb"}},
		{{"a|", "b"}, {"a", "|b"}},
		{{"%7C", "x"}, {"|", "x"}},
	}
	for _, p := range pairs {
		k1, k2 := key(p[0][0], p[0][1]), key(p[1][0], p[1][1])
		if k1 == k2 {
			t.Errorf("parts %q and %q both give key %q", p[0], p[1], k1)
		}
	}
	if got, want := key("a|b", "c"), "a%7Cb|c"; got != want {
		t.Errorf("key(a|b, c) = %q, want %q", got, want)
	}
	if got, want := key("a", "b|c"), "a|b%7Cc"; got != want {
		t.Errorf("key(a, b|c) = %q, want %q", got, want)
	}
}

func TestExtractLength(t *testing.T) {
	tests := []extractCase{
		{name: "255 bytes", body: strings.Repeat("k", 255), want: strings.Repeat("k", 255)},
		{name: "256 bytes", body: strings.Repeat("k", 256), wantErr: errInvalid},
		{name: "1000 bytes", body: strings.Repeat("k", 1000), wantErr: errInvalid},
		// Bytes, not characters: 127 two-byte runes + 1 byte = 255 bytes.
		{name: "255 bytes of multibyte runes", body: strings.Repeat("é", 127) + "k", want: strings.Repeat("é", 127) + "k"},
		{name: "256 bytes of multibyte runes", body: strings.Repeat("é", 128), wantErr: errInvalid},
		{name: "single byte", body: "k", want: "k"},
	}
	for _, tc := range tests {
		for _, kind := range []Kind{Header, JSON} {
			t.Run(kind.String()+"/"+tc.name, func(t *testing.T) {
				c := tc
				value := c.body
				if kind == Header {
					c.spec = headerKey("Idempotency-Key")
					c.headers = http.Header{"Idempotency-Key": {value}}
					c.body = ""
				} else {
					c.spec = jsonKey("k")
					c.body = `{"k":"` + value + `"}`
				}
				runExtract(t, c, newRequest(c))
			})
		}
	}
}

func TestExtractNotPrintable(t *testing.T) {
	values := map[string]string{
		"NUL":                  "a\x00b",
		"tab":                  "a\tb",
		"newline":              "a\nb",
		"carriage return":      "a\rb",
		"DEL":                  "a\x7fb",
		"escape":               "\x1b[31m",
		"C1 control":           "a\u0085b",
		"zero-width space":     "a\u200bb",
		"bidi override":        "a\u202eb",
		"non-breaking space":   "a\u00a0b",
		"invalid UTF-8":        "a\xffb",
		"truncated UTF-8":      "a\xc3",
		"surrogate as UTF-8":   "a\xed\xa0\x80b",
		"overlong UTF-8 slash": "a\xc0\xafb",
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			// Set directly: httptest would refuse some of these on the wire,
			// but a proxy must not rely on its front end for that.
			r := httptest.NewRequest("POST", "/", nil)
			r.Header["Idempotency-Key"] = []string{v}
			runExtract(t, extractCase{spec: headerKey("Idempotency-Key"), wantErr: errInvalid}, r)

			r = httptest.NewRequest("POST", "/", nil)
			r.SetPathValue("id", v)
			runExtract(t, extractCase{spec: Spec{Parts: []Source{{Kind: Path, Name: "id"}}}, wantErr: errInvalid}, r)
		})
	}
}

func TestExtractNoParts(t *testing.T) {
	got, err := Spec{}.Extract(httptest.NewRequest("POST", "/", nil), nil)
	if !errors.Is(err, errInvalid) || got != "" {
		t.Fatalf("Spec{}.Extract() = %q, %v; want \"\", ErrInvalid", got, err)
	}
}

func TestErrorMessage(t *testing.T) {
	_, err := jsonKey("order.id").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"order":{"id":[1]}}`))
	if got, want := err.Error(), "key json order.id: invalid: an object or array is not a key"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	_, err = headerKey("Idempotency-Key").Extract(httptest.NewRequest("POST", "/", nil), nil)
	if got, want := err.Error(), "key header Idempotency-Key: missing"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestNeedsJSON(t *testing.T) {
	tests := []struct {
		spec Spec
		want bool
	}{
		{Spec{}, false},
		{headerKey("Idempotency-Key"), false},
		{queryKey("id"), false},
		{jsonKey("orderId"), true},
		{Spec{Parts: []Source{{Kind: Header, Name: "A"}, {Kind: Path, Name: "id"}}}, false},
		{Spec{Parts: []Source{{Kind: Header, Name: "A"}, {Kind: JSON, Name: "id"}}}, true},
	}
	for _, tc := range tests {
		if got := tc.spec.NeedsJSON(); got != tc.want {
			t.Errorf("%v.NeedsJSON() = %v, want %v", tc.spec.Parts, got, tc.want)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{JSON: "json", Header: "header", Query: "query", Path: "path", 0: "Kind(0)", 9: "Kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

func TestValidatePath(t *testing.T) {
	valid := []string{"orderId", "order.id", "items.0.sku", "a_b-c", "0", "a.0.b.1"}
	invalid := []string{"", ".", "a.", ".a", "a..b", "a b", "a*", "a.#", "items.#.sku", "a|b", "@this", `a\.b`, "é", "a?"}
	for _, p := range valid {
		if err := ValidatePath(p); err != nil {
			t.Errorf("ValidatePath(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range invalid {
		if err := ValidatePath(p); err == nil {
			t.Errorf("ValidatePath(%q) = nil, want an error", p)
		}
	}
}

// checkKeyRules fails t unless key obeys the rules every extracted key must:
// at most maxKeyBytes bytes of valid, printable UTF-8, and not empty.
func checkKeyRules(t *testing.T, key string) {
	t.Helper()
	if key == "" {
		t.Fatalf("empty key returned without an error")
	}
	if len(key) > maxKeyBytes {
		t.Fatalf("key of %d bytes, want at most %d", len(key), maxKeyBytes)
	}
	if !utf8.ValidString(key) {
		t.Fatalf("key %q is not valid UTF-8", key)
	}
	for _, r := range key {
		if !unicode.IsPrint(r) {
			t.Fatalf("key %q holds the unprintable %U", key, r)
		}
	}
}

func FuzzExtractJSON(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzExtractJSON.
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		r := httptest.NewRequest("POST", "/charges", nil)
		for _, spec := range []Spec{
			jsonKey(path),
			{Parts: []Source{{Kind: JSON, Name: path}, {Kind: Header, Name: "X-Part"}}},
		} {
			r.Header.Set("X-Part", "p|%")
			key, err := spec.Extract(r, body)
			if err != nil {
				var ke *extractError
				if !errors.As(err, &ke) {
					t.Fatalf("error %T (%v) is not a *keyextract.extractError", err, err)
				}
				if !errors.Is(err, ErrMissing) && !errors.Is(err, errInvalid) && !errors.Is(err, ErrBadJSON) {
					t.Fatalf("error %v wraps none of ErrMissing, ErrInvalid, ErrBadJSON", err)
				}
				if key != "" {
					t.Fatalf("key %q returned with error %v", key, err)
				}
				continue
			}
			checkKeyRules(t, key)
			if len(spec.Parts) == 2 && !strings.HasSuffix(key, "|p%7C%25") {
				t.Fatalf("composite key %q does not end with the escaped header part", key)
			}
		}
		checkAgreesWithEncodingJSON(t, body, path)
	})
}

// checkAgreesWithEncodingJSON checks, for every body the proxy lets through
// (one that canonicalises) and every configurable path, that a key read
// with gjson is the value a Go upstream decoding the body with encoding/json
// sees, and that a key reported missing is missing for the upstream too (or
// with on_missing_key: forward, a request with a key would go unprotected).
// Refusing a key (errInvalid, ErrBadJSON: a 400) is always safe.
func checkAgreesWithEncodingJSON(t *testing.T, body []byte, path string) {
	t.Helper()
	if ValidatePath(path) != nil {
		return
	}
	if _, err := Canonicalize(body, nil); err != nil {
		return
	}
	key, err := jsonKey(path).Extract(httptest.NewRequest("POST", "/", nil), body)
	if errors.Is(err, errInvalid) || errors.Is(err, ErrBadJSON) {
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if derr := dec.Decode(&v); derr != nil {
		t.Fatalf("Canonicalize accepted %q, encoding/json did not: %v", body, derr)
	}
	for _, name := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			// Go's encoding/json matches a struct field's name in any
			// letter case (Canonicalize refuses an object where two
			// members would match).
			v = nil
			for k, val := range x {
				if strings.EqualFold(k, name) {
					v = val
				}
			}
		case []any:
			i, aerr := strconv.Atoi(name)
			if aerr != nil || i < 0 || i >= len(x) {
				v = nil
			} else {
				v = x[i]
			}
		default:
			v = nil
		}
	}
	var want string
	switch x := v.(type) {
	case string:
		want = x
	case json.Number:
		// The number rule: the float64 it denotes, as encoding/json (and
		// JavaScript) print it.
		f, ferr := x.Float64()
		if ferr != nil {
			t.Fatalf("%s in %q: Extract gives %q for %s, which encoding/json cannot read as a float64", path, body, key, x)
		}
		b, _ := json.Marshal(f)
		want = string(b)
	case bool:
		want = strconv.FormatBool(x)
	case map[string]any, []any:
		t.Fatalf("%s in %q: encoding/json sees a %T, Extract gives %q, %v", path, body, x, key, err)
	}
	if errors.Is(err, ErrMissing) {
		if want != "" {
			t.Fatalf("%s in %q: Extract says missing, encoding/json sees %q", path, body, want)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s in %q: unexpected error %v", path, body, err)
	}
	if key != want {
		t.Fatalf("%s in %q: Extract gives %q, encoding/json sees %q", path, body, key, want)
	}
}
