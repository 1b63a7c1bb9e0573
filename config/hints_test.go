package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestUnknownFieldSuggestion: an unknown field close to a field of its
// own section is answered with that name, and a name close to nothing
// with no guess.
func TestUnknownFieldSuggestion(t *testing.T) {
	tests := []struct {
		name  string
		field string // an unknown field of a route
		want  string // the suggested name, "" for none
	}{
		{"one letter too many", "ttll", "ttl"},
		{"one letter missing", "polcy", "policy"},
		{"two letters swapped", "tll", "ttl"},
		{"upper case", "TTL", "ttl"},
		{"hyphen for underscore", "upstream-timeout", "upstream_timeout"},
		{"two edits in a long name", "upstream_timout_", "upstream_timeout"},
		{"too far", "timeout_ms", ""},
		{"nothing alike", "color", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problemsOf(t, withRoute("    "+tt.field+": x\n"))
			want := "routes[0]." + tt.field + ": unknown field (line 8)"
			if tt.want != "" {
				want = "routes[0]." + tt.field + ": unknown field; did you mean `" + tt.want + "`? (line 8)"
			}
			if len(got) == 0 || got[0] != want {
				t.Errorf("problems = %q, want first %q", got, want)
			}
		})
	}
}

// TestUnknownFieldSuggestsFromItsOwnSection: the guess comes from the
// fields of the section the unknown field is in, not from the whole file.
func TestUnknownFieldSuggestsFromItsOwnSection(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"top level", "upstrem: http://x\n" + withRoute(""), "upstrem: unknown field; did you mean `upstream`? (line 1)"},
		{"key section", head + "  - name: a\n    match: POST /a\n    key: {heder: X-Id}\n",
			"routes[0].key.heder: unknown field; did you mean `header`? (line 6)"},
		// drain_delay is a field of server, not of a route.
		{"not another section's", withRoute("    drain_dalay: 1s\n"), "routes[0].drain_dalay: unknown field (line 8)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problemsOf(t, tt.src)
			if len(got) == 0 || got[0] != tt.want {
				t.Errorf("problems = %q, want first %q", got, tt.want)
			}
		})
	}
}

