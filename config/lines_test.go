package config

import (
	"os"
	"reflect"
	"testing"
)

// TestProblemsNameTheirLine: every validation problem of a field the file
// writes names that field's line, as the decoding problems do, after the
// field's path: a problem found in the values (a policy, a lease against
// upstream_timeout, an address) as much as a misspelt field. A field left
// to its default is named on the line of the nearest section the file
// writes (its route's); a problem of nothing the file writes has no line.
// Several problems come at once, in the order of the fields.
func TestProblemsNameTheirLine(t *testing.T) {
	const oneRoute = "routes:\n  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n"
	tests := []struct {
		name string
		file string // under testdata/, or src
		src  string
		want []string
	}{
		{name: "routes", file: "lines_routes.yaml", want: []string{
			`upstream: "127.0.0.1:9000" is not an absolute http or https URL (add http:// or https://) (line 4)`,
			`routes[0].policy: "sometimes" is not one of reserve-then-commit, release-on-5xx (line 9)`,
			`routes[0].lease: 10s must exceed upstream_timeout (30s), or a slow answer could find its key taken (line 11)`,
			`routes[1].key.json: "items[0]" is not a JSON path of names and indexes separated by dots (order.id, items.0.sku) (line 15)`,
			`routes[1].ttl: 30s must exceed lease (1m0s) (line 17)`,
			`routes[2].key: set exactly one of json, header, query, path or parts (line 18)`,
		}},
		{name: "sections and list elements", file: "lines_sections.yaml", want: []string{
			`upstream: "http://" is not an absolute http or https URL: it names no host (line 4)`,
			`admin.listen: "127.0.0.1:8080" and listen "127.0.0.1:8080" would bind the same port (line 6)`,
			`store.redis.addrs[1]: "redis" is not a host:port address (line 11)`,
			`store.redis.record_layout: "flat" is not one of packed, hash (line 12)`,
			`routes[0].release_statuses[1]: 200 is not an error status (400-599) (line 20)`,
			`routes[0].replay_headers[1]: Set-Cookie is never replayed: it carries credentials or a session: a replay would hand one client's to another (line 19)`,
		}},
		{name: "merged from an anchor", file: "lines_anchors.yaml", want: []string{
			`routes[0].policy: "sometimes" is not one of reserve-then-commit, release-on-5xx (line 10)`,
			`routes[1].policy: "sometimes" is not one of reserve-then-commit, release-on-5xx (line 10)`,
		}},
		{name: "nothing written: no line", src: "listen: 127.0.0.1:8080\n", want: []string{
			`upstream: required (the protected service's base URL, e.g. http://127.0.0.1:9000)`,
			`routes: at least one route is required (requests matching no route are proxied unprotected)`,
		}},
		{name: "an empty store section", src: "store:\n  redis:\n" + withRoute(""), want: []string{
			`store.redis: the section is empty; give its fields or remove it (line 2)`,
		}},
		{name: "a scheme, no host", src: "listen: 127.0.0.1:8080\nupstream: https://\nroutes: []\n", want: []string{
			`upstream: "https://" is not an absolute http or https URL: it names no host (line 2)`,
			`routes: at least one route is required (requests matching no route are proxied unprotected) (line 3)`,
		}},
		{name: "a host and port, no scheme", src: "upstream: localhost:9000\nlisten: 127.0.0.1:8080\n" + oneRoute, want: []string{
			`upstream: "localhost:9000" is not an absolute http or https URL (add http:// or https://) (line 1)`,
		}},
		{name: "a password stays out", src: "listen: 127.0.0.1:8080\nupstream: ftp://u:secret@pay\n" + oneRoute, want: []string{
			`upstream: "ftp://u:xxxxx@pay" is not an absolute http or https URL (line 2)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.src
			if tt.file != "" {
				b, err := os.ReadFile("testdata/" + tt.file)
				if err != nil {
					t.Fatal(err)
				}
				src = string(b)
			}
			if got := problemsOf(t, src); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems:\n  %q\nwant:\n  %q", got, tt.want)
			}
		})
	}
}
