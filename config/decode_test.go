package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDecodingProblemsNameTheField: what the YAML decoder refuses is
// reported like a validation problem, with the field's path and its line,
// and the rest of the file is still validated.
func TestDecodingProblemsNameTheField(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // every problem, in order
	}{
		{"unknown route field", withRoute("    ttll: 30s\n"),
			[]string{"routes[0].ttll: unknown field; did you mean `ttl`? (line 8)"}},
		{"bad duration", withRoute("    ttl: 30 s\n"),
			[]string{`routes[0].ttl: invalid duration "30 s" (line 8)`}},
		{"number as text", withRoute("    max_body_bytes: 1MiB\n"),
			[]string{`routes[0].max_body_bytes: a whole number expected, not "1MiB" (line 8)`}},
		{"list element", withRoute("    release_statuses: [503, five-hundred]\n"),
			[]string{`routes[0].release_statuses[1]: a whole number expected, not "five-hundred" (line 8)`}},
		{"bool", withRoute("") + "store:\n  badger:\n    sync_writes: yes please\n",
			[]string{`store.badger.sync_writes: true or false expected, not "yes please" (line 10)`}},
		{"text for a section", withRoute("    scope: X-Api-Key\n"),
			[]string{`routes[0].scope: a mapping of fields expected, not "X-Api-Key" (line 8)`}},
		{"text for a list", withRoute("    replay_headers: Content-Type\n"),
			[]string{`routes[0].replay_headers: a list expected, not "Content-Type" (line 8)`}},
		{"mapping for text", "listen: {port: 8080}\nupstream: http://x\nroutes:\n  - name: a\n    match: POST /a\n    key: {json: a}\n",
			[]string{"listen: a text value expected, not a mapping (line 1)"}},
		{"given twice", withRoute("    ttl: 1h\n    ttl: 2h\n"),
			[]string{"routes[0].ttl: given twice (first on line 8) (line 9)"}},
		{"a file that is a list", "- listen: 127.0.0.1:8080\n",
			[]string{"the file: a mapping of fields expected, not a list (line 1)"}},
		{"a route that is not a mapping", head + "  - charges\n",
			[]string{`routes[0]: a mapping of fields expected, not "charges" (line 4)`}},
		// A decoding problem does not hide the validation problems of the
		// rest of the file, and the removed value's own checks are not
		// repeated (release_statuses would otherwise also be "600 is not a
		// status"... on the 0 left in its place).
		{"decoding and validation together",
			"listen: localhost\n" + "upstream: http://127.0.0.1:9000\nroutes:\n" +
				"  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n" +
				"    ttll: 30s\n    policy: sometimes\n    release_statuses: [x]\n",
			[]string{
				"routes[0].ttll: unknown field; did you mean `ttl`? (line 7)",
				"routes[0].release_statuses[0]: a whole number expected, not \"x\" (line 9)",
				`listen: "localhost" is not a host:port address (line 1)`,
				`routes[0].policy: "sometimes" is not one of reserve-then-commit, release-on-5xx (line 8)`,
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, tc.src)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n  %q\nwant:\n  %q", got, tc.want)
			}
		})
	}
}

// TestDecodingProblemsFile: the seed file with decoding mistakes reports
// each of them with its path, and the validation problems beside them.
func TestDecodingProblemsFile(t *testing.T) {
	b, err := os.ReadFile("testdata/decoding_mistakes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := problemsOf(t, string(b))
	want := []string{
		"lisen: unknown field; did you mean `listen`? (line 2)",
		`routes[0].ttl: invalid duration "30 s" (line 9)`,
		"routes[0].ttll: unknown field; did you mean `ttl`? (line 10)",
		`routes[0].max_body_bytes: a whole number expected, not "1MiB" (line 11)`,
		"routes[1].key.jsn: unknown field; did you mean `json`? (line 15)",
		"listen: required (host:port, e.g. 127.0.0.1:8080)",
		"routes[1].key: set exactly one of json, header, query, path or parts (line 14)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n  %q\nwant:\n  %q", got, want)
	}
}

// TestAnchorsAndMergeKeys: anchors and merge keys decode as YAML says, and
// an unknown field brought in by one is still refused.
func TestAnchorsAndMergeKeys(t *testing.T) {
	b, err := os.ReadFile("testdata/anchors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, string(b))
	if len(c.Routes) != 2 || c.Routes[1].Name != "refunds" || c.Routes[1].Key.JSON != "orderId" || c.Routes[1].Lease.D() != c.Routes[0].Lease.D() {
		t.Errorf("merged route = %+v", c.Routes[1])
	}
	bad := head + "  - &r\n    name: a\n    match: POST /a\n    key: {json: a}\n    ttll: 1h\n  - <<: *r\n    name: b\n    match: POST /b\n"
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "ttll") {
		t.Errorf("an unknown field under an anchor: %v, want it named", err)
	}
	aliased := head + "  - name: a\n    match: POST /a\n    key: &k {jsn: a}\n  - name: b\n    match: POST /b\n    key: *k\n"
	if _, err := Parse([]byte(aliased)); err == nil || !strings.Contains(err.Error(), "jsn") {
		t.Errorf("an unknown field in an aliased value: %v, want it named", err)
	}
}
