package keyextract

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/tidwall/gjson"
)

// TestFingerprintGolden pins fingerprints to values computed before the
// prefix was written without fmt: stored reservations keep their
// fingerprints across an upgrade, so the hash input may never change.
func TestFingerprintGolden(t *testing.T) {
	tests := []struct {
		method, target, body string
		ignore               []string
		want                 string
	}{
		{"POST", "/charges", `{"orderId": "B-1", "amount": 10, "sentAt": "x"}`, []string{"sentAt"}, "22fbee5d8a6c3e911452fa42ba7fd816f8e0678e924f11db73a1955584fc2d89"},
		{"POST", "/charges?a=1", `not json`, nil, "c40219efb6a748aaf395b9e00adc5c38c18b085b9616b7b80286ff8a451f0c6a"},
		{"PUT", "/a\nb/" + string(make([]byte, 200)), `{"b":[1,2,{"c":null}],"a":"é"}`, nil, "a7ebfe5b65b4b0e6e62dfde425ad40902234a633c842e2ef76d8b9bd1a3dbc68"},
		{"", "", ``, nil, "cc8c6091afd4aaed4fdda0b5332d3e839ad4aa84fbc772ab8f65f7eeb6997b6e"},
	}
	for _, tt := range tests {
		got, _ := Fingerprint(tt.method, tt.target, []byte(tt.body), tt.ignore)
		if got != tt.want {
			t.Errorf("Fingerprint(%q, %q, %q) = %q, want %q", tt.method, tt.target, tt.body, got, tt.want)
		}
	}
}

// TestCompiledIgnore checks that a compiled ignore list, used again and
// again and beside others (one of them holding a NUL), gives the canonical
// form of its own list, not of another list.
func TestCompiledIgnore(t *testing.T) {
	body := []byte(`{"a": 1, "b": 2, "a\u0000b": 3, "x": {"y": 4}}`)
	want := func(ignore []string) string {
		t.Helper()
		var h bytes.Buffer
		c := canonicalizer{w: bufio.NewWriter(&h)}
		set := CompileIgnore(ignore)
		c.ignore, c.children = set.ignore, set.children
		if err := c.value(gjson.ParseBytes(body), "", true); err != nil {
			t.Fatal(err)
		}
		c.w.Flush()
		return h.String()
	}
	got := func(ignore []string) string {
		t.Helper()
		var h bytes.Buffer
		if err := canonicalize(&h, body, CompileIgnore(ignore), false); err != nil {
			t.Fatal(err)
		}
		return h.String()
	}
	lists := [][]string{{"a"}, {"b"}, {"a", "b"}, {"a\x00b"}, {"x.y"}, {"x"}}
	for i := range 264 {
		lists = append(lists, []string{fmt.Sprintf("p%d", i), "a"})
	}
	for round := range 2 {
		for _, ignore := range lists {
			if g, w := got(ignore), want(ignore); g != w {
				t.Errorf("round %d, ignore %q: canonical form %s, want %s", round, ignore, g, w)
			}
		}
	}
	if got([]string{"a\x00b"}) == got([]string{"a", "b"}) {
		t.Errorf("ignore [a\\x00b] and [a b] gave one canonical form")
	}
}

// TestFingerprintGoldenKeyRules pins the fingerprints of bodies the key
// rules canonicalise (numbers of one value in one form, lone surrogates
// kept as escapes, numbers decoders read differently as written), with
// their canonical forms, so that a later change to them is seen.
func TestFingerprintGoldenKeyRules(t *testing.T) {
	tests := []struct {
		body, canonical, want string
	}{
		{`{"orderId": 4.2e3, "amount": 12.50}`, `{"amount":12.5,"orderId":4200}`,
			"890a6531f3f4aa06b256f6a0aa7c8f091cc2b1f57f6e9ec9a8da60a5caf496bf"},
		{`{"orderId":"\udc00","note":"\ud800\ud83d\ude00"}`, `{"note":"\ud800😀","orderId":"\udc00"}`,
			"d144773fe856b0b7efca62a7639debeb4e467b563227a8795bed4be192099da1"},
		{`{"\udc01":[-0,1e400,9007199254740993,1.0000000000000001]}`, `{"\udc01":[-0,1e400,9007199254740993,1.0000000000000001]}`,
			"9a283cadcf6f44bb375b77a65fada2bbbd53e941e368eb658b5f4a08085efaad"},
	}
	for _, tt := range tests {
		got, err := Canonicalize([]byte(tt.body), nil)
		if err != nil || string(got) != tt.canonical {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", tt.body, got, err, tt.canonical)
		}
		fp, _ := Fingerprint("POST", "/charges", []byte(tt.body), nil)
		if fp != tt.want {
			t.Errorf("Fingerprint(%s) = %q, want %q", tt.body, fp, tt.want)
		}
		// The same as the fingerprint of the canonical form itself.
		if again, _ := Fingerprint("POST", "/charges", []byte(tt.canonical), nil); again != fp {
			t.Errorf("Fingerprint(%s) = %q, but of its canonical form %q", tt.body, fp, again)
		}
	}
}

// TestLegacyFingerprint pins LegacyFingerprintIgnoring to the fingerprints
// 33f5b72 (before numbers were canonicalised) gave, and checks it equals
// the current fingerprint when every number is written canonically.
func TestLegacyFingerprint(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"orderId": "ORD-LEGACY", "amount": 12.50}`, "8aee7de71eefaeab7bcd9c50356ca28fedeb115ec151594a33f9270e2d670720"},
		{`{"orderId": "B-2", "amount": 12.50, "qty": 1e3, "fee": 0.0}`, "9d0f6a54c398132f6769fcb1475ec291c345b5350e47f49a0ee526aeca119ce6"},
		{`{"orderId": "B-1", "amount": 10, "sentAt": "x"}`, ""}, // canonical numbers: as Fingerprint
	}
	for _, tt := range tests {
		got, _ := LegacyFingerprintIgnoring("POST", "/charges", []byte(tt.body), nil)
		want := tt.want
		if want == "" {
			want, _ = Fingerprint("POST", "/charges", []byte(tt.body), nil)
		}
		if got != want {
			t.Errorf("LegacyFingerprintIgnoring(%s) = %q, want %q", tt.body, got, want)
		}
	}
}
