package keyextract

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// Spellings that Go (float64 and json.Number read as a float), Python (int
// and float compare equal) and JavaScript all read as one value are one
// key: the one the digits as a string give.
func TestExtractJSONNumberOneValue(t *testing.T) {
	groups := [][]string{
		{`"4200"`, `4200`, `4.2e3`, `4200.0`, `42e2`, `4.2E+3`, `4200.000`, `0.42e4`, `420000e-2`, `4200e0`, `4.2e+03`},
		{`"0"`, `0`, `0.0`, `0e5`, `0E-5`, `0.000e+0`},
		{`"-17"`, `-17`, `-1.7e1`, `-17.00`, `-170e-1`},
		{`"12.5"`, `12.5`, `12.50`, `1.25e1`, `125e-1`, `0.125E2`},
		{`"0.1"`, `0.1`, `0.10`, `1e-1`, `1.0e-1`},
		{`"1e-7"`, `1e-7`, `0.0000001`, `1.0E-7`, `10e-8`},
		{`"0.000001"`, `0.000001`, `1e-6`},
		{`"9007199254740992"`, `9007199254740992`, `9.007199254740992e15`, `9007199254740992.0`},
		{`"-9007199254740992"`, `-9007199254740992`},
		{`"123456789012345"`, `123456789012345`, `1.23456789012345e14`},
		{`"5e-324"`, `5e-324`, `5.0e-324`, `50e-325`},
		{`"0.30000000000000004"`, `0.30000000000000004`, `3.0000000000000004e-1`},
	}
	for _, g := range groups {
		var want string
		for i, lit := range g {
			got, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+lit+`}`))
			if err != nil {
				t.Errorf("orderId %s: %v, want a key", lit, err)
				continue
			}
			if i == 0 {
				want = got
				continue
			}
			if got != want {
				t.Errorf("orderId %s: key %q, want %q (as for %s)", lit, got, want, g[0])
			}
		}
	}
}

// Values the decoders read differently are a 400 with a reason naming the
// number and what differs.
func TestExtractJSONNumberRefused(t *testing.T) {
	tests := []struct {
		lit, reason string
	}{
		{`-0`, "negative zero"},
		{`-0.0`, "negative zero"},
		{`-0e7`, "negative zero"},
		{`-0.000E-3`, "negative zero"},
		{`1e400`, "out of the range"},
		{`-1e400`, "out of the range"},
		{`1` + strings.Repeat("0", 400), "out of the range"},
		{`9007199254740993`, "more digits"}, // a float64 reads 9007199254740992
		{`9007199254740994`, "beyond ±2^53"},
		{`-9007199254740994`, "beyond ±2^53"},
		{`12345678901234567890`, "beyond ±2^53"},
		{`1e16`, "beyond ±2^53"},
		{`1.5e300`, "beyond ±2^53"},
		{`1.0000000000000001`, "more digits"}, // a float64 reads 1
		{`4200.0000000000001`, "more digits"},
		{`0.10000000000000001`, "more digits"}, // a float64 reads 0.1
		{`0.1000000000000000000000000000001`, "more digits"},
		{`1e-400`, "more digits"}, // a float64 reads 0
		{`-1e-400`, "more digits"},
		{`2e-324`, "more digits"},
		{`1e-999999999999999999999`, "more digits"},
		{`1e999999999999999999999`, "out of the range"},
	}
	for _, tc := range tests {
		_, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+tc.lit+`}`))
		if !errors.Is(err, errInvalid) {
			t.Errorf("orderId %.50s: %v, want ErrInvalid", tc.lit, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.reason) || !strings.Contains(msg, "the number "+abbrev(tc.lit)) {
			t.Errorf("orderId %.50s: error %q does not name the number and %q", tc.lit, msg, tc.reason)
		}
	}
	// A long literal is cut short in the message.
	_, err := jsonKey("n").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"n":1`+strings.Repeat("0", 5000)+`}`))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("a 5001-digit number: error %.400v, want a short one", err)
	}
}

// Before: "\udc00" and "\udc01" were both U+FFFD, one key, while
// JavaScript and Python upstreams read two orders.
func TestExtractJSONLoneSurrogate(t *testing.T) {
	refused := []string{
		`"\udc00"`, `"\udc01"`, `"\ud800"`, `"\uDBFF"`, `"A-\udc00"`, `"\ud800x"`, `"\ud800\ud800"`,
		`"\udc00\ud800"`, `"\ud800\u0041"`, `"\ud800\\udc00"`, `"\ud83d\ude00\udc00"`, `"\ud800\n"`,
	}
	for _, s := range refused {
		_, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+s+`}`))
		if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "lone UTF-16 surrogate") {
			t.Errorf("orderId %s: %v, want ErrInvalid naming a lone surrogate", s, err)
		}
	}
	if _, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":"\udc00"}`)); err == nil ||
		!strings.Contains(err.Error(), `(\udc00)`) {
		t.Errorf("error %v does not show the surrogate", err)
	}
	accepted := map[string]string{
		`"\ud83d\ude00"`:  "😀",
		`"\uD83D\uDE00"`:  "😀",
		`"\\udc00"`:       `\udc00`, // an escaped backslash: six printable characters
		`"\ufffd"`:        "\ufffd",
		`"a\ud800\udc00"`: "a\U00010000",
	}
	for s, want := range accepted {
		got, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+s+`}`))
		if err != nil || got != want {
			t.Errorf("orderId %s: %q, %v; want %q", s, got, err, want)
		}
	}
	// Raw bytes that are not UTF-8 are refused too (Go and Node read
	// U+FFFD, Python refuses the body).
	for _, s := range []string{"\"\xff\"", "\"\xed\xb0\x80\"", "\"a\xc3\""} {
		_, err := jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+s+`}`))
		if !errors.Is(err, errInvalid) {
			t.Errorf("orderId %q: %v, want ErrInvalid", s, err)
		}
	}
}