// TestSyntaxErrorLine: a YAML syntax error names the line at fault, as the
// file counts it, and shows it; the YAML library alone names the line
// where the enclosing collection starts, or the one above.
func TestSyntaxErrorLine(t *testing.T) {
	const top = "# idemproxy\nlisten: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nroutes:\n" // lines 1-4
	tests := []struct {
		name     string
		src      string
		wantLine string // "line N: ": the file's line at fault
		wantText string // that line, as the message quotes it
	}{
		{"indentation", top + "  - name: charges\n   match: POST /charges\n    key: {json: orderId}\n",
			"line 6: ", `"   match: POST /charges"`},
		{"unclosed flow mapping", top + "  - name: charges\n    match: POST /charges\n    key: {json: orderId\n    ttl: 24h\n",
			"line 7: ", `"    key: {json: orderId"`},
		{"tab", top + "  - name: charges\n\tmatch: POST /charges\n",
			"line 6: ", `"\tmatch: POST /charges"`},
		{"unclosed quote", "listen: 127.0.0.1:8080\nupstream: \"http://127.0.0.1:9000\nroutes:\n  - name: charges\n",
			"line 2: ", `"upstream: \"http://127.0.0.1:9000"`},
		{"mapping value in a plain scalar", top + "  - name: charges\n    match: POST /charges: now\n",
			"line 6: ", `"    match: POST /charges: now"`},
		// A flow mapping over several lines is no mistake: the one after it is.
		{"after a multi-line flow mapping", top + "  - name: charges\n    key: {json: orderId,\n      }\n   match: POST /charges\n",
			"line 8: ", `"   match: POST /charges"`},
		{"after blank lines and comments", top + "  - name: charges\n\n    # the match\n   match: POST /charges\n",
			"line 8: ", `"   match: POST /charges"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			if err == nil {
				t.Fatalf("Parse(%q) = nil error, want a syntax error", tt.src)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "parse config: "+tt.wantLine) || !strings.HasSuffix(msg, ": "+tt.wantText) {
				t.Errorf("error = %q, want %q%s... ending in the line %s", msg, "parse config: ", tt.wantLine, tt.wantText)
			}
		})
	}
}

// TestSyntaxErrorLineHugeFile: finding the line at fault re-parses
// shorter and shorter heads of the file; on a large file with its mistake
// near the top that must stay bounded (it was quadratic: 61 s for 340 KB),
// falling back to the YAML library's own line.
// Its cost is BenchmarkParseSyntaxErrorHugeFile's to measure.
func TestSyntaxErrorLineHugeFile(t *testing.T) {
	if _, err := Parse(hugeSyntaxError()); err == nil || !strings.HasPrefix(err.Error(), "parse config: ") {
		t.Fatalf("Parse = %v, want a syntax error", err)
	}
}

func hugeSyntaxError() []byte {
	return []byte("upstream: [\n" + strings.Repeat("# a comment line\n", 20000))
}

func BenchmarkParseSyntaxErrorHugeFile(b *testing.B) {
	src := hugeSyntaxError()
	for b.Loop() {
		Parse(src)
	}
}

// TestUnknownHugeFieldName: the "did you mean" guess for an unknown field
// must not cost time in the square of its name's length times the
// fields (it took 3 s for each 1 MB name, an explicit key "? ..." having
// no length limit): a name far longer than every field is no typo.
// Its cost is BenchmarkParseUnknownHugeFieldName's to measure.
func TestUnknownHugeFieldName(t *testing.T) {
	if _, err := Parse(hugeFieldNames()); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("Parse = %.200v, want unknown fields", err)
	}
}

func hugeFieldNames() []byte {
	var b strings.Builder
	b.WriteString("upstream: http://127.0.0.1:9000\nroutes:\n  - name: a\n")
	for i := range 4 {
		fmt.Fprintf(&b, "    ? %d%s\n    : 1\n", i, strings.Repeat("x", 1<<20))
	}
	return []byte(b.String())
}

func BenchmarkParseUnknownHugeFieldName(b *testing.B) {
	src := hugeFieldNames()
	for b.Loop() {
		Parse(src)
	}
}

// TestUpstreamProblemHidesPassword: a problem with the upstream URL quotes
// it, but not the password it may carry (the problems go to stderr, and so
// to the logs of a container that fails to start).
func TestUpstreamProblemHidesPassword(t *testing.T) {
	for _, src := range []string{
		"upstream: http://svc:hunter2@127.0.0.1:9000/?x=1\n",
		"upstream: http://svc:hunter2@127.0.0.1:99999\n",
		"upstream: \"http://svc:hunter2@[::1\"\n", // no URL at all
		"upstream: http://svc:hunter2@127.0.0.1:9000\nupstream_tls: {insecure_skip_verify: true}\n",
	} {
		_, err := Parse([]byte(src + "routes: [{name: a, match: POST /a, key: {header: Idempotency-Key}}]\n"))
		if err == nil || !strings.Contains(err.Error(), "upstream") {
			t.Fatalf("Parse(%q) = %v, want an upstream problem", src, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Parse(%q) = %v shows the password", src, err)
		}
	}
}

// TestManyDecodingProblems: each validation problem is checked against
// the paths whose value was removed; that must not cost the product of
// their numbers (a 640 KB file of 20000 routes with two bad values each
// took 14 s).
// Its cost is BenchmarkParseManyDecodingProblems' to measure.
func TestManyDecodingProblems(t *testing.T) {
	if _, err := Parse(manyBadRoutes()); err == nil || !strings.Contains(err.Error(), "routes[19999].ttl") {
		t.Fatalf("Parse = %.300v, want the problems of every route", err)
	}
}

func manyBadRoutes() []byte {
	return []byte("upstream: http://127.0.0.1:9000\nroutes:\n" + strings.Repeat("  - {name: a, ttl: x, lease: y}\n", 20000))
}

func BenchmarkParseManyDecodingProblems(b *testing.B) {
	src := manyBadRoutes()
	for b.Loop() {
		Parse(src)
	}
}
