package keyextract

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?([0-9]+))?$`)

// refNumber is the number rule computed another way, from encoding/json (a
// float64 and a json.Number) and math/big: it reports the float64 a number
// literal denotes and whether the rule refuses it. known is false for the
// literals too large for big.Rat to read quickly.
func refNumber(lit string) (f float64, refused, known bool) {
	if err := json.Unmarshal([]byte(lit), &f); err != nil {
		return 0, true, true // out of range: Go's float64 refuses it
	}
	var n json.Number
	if err := json.Unmarshal([]byte(lit), &n); err != nil || string(n) != lit {
		panic("json.Number does not keep " + lit)
	}
	if g, err := n.Float64(); err != nil || g != f && !(math.IsNaN(g) && math.IsNaN(f)) {
		panic("json.Number and float64 disagree on " + lit)
	}
	mantissa, _, _ := strings.Cut(strings.ToLower(lit), "e")
	if strings.Trim(mantissa, "-0.") == "" { // zero
		return f, strings.HasPrefix(lit, "-"), true
	}
	if f == math.Trunc(f) && math.Abs(f) > 1<<53 {
		return f, true, true
	}
	m := jsonNumber.FindStringSubmatch(lit)
	if len(lit) > 2000 || len(m[4]) > 4 {
		return f, false, false
	}
	exact, ok1 := new(big.Rat).SetString(lit)
	shortest, ok2 := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if !ok1 || !ok2 {
		panic("big.Rat cannot read " + lit)
	}
	return f, exact.Cmp(shortest) != 0, true
}

// numberKey extracts the key of a body whose orderId is lit.
func numberKey(lit string) (string, error) {
	return jsonKey("orderId").Extract(httptest.NewRequest("POST", "/", nil), []byte(`{"orderId":`+lit+`}`))
}

// spellings returns other spellings of f, a float64 the rule accepts: each
// must give the same key.
func spellings(f float64) []string {
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	x, _ := strconv.Atoi(exp)
	digits := strings.Replace(strings.TrimPrefix(mant, "-"), ".", "", 1)
	sign := ""
	if f < 0 {
		sign = "-"
	}
	out := []string{
		e, strings.ToUpper(e), strconv.FormatFloat(f, 'f', -1, 64), strconv.FormatFloat(f, 'g', -1, 64),
		sign + "0." + digits + "e" + strconv.Itoa(x+1),             // 0.42e4
		sign + digits + "e" + strconv.Itoa(x-(len(digits)-1)),      // 42e2
		sign + digits + "000E" + strconv.Itoa(x-(len(digits)-1)-3), // 42000E-1
	}
	if b, err := json.Marshal(f); err == nil {
		out = append(out, string(b))
	}
	if fs := strconv.FormatFloat(f, 'f', -1, 64); strings.Contains(fs, ".") {
		out = append(out, fs+"000")
	} else {
		out = append(out, fs+".0", fs+".000")
	}
	return out
}

// FuzzNumberKey checks the number rule against encoding/json and math/big:
// a number is refused exactly when the rule says (out of range, negative
// zero, integral past 2^53, more digits than its float64's shortest form);
// an accepted one's key is its float64 as encoding/json prints it, the
// same for every spelling of that float64 and for the digits as a string;
// two accepted numbers are one key exactly when they are one float64.
func FuzzNumberKey(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzNumberKey.
	f.Fuzz(func(t *testing.T, a, b string) {
		var floats [2]float64
		var keys [2]string
		var ok [2]bool
		for i, lit := range []string{a, b} {
			if !jsonNumber.MatchString(lit) {
				continue
			}
			if !json.Valid([]byte(lit)) {
				t.Fatalf("%q: the grammar and json.Valid disagree", lit)
			}
			key, err := numberKey(lit)
			fv, refused, known := refNumber(lit)
			if err != nil {
				if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "the number ") {
					t.Fatalf("%.60s: error %v, want ErrInvalid naming the number", lit, err)
				}
				if known && !refused {
					t.Fatalf("%.60s (a float64 %v): refused (%v), but the rule accepts it", lit, fv, err)
				}
				if canon(t, "["+lit+"]") != "["+lit+"]" {
					t.Fatalf("%.60s: refused as a key, but not kept as written in the canonical form", lit)
				}
				continue
			}
			if known && refused {
				t.Fatalf("%.60s (a float64 %v): key %q, but the rule refuses it", lit, fv, key)
			}
			want, _ := json.Marshal(fv)
			if key != string(want) {
				t.Fatalf("%.60s: key %q, want %s (the float64 as encoding/json prints it)", lit, key, want)
			}
			if g, err := strconv.ParseFloat(key, 64); err != nil || g != fv {
				t.Fatalf("%.60s: key %q does not read back as %v", lit, key, fv)
			}
			if got := canon(t, "["+lit+"]"); got != "["+key+"]" {
				t.Fatalf("%.60s: canonical form %s, want [%s]", lit, got, key)
			}
			if s, err := numberKey(strconv.Quote(key)); err != nil || s != key {
				t.Fatalf("%.60s: key %q, but the same digits as a string give %q, %v", lit, key, s, err)
			}
			for _, other := range spellings(fv) {
				if !jsonNumber.MatchString(other) {
					continue // 0000E-3 for zero
				}
				if k, err := numberKey(other); err != nil || k != key {
					t.Fatalf("%.60s gives key %q, its other spelling %s gives %q, %v", lit, key, other, k, err)
				}
			}
			floats[i], keys[i], ok[i] = fv, key, true
		}
		if ok[0] && ok[1] && (keys[0] == keys[1]) != (floats[0] == floats[1]) {
			t.Fatalf("%.60s and %.60s: keys %q and %q, float64s %v and %v", a, b, keys[0], keys[1], floats[0], floats[1])
		}
	})
}

// refUTF16 decodes a JSON string literal (with its quotes) to UTF-16 code
// units, as JavaScript holds it, each byte that is not UTF-8 as U+FFFD;
// validUTF8 reports whether there was none, lone whether a surrogate is
// unpaired (a strict decoder refuses both).
func refUTF16(lit string) (units []uint16, validUTF8, lone bool) {
	validUTF8 = true
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); {
		if s[i] == '\\' {
			if s[i+1] == 'u' {
				v, err := strconv.ParseUint(s[i+2:i+6], 16, 16)
				if err != nil {
					panic(err)
				}
				units = append(units, uint16(v))
				i += 6
				continue
			}
			c := map[byte]rune{'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', '"': '"', '\\': '\\', '/': '/'}[s[i+1]]
			units = append(units, uint16(c))
			i += 2
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			validUTF8 = false
		}
		units = utf16.AppendRune(units, r)
		i += size
	}
	lone = !slices.Equal(utf16.Encode(utf16.Decode(units)), units)
	return units, validUTF8, lone
}

// FuzzStringKey checks strings against a strict decoder: a key holding
// bytes that are not UTF-8 or a lone surrogate is refused, any other is
// the string encoding/json reads (when printable and short enough); the
// canonical form keeps every UTF-16 code unit, lone surrogates included,
// so two strings JavaScript reads differently never share a fingerprint.
func FuzzStringKey(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzStringKey.
	f.Fuzz(func(t *testing.T, s string) {
		lit := `"` + s + `"`
		body := `{"k":` + lit + `}`
		var str string
		if err := json.Unmarshal([]byte(lit), &str); err != nil {
			return // not one JSON string
		}
		m := map[string]string{"k": str}
		units, validUTF8, lone := refUTF16(lit)
		key, err := jsonKey("k").Extract(httptest.NewRequest("POST", "/", nil), []byte(body))
		switch {
		case lone:
			if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "lone UTF-16 surrogate") {
				t.Fatalf("%q: key %q, %v; want refused for a lone surrogate", lit, key, err)
			}
		case !validUTF8:
			if !errors.Is(err, errInvalid) {
				t.Fatalf("%q: key %q, %v; want refused for bytes that are not UTF-8", lit, key, err)
			}
		case m["k"] == "":
			if !errors.Is(err, ErrMissing) {
				t.Fatalf("%q: %q, %v; want missing", lit, key, err)
			}
		case err == nil:
			if key != m["k"] || !slices.Equal(utf16.Encode([]rune(key)), units) {
				t.Fatalf("%q: key %q, encoding/json reads %q", lit, key, m["k"])
			}
		default:
			if !errors.Is(err, errInvalid) || checkKey(Source{}, m["k"]) == nil {
				t.Fatalf("%q: %v, but %q is a usable key", lit, err, m["k"])
			}
		}
		out, cerr := Canonicalize([]byte(lit), nil)
		if cerr != nil {
			t.Fatalf("Canonicalize(%q): %v", lit, cerr)
		}
		if !utf8.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q, not UTF-8", lit, out)
		}
		if got, _, _ := refUTF16(string(out)); !slices.Equal(got, units) {
			t.Fatalf("Canonicalize(%q) = %q: UTF-16 %x, want %x", lit, out, got, units)
		}
	})
}

var sfString = regexp.MustCompile(`^[ \t]*"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"[ \t]*$`)

// FuzzSFString checks header keys against RFC 8941's grammar for a String:
// a value starting with a quote is accepted exactly when it is one
// sf-string, and reads as its unescaped content; any other value is the key
// as it is; quoting a printable ASCII key gives the same key back.
func FuzzSFString(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzSFString.
	f.Fuzz(func(t *testing.T, v string) {
		key, reason := sfHeaderValue(v)
		if !strings.HasPrefix(strings.Trim(v, " \t"), `"`) {
			if key != v || reason != "" {
				t.Fatalf("bare %q: %q, %q; want it as it is", v, key, reason)
			}
		} else {
			m := sfString.FindStringSubmatch(v)
			if (m != nil) != (reason == "") {
				t.Fatalf("%q: grammar match %v, but sfHeaderValue says %q", v, m != nil, reason)
			}
			if m != nil && key != regexp.MustCompile(`\\(["\\])`).ReplaceAllString(m[1], "$1") {
				t.Fatalf("%q: key %q, want %q unescaped", v, key, m[1])
			}
			if m != nil && quoteSFString(key) != strings.Trim(v, " \t") {
				t.Fatalf("%q: key %q quotes back as %s", v, key, quoteSFString(key))
			}
		}
		printable := true
		for i := range len(v) {
			printable = printable && v[i] >= 0x20 && v[i] <= 0x7e
		}
		if printable {
			back, reason := sfHeaderValue(quoteSFString(v))
			if back != v || reason != "" {
				t.Fatalf("quoted %q reads as %q, %q", v, back, reason)
			}
		}
		// Through Extract: the quoted form of a bare key is the same key.
		r := httptest.NewRequest("POST", "/", nil)
		r.Header["K"] = []string{v}
		k1, err1 := Spec{Parts: []Source{{Kind: Header, Name: "K"}}}.Extract(r, nil)
		if err1 != nil && !errors.Is(err1, errInvalid) && !errors.Is(err1, ErrMissing) {
			t.Fatalf("%q: %v", v, err1)
		}
		if err1 == nil && printable && !strings.HasPrefix(v, `"`) && strings.Trim(v, " \t") == v {
			r.Header["K"] = []string{quoteSFString(v)}
			k2, err2 := Spec{Parts: []Source{{Kind: Header, Name: "K"}}}.Extract(r, nil)
			if err2 != nil || k2 != k1 {
				t.Fatalf("%q gives %q, quoted %q, %v", v, k1, k2, err2)
			}
		}
	})
}
