package keyextract

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The IETF draft's Idempotency-Key is an RFC 8941 string: "k-1" and the
// bare k-1 are one key. Before, they were two keys and two charges.
func TestExtractHeaderStructuredString(t *testing.T) {
	tests := []extractCase{
		{name: "quoted", headers: http.Header{"Idempotency-Key": {`"k-1"`}}, want: "k-1"},
		{name: "bare", headers: http.Header{"Idempotency-Key": {`k-1`}}, want: "k-1"},
		{name: "draft's example", headers: http.Header{"Idempotency-Key": {`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}},
			want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{name: "escaped quote", headers: http.Header{"Idempotency-Key": {`"a\"b"`}}, want: `a"b`},
		{name: "escaped backslash", headers: http.Header{"Idempotency-Key": {`"a\\b"`}}, want: `a\b`},
		{name: "space inside", headers: http.Header{"Idempotency-Key": {`"a b"`}}, want: "a b"},
		{name: "white space around", headers: http.Header{"Idempotency-Key": {" \"k-1\"\t"}}, want: "k-1"},
		{name: "quote inside a bare value", headers: http.Header{"Idempotency-Key": {`k"1`}}, want: `k"1`},
		{name: "bare value ending in a quote", headers: http.Header{"Idempotency-Key": {`k-1"`}}, want: `k-1"`},
		{name: "bare list stays one value", headers: http.Header{"Idempotency-Key": {`a, b`}}, want: `a, b`},
		{name: "255 bytes quoted", headers: http.Header{"Idempotency-Key": {`"` + strings.Repeat("k", 255) + `"`}}, want: strings.Repeat("k", 255)},

		{name: "empty string", headers: http.Header{"Idempotency-Key": {`""`}}, wantErr: ErrMissing},
		{name: "256 bytes quoted", headers: http.Header{"Idempotency-Key": {`"` + strings.Repeat("k", 256) + `"`}}, wantErr: errInvalid},
		{name: "unterminated", headers: http.Header{"Idempotency-Key": {`"k-1`}}, wantErr: errInvalid},
		{name: "lone quote", headers: http.Header{"Idempotency-Key": {`"`}}, wantErr: errInvalid},
		{name: "ends in a backslash", headers: http.Header{"Idempotency-Key": {`"k-1\`}}, wantErr: errInvalid},
		{name: "escaped closing quote only", headers: http.Header{"Idempotency-Key": {`"k-1\"`}}, wantErr: errInvalid},
		{name: "other escape", headers: http.Header{"Idempotency-Key": {`"k\-1"`}}, wantErr: errInvalid},
		{name: "unicode escape", headers: http.Header{"Idempotency-Key": {`"k\u0031"`}}, wantErr: errInvalid},
		{name: "non-ASCII", headers: http.Header{"Idempotency-Key": {`"été"`}}, wantErr: errInvalid},
		{name: "tab inside", headers: http.Header{"Idempotency-Key": {"\"a\tb\""}}, wantErr: errInvalid},
		{name: "parameters", headers: http.Header{"Idempotency-Key": {`"k-1";x=1`}}, wantErr: errInvalid},
		{name: "bare parameter", headers: http.Header{"Idempotency-Key": {`"k-1";x`}}, wantErr: errInvalid},
		{name: "list of strings", headers: http.Header{"Idempotency-Key": {`"k-1", "k-2"`}}, wantErr: errInvalid},
		{name: "list of the same string", headers: http.Header{"Idempotency-Key": {`"k-1", "k-1"`}}, wantErr: errInvalid},
		{name: "trailing garbage", headers: http.Header{"Idempotency-Key": {`"k-1"x`}}, wantErr: errInvalid},
		{name: "two strings", headers: http.Header{"Idempotency-Key": {`"k-1""k-2"`}}, wantErr: errInvalid},
		{name: "repeated, quoted and bare", headers: http.Header{"Idempotency-Key": {`"k-1"`, `k-1`}}, wantErr: errInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec = Spec{Parts: []Source{{Kind: Header, Name: "Idempotency-Key"}}}
			runExtract(t, tc, newRequest(tc))
		})
	}
}

// A malformed structured value is a 400 whose detail says so.
func TestExtractHeaderStructuredStringMessage(t *testing.T) {
	for v, want := range map[string]string{
		`"k-1`:         "not terminated",
		`"k\-1"`:       `escape other than \" and \\`,
		`"k-1";x=1`:    "parameters (;x=1)",
		`"a", "b"`:     "list of values",
		`"k-1"x`:       "after the structured string's closing quote (x)",
		"\"\x7f\"":     "not printable ASCII",
		`"k` + "\\":    "ends in a backslash",
		`"` + "\xff":   "not printable ASCII",
		`"` + "\x00\"": "not printable ASCII",
	} {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header["Idempotency-Key"] = []string{v}
		_, err := Spec{Parts: []Source{{Kind: Header, Name: "Idempotency-Key"}}}.Extract(r, nil)
		if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "RFC 8941 structured field string") || !strings.Contains(err.Error(), want) {
			t.Errorf("Idempotency-Key %q: error %v, want one about a malformed structured string saying %q", v, err, want)
		}
	}
}

// Each header part of a composite key is read the same way.
func TestExtractCompositeStructuredString(t *testing.T) {
	spec := Spec{Parts: []Source{{Kind: Header, Name: "A"}, {Kind: Header, Name: "B"}}}
	key := func(a, b string) (string, error) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("A", a)
		r.Header.Set("B", b)
		return spec.Extract(r, nil)
	}
	k1, err1 := key(`"x|y"`, `z`)
	k2, err2 := key(`x|y`, `"z"`)
	if err1 != nil || err2 != nil || k1 != k2 || k1 != "x%7Cy|z" {
		t.Errorf("keys %q (%v) and %q (%v), want both x%%7Cy|z", k1, err1, k2, err2)
	}
	if _, err := key(`"x`, "z"); !errors.Is(err, errInvalid) {
		t.Errorf("a malformed part: %v, want ErrInvalid", err)
	}
}

func TestQuoteSFString(t *testing.T) {
	for s, want := range map[string]string{`k-1`: `"k-1"`, `a"b`: `"a\"b"`, `a\b`: `"a\\b"`, ``: `""`} {
		if got := quoteSFString(s); got != want {
			t.Errorf("quoteSFString(%q) = %s, want %s", s, got, want)
		}
	}
}
