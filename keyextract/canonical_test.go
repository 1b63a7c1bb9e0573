package keyextract

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func canon(t *testing.T, body string, ignore ...string) string {
	t.Helper()
	out, err := Canonicalize([]byte(body), ignore)
	if err != nil {
		t.Fatalf("Canonicalize(%q, %q): %v", body, ignore, err)
	}
	return string(out)
}

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		ignore []string
		want   string
	}{
		{name: "sorted members", body: `{"b":1,"a":2,"c":3}`, want: `{"a":2,"b":1,"c":3}`},
		{name: "white space dropped", body: " {\n  \"a\" : [ 1 , 2 ] ,\t\"b\" : { } \r\n} ", want: `{"a":[1,2],"b":{}}`},
		{name: "nested objects sorted", body: `{"z":{"y":1,"x":{"b":2,"a":1}},"a":0}`, want: `{"a":0,"z":{"x":{"a":1,"b":2},"y":1}}`},
		{name: "objects in arrays sorted", body: `[{"b":1,"a":2},{"d":0,"c":1}]`, want: `[{"a":2,"b":1},{"c":1,"d":0}]`},
		{name: "array order kept", body: `[3,1,2]`, want: `[3,1,2]`},
		// One value, one form; -0 and integers past 2^53 are read
		// differently by decoders, so kept as written.
		{name: "numbers in canonical form", body: `[1.0,1e3,1E+03,-0,0.50,12345678901234567890123,1e-7,0.000001]`, want: `[1,1000,1000,-0,0.5,12345678901234567890123,1e-7,0.000001]`},
		{name: "literals", body: `[true,false,null]`, want: `[true,false,null]`},
		{name: "top-level scalar", body: ` "x" `, want: `"x"`},
		{name: "top-level number", body: "42\n", want: `42`},
		{name: "empty object", body: `{}`, want: `{}`},
		{name: "empty array", body: `[]`, want: `[]`},
		{name: "sort by bytes", body: `{"é":1,"z":2,"Y":3,"a":4}`, want: `{"Y":3,"a":4,"z":2,"é":1}`},
		{name: "escapes decoded", body: `{"\u0041":"\u0042\u00e9"}`, want: `{"A":"Bé"}`},
		{name: "escapes kept where needed", body: `"a\"b\\c\n\u0001"`, want: `"a\"b\\c\n\u0001"`},
		{name: "solidus unescaped", body: `"a\/b"`, want: `"a/b"`},
		{name: "surrogate pair", body: `"\ud83d\ude00"`, want: `"😀"`},

		{name: "ignore top-level", body: `{"orderId":1,"sentAt":"2024-01-01T00:00:00Z"}`, ignore: []string{"sentAt"}, want: `{"orderId":1}`},
		{name: "ignore nested", body: `{"meta":{"sentAt":5,"id":1},"sentAt":3}`, ignore: []string{"meta.sentAt"}, want: `{"meta":{"id":1},"sentAt":3}`},
		{name: "ignore in array element", body: `{"items":[{"ts":1,"sku":"a"},{"ts":2,"sku":"b"}]}`, ignore: []string{"items.0.ts"}, want: `{"items":[{"sku":"a"},{"sku":"b","ts":2}]}`},
		{name: "ignore array element", body: `{"items":[10,20,30]}`, ignore: []string{"items.1"}, want: `{"items":[10,30]}`},
		{name: "ignore whole object", body: `{"meta":{"a":[1,{"b":2}]},"x":1}`, ignore: []string{"meta"}, want: `{"x":1}`},
		{name: "ignore every member", body: `{"a":1}`, ignore: []string{"a"}, want: `{}`},
		{name: "ignore absent path", body: `{"a":1}`, ignore: []string{"b", "a.b", "0"}, want: `{"a":1}`},
		{name: "ignore is exact, not a prefix", body: `{"sentAt":1,"sentAtLocal":2}`, ignore: []string{"sentAt"}, want: `{"sentAtLocal":2}`},
		{name: "ignore index of top-level array", body: `[{"ts":1,"v":2},3]`, ignore: []string{"0.ts"}, want: `[{"v":2},3]`},
		{name: "ignore escaped name", body: `{"sent\u0041t":1,"b":2}`, ignore: []string{"sentAt"}, want: `{"b":2}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := canon(t, tc.body, tc.ignore...); got != tc.want {
				t.Errorf("Canonicalize(%s, %q) = %s, want %s", tc.body, tc.ignore, got, tc.want)
			}
		})
	}
}

func TestCanonicalizeEqual(t *testing.T) {
	groups := [][]string{
		{`{"a":1,"b":[1,2]}`, `{"b":[1,2],"a":1}`, "{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": 1\n}\n", `{ "a" : 1 , "b" : [ 1 , 2 ] }`},
		{`{"k":"A"}`, `{"k":"\u0041"}`, `{"\u006b":"\u0041"}`, `{"k":"\u0041"}` + "\n"},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
		{`"<>&"`, `"\u003c\u003e\u0026"`},
		{`"a/b"`, `"a\/b"`},
	}
	for _, g := range groups {
		want := canon(t, g[0])
		for _, b := range g[1:] {
			if got := canon(t, b); got != want {
				t.Errorf("Canonicalize(%q) = %s, want %s (as for %q)", b, got, want, g[0])
			}
		}
	}
}

func TestCanonicalizeDifferent(t *testing.T) {
	pairs := [][2]string{
		{`{"a":1}`, `{"a":2}`},
		{`{"a":1}`, `{"a":"1"}`},
		// Read differently by some decoders: kept apart.
		{`{"a":1}`, `{"a":1.0000000000000001}`},
		{`{"a":0}`, `{"a":-0}`},
		{`{"a":0}`, `{"a":-0.0}`},
		{`{"a":0}`, `{"a":1e-400}`},
		{`{"a":9007199254740992}`, `{"a":9007199254740993}`},
		{`{"a":0.1}`, `{"a":0.10000000000000001}`},
		{`"\udc00"`, `"\udc01"`},
		{`"\udc00"`, `"\ufffd"`},
		{`"\ud800"`, `"\udc00"`},
		{`{"\udc00":1}`, `{"\udc01":1}`},
		{`"\ud800\u0041"`, `"\ufffdA"`},
		{`{"a":1}`, `{"b":1}`},
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`{"a":null}`, `{}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":[1]}`, `{"a":1}`},
		{`{"a":true}`, `{"a":"true"}`},
		{`"A"`, `"a"`},
		{`{"a":{"b":1}}`, `{"a.b":1}`},
		{`""`, `null`},
	}
	for _, p := range pairs {
		if a, b := canon(t, p[0]), canon(t, p[1]); a == b {
			t.Errorf("%s and %s both canonicalise to %s", p[0], p[1], a)
		}
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	tests := []struct {
		name string
		body string
		msg  string // a substring of the error
	}{
		{name: "empty", body: ``, msg: "end of input"},
		{name: "white space only", body: " \n\t", msg: "end of input"},
		{name: "duplicate name", body: `{"a":1,"a":2}`, msg: `"a" appears twice`},
		{name: "duplicate name, same value", body: `{"a":1,"a":1}`, msg: "twice"},
		{name: "duplicate name by escape", body: `{"a":1,"\u0061":2}`, msg: "twice"},
		{name: "duplicate nested", body: `{"x":[{"id":1,"id":2}]}`, msg: "twice"},
		{name: "duplicate in ignored member", body: `{"meta":{"t":1,"t":2}}`, msg: "twice"},
		{name: "duplicate of an ignored name", body: `{"sentAt":1,"sentAt":2}`, msg: "twice"},
		{name: "trailing garbage", body: `{"a":1} x`, msg: "after the JSON value"},
		{name: "names that differ only in case", body: `{"orderId":"A","orderid":"B"}`, msg: "case-insensitive"},
		{name: "names that differ only in case, nested", body: `{"o":{"Id":1,"ID":2}}`, msg: "case-insensitive"},
		{name: "trailing value", body: `{"a":1}{"a":1}`, msg: "after the JSON value"},
		{name: "trailing scalar", body: `1 2`, msg: "after the JSON value"},
		{name: "trailing bracket", body: `{"a":1}}`, msg: "after the JSON value"},
		{name: "truncated object", body: `{"a":1`, msg: ""},
		{name: "truncated string", body: `"abc`, msg: ""},
		{name: "missing colon", body: `{"a" 1}`, msg: ""},
		{name: "missing comma", body: `[1 2]`, msg: ""},
		{name: "trailing comma", body: `[1,]`, msg: ""},
		{name: "trailing comma in object", body: `{"a":1,}`, msg: ""},
		{name: "number name", body: `{1:2}`, msg: ""},
		{name: "single quotes", body: `{'a':1}`, msg: ""},
		{name: "bad escape", body: `"\x41"`, msg: ""},
		{name: "leading zero", body: `01`, msg: ""},
		{name: "NaN", body: `NaN`, msg: ""},
		{name: "bare word", body: `charge`, msg: ""},
		{name: "form body", body: `orderId=1001&amount=5`, msg: ""},
		{name: "raw control character in string", body: "\"a\x01b\"", msg: ""},
		{name: "too deep arrays", body: strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), msg: "deeper than 128"},
		{name: "too deep with scalar", body: strings.Repeat("[", maxDepth+1) + "1" + strings.Repeat("]", maxDepth+1), msg: "deeper than 128"},
		{name: "too deep objects", body: strings.Repeat(`{"a":`, maxDepth) + "{}" + strings.Repeat("}", maxDepth), msg: "deeper than 128"},
		{name: "very deep", body: strings.Repeat("[", 100000), msg: "deeper than 128"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Canonicalize([]byte(tc.body), []string{"meta", "sentAt"})
			if err == nil {
				t.Fatalf("Canonicalize(%.40q) = %.40s, want an error", tc.body, out)
			}
			if !errors.Is(err, ErrBadJSON) {
				t.Errorf("error %v does not wrap ErrBadJSON", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

func TestCanonicalizeDepthLimit(t *testing.T) {
	for _, body := range []string{
		strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth),
		strings.Repeat("[", maxDepth) + `1` + strings.Repeat("]", maxDepth),
		strings.Repeat(`{"a":`, maxDepth-1) + `{}` + strings.Repeat("}", maxDepth-1),
	} {
		out, err := Canonicalize([]byte(body), nil)
		if err != nil {
			t.Fatalf("MaxDepth levels: %v, want them accepted", err)
		}
		if string(out) != body {
			t.Errorf("MaxDepth levels canonicalised to a different value")
		}
	}
}

// Inputs with invalid UTF-8 are accepted as encoding/json reads them (each
// bad byte as U+FFFD, as Node does too). A lone surrogate is kept as its
// escape: Go reads U+FFFD, but JavaScript and Python keep it, so "\udc00"
// and "\udc01" are two values to them.
func TestCanonicalizeReplacementCharacter(t *testing.T) {
	for b, want := range map[string]string{
		"\"\xff\"":              "\"\ufffd\"",
		`"\ud800"`:              `"\ud800"`,
		`"\uDC00x"`:             `"\udc00x"`,
		`"a\ud800\ud800\udc00"`: "\"a\\ud800\U00010000\"", // a lone one, then a pair
		`"\udc00\ud800"`:        `"\udc00\ud800"`,         // a pair the wrong way round
		`"\\udc00"`:             `"\\udc00"`,              // an escaped backslash, not a surrogate
		`"<\udc00\n\u00e9"`:     "\"\\u003c\\udc00\\n\u00e9\"",
		`"\ufffd"`:              "\"\ufffd\"",
		"\"\xed\xa0\x80\"":      "\"\ufffd\ufffd\ufffd\"", // a UTF-8 encoded surrogate: three bad bytes
	} {
		got, err := Canonicalize([]byte(b), nil)
		if err != nil {
			t.Fatalf("Canonicalize(%q): %v", b, err)
		}
		if string(got) != want {
			t.Errorf("Canonicalize(%q) = %q, want %q", b, got, want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	const body = `{"orderId":1001,"amount":5,"sentAt":"t1"}`
	ignore := []string{"sentAt"}
	base, err := Fingerprint("POST", "/charges", []byte(body), ignore)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	if len(base) != 64 || strings.Trim(base, "0123456789abcdef") != "" {
		t.Errorf("Fingerprint = %q, want 64 lower-case hex digits", base)
	}

	same := []struct {
		name, method, path, body string
	}{
		{"identical", "POST", "/charges", body},
		{"members reordered", "POST", "/charges", `{"sentAt":"t1","amount":5,"orderId":1001}`},
		{"reindented", "POST", "/charges", "{\n  \"orderId\": 1001,\n  \"amount\": 5,\n  \"sentAt\": \"t1\"\n}\n"},
		{"ignored field changed", "POST", "/charges", `{"orderId":1001,"amount":5,"sentAt":"t2"}`},
		{"ignored field absent", "POST", "/charges", `{"orderId":1001,"amount":5}`},
		{"escaped", "POST", "/charges", `{"\u006frderId":1001,"amount":5,"sentAt":"t1"}`},
	}
	for _, tc := range same {
		fp, err := Fingerprint(tc.method, tc.path, []byte(tc.body), ignore)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if fp != base {
			t.Errorf("%s: fingerprint %s, want %s", tc.name, fp, base)
		}
	}

	different := []struct {
		name, method, path, body string
	}{
		{"method", "PUT", "/charges", body},
		{"path", "POST", "/charges/", body},
		{"other path", "POST", "/refunds", body},
		{"amount", "POST", "/charges", `{"orderId":1001,"amount":6,"sentAt":"t1"}`},
		{"number as string", "POST", "/charges", `{"orderId":"1001","amount":5,"sentAt":"t1"}`},
		{"extra field", "POST", "/charges", `{"orderId":1001,"amount":5,"sentAt":"t1","note":"x"}`},
		{"empty body", "POST", "/charges", ``},
	}
	seen := map[string]string{base: "base"}
	for _, tc := range different {
		fp, _ := Fingerprint(tc.method, tc.path, []byte(tc.body), ignore)
		if other, dup := seen[fp]; dup {
			t.Errorf("%s: fingerprint equals %s's", tc.name, other)
		}
		seen[fp] = tc.name
	}

	if fp, _ := Fingerprint("POST", "/charges", []byte(body), nil); fp == base {
		t.Errorf("without ignore, the sentAt field should count")
	}
}

func TestFingerprintRawBody(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"empty", ""},
		{"form", "orderId=1001&amount=5"},
		{"trailing garbage", `{"a":1} x`},
		{"duplicate name", `{"a":1,"a":2}`},
		{"binary", "\x00\x01\xff"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fp, jsonErr := Fingerprint("POST", "/charges", []byte(tc.body), nil)
			if jsonErr == nil || !errors.Is(jsonErr, ErrBadJSON) {
				t.Fatalf("jsonErr = %v, want an ErrBadJSON", jsonErr)
			}
			if fp == "" {
				t.Fatalf("no fingerprint for a raw body")
			}
			again, _ := Fingerprint("POST", "/charges", []byte(tc.body), nil)
			if again != fp {
				t.Errorf("fingerprint not deterministic: %s then %s", fp, again)
			}
			other, _ := Fingerprint("POST", "/charges", []byte(tc.body+" "), nil)
			if other == fp {
				t.Errorf("a raw body is hashed as it is: one more space must change it")
			}
		})
	}

	// A raw body that happens to spell a canonical JSON body must not
	// collide with it.
	a, errA := Fingerprint("POST", "/x", []byte(`{"a":1}`), nil)
	b, errB := Fingerprint("POST", "/x", []byte(`{"a":1`), nil)
	if errA != nil || errB == nil || a == b {
		t.Errorf("JSON and raw fingerprints: %s (%v), %s (%v)", a, errA, b, errB)
	}
}

// The method, path and body are hashed so that none can be shifted into
// another: a decoded path may hold a newline.
func TestFingerprintUnambiguous(t *testing.T) {
	type req struct{ method, path, body string }
	pairs := [][2]req{
		{{"POST", "/x\nrABC", "tail"}, {"POST", "/x", "ABC\nrtail"}},
		{{"POST", "/x\n", "q"}, {"POST", "/x", "\nq"}},
		{{"POST\n/x", "", "b"}, {"POST", "\n/x", "b"}},
		{{"PO", "ST/x", "b"}, {"POST", "/x", "b"}},
	}
	for _, p := range pairs {
		a, _ := Fingerprint(p[0].method, p[0].path, []byte(p[0].body), nil)
		b, _ := Fingerprint(p[1].method, p[1].path, []byte(p[1].body), nil)
		if a == b {
			t.Errorf("%q and %q have the same fingerprint", p[0], p[1])
		}
	}
}

func FuzzCanonicalize(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzCanonicalize.
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := Canonicalize(body, nil)
		if err != nil {
			if !errors.Is(err, ErrBadJSON) {
				t.Fatalf("error %v does not wrap ErrBadJSON", err)
			}
			if out != nil {
				t.Fatalf("output %q along with error %v", out, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q, not valid JSON", body, out)
		}
		if !json.Valid(body) {
			t.Fatalf("Canonicalize accepted %q, which encoding/json rejects", body)
		}
		again, err := Canonicalize(out, nil)
		if err != nil {
			t.Fatalf("canonical form %q does not canonicalise: %v", out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q", body, out, again)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, body, "  ", "\t"); err != nil {
			t.Fatalf("json.Indent(%q): %v", body, err)
		}
		fromIndented, err := Canonicalize(indented.Bytes(), nil)
		if err != nil {
			t.Fatalf("indented %q does not canonicalise: %v", indented.Bytes(), err)
		}
		if !bytes.Equal(fromIndented, out) {
			t.Fatalf("indenting changes the canonical form: %q -> %q, indented -> %q", body, out, fromIndented)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, out); err != nil || !bytes.Equal(compact.Bytes(), out) {
			t.Fatalf("canonical form %q holds insignificant white space", out)
		}
		// Ignoring a path that is not there changes nothing; the
		// fingerprint is stable.
		withIgnore, err := Canonicalize(body, []string{"no.such.path"})
		if err != nil || !bytes.Equal(withIgnore, out) {
			t.Fatalf("ignoring an absent path: %q, %v; want %q", withIgnore, err, out)
		}
		fp1, e1 := Fingerprint("POST", "/", body, nil)
		fp2, e2 := Fingerprint("POST", "/", indented.Bytes(), nil)
		if e1 != nil || e2 != nil || fp1 != fp2 {
			t.Fatalf("fingerprints differ after indenting: %s (%v), %s (%v)", fp1, e1, fp2, e2)
		}
	})
}
