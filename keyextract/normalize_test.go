package keyextract

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The two spellings of one text: É as one code point (NFC) and as E with a
// combining acute accent (NFD).
const (
	cafeNFC = "CAF\u00c9-1"
	cafeNFD = "CAFE\u0301-1"
)

// normSource is one key source, and a request that carries v in it.
type normSource struct {
	name    string
	parts   []Source
	request func(v string) (*http.Request, []byte)
}

var normSources = []normSource{
	{"header", []Source{{Kind: Header, Name: "Idempotency-Key"}}, func(v string) (*http.Request, []byte) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Idempotency-Key", v)
		return r, nil
	}},
	{"json", []Source{{Kind: JSON, Name: "order.id"}}, func(v string) (*http.Request, []byte) {
		b, _ := json.Marshal(map[string]any{"order": map[string]string{"id": v}})
		return httptest.NewRequest("POST", "/", nil), b
	}},
	{"query", []Source{{Kind: Query, Name: "id"}}, func(v string) (*http.Request, []byte) {
		return httptest.NewRequest("POST", "/?id="+url.QueryEscape(v), nil), nil
	}},
	{"path", []Source{{Kind: Path, Name: "id"}}, func(v string) (*http.Request, []byte) {
		r := httptest.NewRequest("POST", "/orders/"+url.PathEscape(v), nil)
		r.SetPathValue("id", v)
		return r, nil
	}},
	{"composite", []Source{{Kind: Header, Name: "Idempotency-Key"}, {Kind: JSON, Name: "order.id"}}, func(v string) (*http.Request, []byte) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Idempotency-Key", v)
		b, _ := json.Marshal(map[string]any{"order": map[string]string{"id": v}})
		return r, b
	}},
}

// TestNormalizeNFC: without NFC the two spellings of "CAFÉ-1" are two keys
// (compared byte for byte); with it they are one key, in NFC, from every
// source and every part of a composite key. LegacyExtract, the key of
// versions without the option, stays byte for byte.
func TestNormalizeNFC(t *testing.T) {
	for _, src := range normSources {
		t.Run(src.name, func(t *testing.T) {
			extract := func(s Spec, v string) string {
				t.Helper()
				r, body := src.request(v)
				k, err := s.Extract(r, body)
				if err != nil {
					t.Fatalf("Extract(%q): %v", v, err)
				}
				return k
			}
			plain := Spec{Parts: src.parts}
			if a, b := extract(plain, cafeNFC), extract(plain, cafeNFD); a == b {
				t.Errorf("without NFC, %q and %q give one key %q, want two (byte for byte)", cafeNFC, cafeNFD, a)
			}
			s := Spec{Parts: src.parts, NFC: true}
			a, b := extract(s, cafeNFC), extract(s, cafeNFD)
			if a != b {
				t.Errorf("with NFC, %q and %q give keys %q and %q, want one", cafeNFC, cafeNFD, a, b)
			}
			if a != extract(plain, cafeNFC) {
				t.Errorf("with NFC, the NFC spelling's key is %q, want %q as without", a, extract(plain, cafeNFC))
			}
			r, body := src.request(cafeNFD)
			if legacy, err := s.LegacyExtract(r, body); err != nil || legacy != extract(plain, cafeNFD) {
				t.Errorf("LegacyExtract of the NFD spelling = %q, %v; want it byte for byte, %q", legacy, err, extract(plain, cafeNFD))
			}
		})
	}
}