// The fingerprint follows the key rule: one value, one canonical form.
func TestCanonicalizeNumbersOneValue(t *testing.T) {
	groups := [][]string{
		{`{"amount":4200,"orderId":"A"}`, `{"orderId":"A","amount":4.2e3}`, `{"amount":4200.0,"orderId":"A"}`, `{"amount":42E2,"orderId":"A"}`},
		{`[0.1]`, `[0.10]`, `[1e-1]`},
		{`[0]`, `[0.0]`, `[0e9]`},
		{`[1]`, `[1.0]`, `[1e0]`, `[10e-1]`},
	}
	for _, g := range groups {
		want := canon(t, g[0])
		for _, b := range g[1:] {
			if got := canon(t, b); got != want {
				t.Errorf("Canonicalize(%s) = %s, want %s (as for %s)", b, got, want, g[0])
			}
		}
	}
}

// Two names that hold different lone surrogates are one name to Go (both
// U+FFFD), so an object with both is refused like any repeated name.
func TestCanonicalizeLoneSurrogateNames(t *testing.T) {
	for _, body := range []string{`{"\udc00":1,"\udc01":2}`, `{"a\ud800":1,"a\ufffd":2}`, "{\"\\udc00\":1,\"\xff\":2}"} {
		if _, err := Canonicalize([]byte(body), nil); !errors.Is(err, ErrBadJSON) || !strings.Contains(err.Error(), "twice") {
			t.Errorf("Canonicalize(%q) = %v, want a repeated name", body, err)
		}
	}
	if got, want := canon(t, `{"b":1,"\udc00":2,"a":3}`), `{"a":3,"b":1,"\udc00":2}`; got != want {
		t.Errorf("canonical form %s, want %s", got, want)
	}
}

func TestNumber(t *testing.T) {
	tests := []struct{ lit, canon string }{
		{"0", "0"}, {"7", "7"}, {"-7", "-7"}, {"123456789012345", "123456789012345"},
		{"1234567890123456", "1234567890123456"}, {"-1234567890123456", "-1234567890123456"},
		{"1e21", ""}, {"1e-7", "1e-7"}, {"1.5e-10", "1.5e-10"}, {"123e-20", "1.23e-18"},
		{"0.0000012", "0.0000012"}, {"100", "100"}, {"1E2", "100"}, {"-0.5", "-0.5"},
		{"9999999999999999", ""}, {"-9999999999999999", ""},
	}
	for _, tc := range tests {
		got, refused := number(tc.lit)
		if got != tc.canon || (tc.canon == "") != (refused != "") {
			t.Errorf("number(%s) = %q, %q; want %q", tc.lit, got, refused, tc.canon)
		}
	}
}