// TestNormalizeRefusals: with NFC, a key that is not UTF-8 is still the
// 400 it was (not valid UTF-8), from every source that can carry such
// bytes, and a value too long to be a key in any form is refused as too
// long without being normalized; one whose NFD form is longer than a key
// but whose NFC form fits is accepted.
func TestNormalizeRefusals(t *testing.T) {
	s := func(parts []Source) Spec { return Spec{Parts: parts, NFC: true} }
	for _, src := range normSources {
		if src.name == "json" || src.name == "composite" {
			continue // json.Marshal would write U+FFFD; below with raw bytes
		}
		r, body := src.request("CAF\xc3-1")
		if _, err := s(src.parts).Extract(r, body); !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "not valid UTF-8") {
			t.Errorf("%s: a key that is not UTF-8: %v, want invalid: not valid UTF-8", src.name, err)
		}
	}
	_, err := s(normSources[1].parts).Extract(httptest.NewRequest("POST", "/", nil), []byte("{\"order\":{\"id\":\"CAF\xc3-1\"}}"))
	if !errors.Is(err, errInvalid) {
		t.Errorf("json: a key that is not UTF-8: %v, want invalid", err)
	}

	header := s(normSources[0].parts)
	extract := func(v string) (string, error) {
		r, _ := normSources[0].request(v)
		return header.Extract(r, nil)
	}
	// 60 × "É" decomposed: 180 bytes in NFD... and a long Hangul text:
	// three jamo (9 bytes) make one syllable (3 bytes).
	fits := strings.Repeat("\u1100\u1161\u11a8", 80) // 720 bytes, NFC 240
	if k, err := extract(fits); err != nil || k != norm.NFC.String(fits) || len(k) != 240 {
		t.Errorf("720 bytes of jamo, 240 in NFC: key of %d bytes, %v; want the NFC form", len(k), err)
	}
	tooLong := strings.Repeat("\u1100\u1161\u11a8", 86) // 774 bytes, NFC 258
	if _, err := extract(tooLong); !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "longer than 255 bytes") {
		t.Errorf("774 bytes of jamo: %v, want too long", err)
	}
	huge := strings.Repeat("E\u0301", 1<<18) // 768 KiB
	if _, err := extract(huge); !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "longer than 255 bytes") {
		t.Errorf("768 KiB key: %v, want too long", err)
	}
}

// FuzzNormalizeKey: with NFC, a value and its NFC and NFD forms give one
// key (or the same refusal) from every source; a single source's key is
// in NFC and is the value's NFC form; without NFC, the key is the value
// byte for byte.
func FuzzNormalizeKey(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzNormalizeKey.
	f.Fuzz(func(t *testing.T, v string) {
		kind := func(err error) string {
			switch {
			case err == nil:
				return "ok"
			case errors.Is(err, ErrMissing):
				return "missing"
			case errors.Is(err, errInvalid):
				return "invalid"
			}
			return err.Error()
		}
		for _, src := range normSources {
			if (src.name == "json" || src.name == "composite") && !utf8.ValidString(v) {
				continue // json.Marshal would replace the bytes
			}
			s := Spec{Parts: src.parts, NFC: true}
			var keys []string
			var kinds []string
			for _, form := range []string{v, norm.NFC.String(v), norm.NFD.String(v)} {
				if !utf8.ValidString(v) && form != v {
					continue
				}
				r, body := src.request(form)
				k, err := s.Extract(r, body)
				keys, kinds = append(keys, k), append(kinds, kind(err))
			}
			for i := range keys {
				if keys[i] != keys[0] || kinds[i] != kinds[0] {
					t.Fatalf("%s: %q in its forms gives keys %q (%v), want one", src.name, v, keys, kinds)
				}
			}
			// A composite key joins its parts escaped ('|' as %7C): an
			// escape followed by a combining mark is not NFC as a whole,
			// but each part is, and the escapes keep the join unambiguous.
			if keys[0] != "" && src.name != "composite" && !norm.NFC.IsNormalString(keys[0]) {
				t.Fatalf("%s: key %q of %q is not in NFC", src.name, keys[0], v)
			}
			if src.name == "path" {
				r, _ := src.request(v)
				raw, rawErr := Spec{Parts: src.parts}.Extract(r, nil)
				if rawErr == nil && raw != v {
					t.Fatalf("path without NFC: key %q of %q, want it byte for byte", raw, v)
				}
				if kinds[0] == "ok" && keys[0] != norm.NFC.String(v) {
					t.Fatalf("path with NFC: key %q of %q, want its NFC form %q", keys[0], v, norm.NFC.String(v))
				}
			}
		}
	})
}

// BenchmarkExtractNFC measures what key.normalize: nfc adds to a header
// key: an ASCII key (checked, unchanged) and one in NFD (rewritten).
func BenchmarkExtractNFC(b *testing.B) {
	for _, bc := range []struct {
		name string
		nfc  bool
		key  string
	}{
		{"none/ascii", false, "7f3c9a1e-2b4d-4c8e-9f10-5a6b7c8d9e0f"},
		{"nfc/ascii", true, "7f3c9a1e-2b4d-4c8e-9f10-5a6b7c8d9e0f"},
		{"nfc/nfd", true, cafeNFD},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := Spec{Parts: []Source{{Kind: Header, Name: "Idempotency-Key"}}, NFC: bc.nfc}
			r := httptest.NewRequest("POST", "/", nil)
			r.Header.Set("Idempotency-Key", bc.key)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Extract(r, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
