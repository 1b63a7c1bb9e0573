package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/keyextract"
	"go.yaml.in/yaml/v3"
)

// head is the top of a valid configuration; tests append one route to it.
const head = `listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes:
`

// withRoute is a valid configuration whose only route has the given extra
// lines (indented as route fields).
func withRoute(extra string) string {
	return head + `  - name: charges
    match: POST /charges
    key:
      json: orderId
` + extra
}

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", src, err)
	}
	return c
}

// problemsOf parses src, expects a *validationError and returns its problems.
func problemsOf(t *testing.T, src string) []string {
	t.Helper()
	_, err := Parse([]byte(src))
	if err == nil {
		t.Fatalf("Parse:\n%s\nerror = nil, want a *ValidationError", src)
	}
	var ve *validationError
	if !errors.As(err, &ve) {
		t.Fatalf("Parse error %T (%v), want a *ValidationError", err, err)
	}
	if ve.Error() != "invalid config:\n  "+strings.Join(ve.Problems, "\n  ") {
		t.Errorf("Error() = %q does not list the problems", ve.Error())
	}
	return ve.Problems
}

// fieldPath matches the field path every problem starts with.
var fieldPath = regexp.MustCompile(`^[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*: \S`)

func TestDefaults(t *testing.T) {
	c, err := Load("testdata/minimal.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.Routes) != 1 {
		t.Fatalf("%d routes, want 1", len(c.Routes))
	}
	r := c.Routes[0]
	for _, s := range []struct{ name, got, want string }{
		{"listen", c.Listen, "127.0.0.1:8080"},
		{"upstream", c.Upstream, "http://127.0.0.1:9000"},
		{"admin.listen", c.Admin.Listen, ""},
		{"admin.token_env", c.Admin.TokenEnv, "IDEMPROXY_ADMIN_TOKEN"},
		{"admin.max_connections", strconv.Itoa(c.Admin.MaxConnections), "64"},
		{"policy", r.Policy, PolicyReserveThenCommit},
		{"duplicate", r.Duplicate, duplicateReplay},
		{"concurrent", r.Concurrent, concurrentReject},
		{"on_missing_key", r.OnMissingKey, missingKeyReject},
		{"on_store_error", r.OnStoreError, storeErrorReject},
		{"scope.header", r.Scope.Header, ""},
	} {
		if s.got != s.want {
			t.Errorf("%s = %q, want %q", s.name, s.got, s.want)
		}
	}
	for _, d := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ttl", r.TTL.D(), 24 * time.Hour},
		{"upstream_timeout", r.UpstreamTimeout.D(), 30 * time.Second},
		{"lease", r.Lease.D(), 35 * time.Second},
		{"wait_timeout", r.WaitTimeout.D(), 5 * time.Second},
		{"server.read_header_timeout", c.Server.ReadHeaderTimeout.D(), 10 * time.Second},
		{"server.read_timeout", c.Server.ReadTimeout.D(), 60 * time.Second},
		{"server.idle_timeout", c.Server.IdleTimeout.D(), 120 * time.Second},
		{"server.passthrough_timeout", c.Server.PassthroughTimeout.D(), 60 * time.Second},
		{"server.shutdown_timeout", c.Server.ShutdownTimeout.D(), 30 * time.Second},
		{"server.drain_delay", c.Server.DrainDelay.D(), 0},
		{"server.body_timeout", c.Server.BodyTimeout.D(), 10 * time.Second},
	} {
		if d.got != d.want {
			t.Errorf("%s = %v, want %v", d.name, d.got, d.want)
		}
	}
	if r.MaxBodyBytes != 1<<20 {
		t.Errorf("max_body_bytes = %d, want %d", r.MaxBodyBytes, 1<<20)
	}
	if got := c.Server.MaxBufferedBytesPerClient; got != 8<<20 {
		t.Errorf("server.max_buffered_bytes_per_client = %d, want %d (max_buffered_bytes / 8)", got, 8<<20)
	}
	if got := c.Server.MaxRequestsPerClient; got != 256 {
		t.Errorf("server.max_requests_per_client = %d, want 256 (max_connections / 4)", got)
	}
	if got := c.Server.MaxClientResetsPerSecond; got != 100 {
		t.Errorf("server.max_client_resets_per_second = %d, want 100", got)
	}
	if r.MaxStoredBodyBytes != 1<<20 {
		t.Errorf("max_stored_body_bytes = %d, want %d", r.MaxStoredBodyBytes, 1<<20)
	}
	if r.ReleaseStatuses != nil {
		t.Errorf("release_statuses = %v, want nil (the policy's set)", r.ReleaseStatuses)
	}
	if r.Fingerprint.Disabled || r.Fingerprint.Ignore != nil {
		t.Errorf("fingerprint = %+v, want enabled with nothing ignored", r.Fingerprint)
	}
	wantHeaders := []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
		"Location", "Etag", "Last-Modified", "Link", "Cache-Control"}
	if !slices.Equal(r.ReplayHeaders, wantHeaders) {
		t.Errorf("replay_headers = %q, want %q", r.ReplayHeaders, wantHeaders)
	}
	// The default list is copied, never shared.
	r.ReplayHeaders[0] = "X-Changed"
	if defaultReplayHeaders[0] != "Content-Type" {
		t.Errorf("changing a route's replay_headers changed DefaultReplayHeaders")
	}

	if c.Store.Redis != nil {
		t.Errorf("store.redis = %+v, want nil", c.Store.Redis)
	}
	b := c.Store.Badger
	if b == nil {
		t.Fatalf("store.badger = nil, want the default Badger store")
	}
	if b.Dir != "./data" {
		t.Errorf("store.badger.dir = %q, want ./data", b.Dir)
	}
	if b.SyncWrites == nil || !*b.SyncWrites {
		t.Errorf("store.badger.sync_writes = %v, want true", b.SyncWrites)
	}
	if b.GCInterval.D() != 5*time.Minute {
		t.Errorf("store.badger.gc_interval = %v, want 5m", b.GCInterval.D())
	}
	if b.Preallocate != "auto" {
		t.Errorf("store.badger.preallocate = %q, want auto", b.Preallocate)
	}
	if got := c.Store.EpochCheckInterval.D(); got != 2*time.Second {
		t.Errorf("store.epoch_check_interval = %v, want 2s", got)
	}
}

// TestBadgerPreallocate: each value of store.badger.preallocate is read as
// written, YAML 1.1's "off" included (a string, not false); none gives
// auto.
func TestBadgerPreallocate(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"store: {badger: {dir: /d}}\n", "auto"},
		{"store: {badger: {preallocate: auto}}\n", "auto"},
		{"store: {badger: {preallocate: off}}\n", "off"},
		{"store: {badger: {preallocate: \"off\"}}\n", "off"},
		{"store: {badger: {preallocate: required}}\n", "required"},
	} {
		c := mustParse(t, tc.yaml+withRoute(""))
		if got := c.Store.Badger.Preallocate; got != tc.want {
			t.Errorf("%q: store.badger.preallocate = %q, want %q", tc.yaml, got, tc.want)
		}
	}
}

func TestDefaultsDependOnOtherFields(t *testing.T) {
	c := mustParse(t, withRoute(`    upstream_timeout: 10s
    replay_headers: [content-type, x-request-id, ETAG, location]
`))
	r := c.Routes[0]
	if r.Lease.D() != 15*time.Second {
		t.Errorf("lease = %v, want upstream_timeout + 5s = 15s", r.Lease.D())
	}
	if want := []string{"Content-Type", "X-Request-Id", "Etag", "Location"}; !slices.Equal(r.ReplayHeaders, want) {
		t.Errorf("replay_headers = %q, want %q", r.ReplayHeaders, want)
	}

	// Explicit values are kept.
	c = mustParse(t, `listen: :8080
upstream: https://charges.internal/base
admin:
  listen: :9091
  token_env: MY_TOKEN
store:
  badger:
    dir: /var/lib/idemproxy
    sync_writes: false
    gc_interval: 1h
server:
  read_header_timeout: 1s
  drain_delay: 5s
routes:
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    policy: release-on-5xx
    duplicate: reject
    concurrent: wait
    wait_timeout: 2s
    on_missing_key: forward
    on_store_error: forward
    ttl: 1h
    lease: 1m
    upstream_timeout: 50s
    max_body_bytes: 2048
    max_stored_body_bytes: 4096
    fingerprint: {ignore: [sentAt, items.0.ts], disabled: true}
    scope: {header: X-Api-Key}
`)
	r = c.Routes[0]
	got := []any{c.Admin.TokenEnv, c.Store.Badger.Dir, *c.Store.Badger.SyncWrites, c.Store.Badger.GCInterval.D(),
		c.Server.ReadHeaderTimeout.D(), c.Server.DrainDelay.D(), r.Policy, r.Duplicate, r.Concurrent, r.WaitTimeout.D(),
		r.OnMissingKey, r.OnStoreError, r.TTL.D(), r.Lease.D(), r.UpstreamTimeout.D(), r.MaxBodyBytes, r.MaxStoredBodyBytes,
		r.Fingerprint.Disabled, r.Scope.Header}
	want := []any{"MY_TOKEN", "/var/lib/idemproxy", false, time.Hour,
		time.Second, 5 * time.Second, PolicyReleaseOn5xx, DuplicateReject, ConcurrentWait, 2 * time.Second,
		MissingKeyForward, StoreErrorForward, time.Hour, time.Minute, 50 * time.Second, int64(2048), int64(4096),
		true, "X-Api-Key"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("explicit values:\n got %v\nwant %v", got, want)
	}
	if !slices.Equal(r.Fingerprint.Ignore, []string{"sentAt", "items.0.ts"}) {
		t.Errorf("fingerprint.ignore = %q", r.Fingerprint.Ignore)
	}
}

// The example at the repository's root must always load.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../config.example.yaml")
	if err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	if len(c.Routes) == 0 {
		t.Fatal("config.example.yaml has no routes")
	}
	for i, r := range c.Routes {
		if len(r.Key.Spec().Parts) == 0 || r.Lease.D() <= r.UpstreamTimeout.D() || r.TTL.D() <= r.Lease.D() {
			t.Errorf("routes[%d] = %+v", i, r)
		}
	}
	if (c.Store.Badger == nil) == (c.Store.Redis == nil) {
		t.Errorf("store = %+v, want exactly one backend", c.Store)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "absent.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(absent) = %v, want a not-exist error", err)
	}
	for name, src := range map[string]string{
		"empty":               "",
		"comments only":       "# nothing here\n",
		"two documents":       withRoute("") + "---\n" + withRoute(""),
		"not a mapping":       "- a\n- b\n",
		"syntax error":        "listen: [\n",
		"tab indentation":     "listen: :8080\nroutes:\n\t- name: x\n",
		"duplicate mapping":   "listen: :8080\nlisten: :8081\n" + strings.TrimPrefix(withRoute(""), "listen: 127.0.0.1:8080\n"),
		"string for a slice":  "listen: :8080\nupstream: http://x\nroutes: charges\n",
		"string for a number": withRoute("    max_body_bytes: lots\n"),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse([]byte(src))
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", src, c)
			}
		})
	}
}

func TestUnknownFields(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"top level", "lisen: :8080\n" + withRoute(""), []string{"lisen: unknown field; did you mean `listen`? (line 1)"}},
		{"route", withRoute("    polcy: release-on-5xx\n"), []string{"routes[0].polcy: unknown field; did you mean `policy`? (line 8)"}},
		{"key", head + "  - name: a\n    match: POST /a\n    key: {jsn: orderId}\n", []string{"routes[0].key.jsn: unknown field; did you mean `json`? (line 6)"}},
		{"badger", withRoute("") + "store:\n  badger:\n    directory: /data\n", []string{"store.badger.directory: unknown field (line 10)"}},
		{"redis", withRoute("") + "store:\n  redis:\n    addr: [a:1]\n", []string{"store.redis.addr: unknown field; did you mean `addrs`? (line 10)"}},
		{"fingerprint", withRoute("    fingerprint: {ignored: [a]}\n"), []string{"routes[0].fingerprint.ignored: unknown field; did you mean `ignore`? (line 8)"}},
		{"admin", "admin: {port: 9091}\n" + withRoute(""), []string{"admin.port: unknown field (line 1)"}},
		{"server", "server: {write_timeout: 1s}\n" + withRoute(""), []string{"server.write_timeout: unknown field (line 1)"}},
		// All of them at once, with the line of each, and bad durations too.
		{"several", "lisen: :8080\n" + withRoute("    polcy: x\n    ttl: 30\n    lease: abc\n"), []string{
			"lisen: unknown field; did you mean `listen`? (line 1)",
			"routes[0].polcy: unknown field; did you mean `policy`? (line 9)",
			`routes[0].ttl: duration "30" needs a unit, e.g. "30s" or "24h" (line 10)`,
			`routes[0].lease: invalid duration "abc" (line 11)`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src))
			if err == nil {
				t.Fatalf("Parse:\n%s\nerror = nil, want unknown-field errors", tc.src)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestManyMistakesReportedAtOnce(t *testing.T) {
	b, err := os.ReadFile("testdata/many_mistakes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	probs := problemsOf(t, string(b))
	want := []string{
		`listen: "localhost" is not a host:port address`,
		`upstream: "ftp://127.0.0.1:9000" is not an absolute http or https URL`,
		`store: set exactly one of badger, redis and postgres`,
		`routes[0].match: parsing "POST charges"`,
		`routes[0].policy: "release-on-4xx" is not one of reserve-then-commit, release-on-5xx`,
		`routes[0].duplicate: "ignore" is not one of replay, reject`,
		`routes[0].concurrent: "queue" is not one of reject, wait`,
		`routes[0].on_missing_key: "drop" is not one of reject, forward`,
		`routes[0].on_store_error: "retry" is not one of reject, forward`,
		`routes[0].release_statuses[0]: 200 is not an error status (400-599)`,
		`routes[0].release_statuses[2]: 600 is not an error status (400-599)`,
		`routes[0].lease: 10s must exceed upstream_timeout (30s)`,
		`routes[0].ttl: 5s must exceed lease (10s)`,
		`routes[0].replay_headers[1]: Set-Cookie is never replayed`,
		`routes[0].replay_headers[2]: "bad header" is not a header name`,
		`routes[0].fingerprint.ignore[0]: "items[0].ts" is not a JSON path`,
		`routes[0].scope.header: "X Api Key" is not a header name`,
		`routes[1].name: "charges" is already used by routes[0]`,
		`routes[1].key.path: the match pattern has no wildcard {orderId}`,
		`routes[2].name: "bad name!" must be 1 to 64 letters`,
		`routes[2].match: "POST /orders/{order}/charges" conflicts with routes[1].match "POST /orders/{id}/charges"`,
		`routes[2].key: set exactly one of json, header, query, path or parts`,
		`routes[3].key.parts: a composite key needs at least two parts`,
		`routes[4].key.parts[1]: parts cannot be nested`,
		`routes[5].key: set exactly one of json, header, query, path or parts`,
		`routes[6].match: required`,
	}
	matched := make([]bool, len(probs))
	for _, w := range want {
		found := false
		for i, p := range probs {
			if !matched[i] && strings.HasPrefix(p, w) {
				found, matched[i] = true, true
				break
			}
		}
		if !found {
			t.Errorf("no problem starts with %q", w)
		}
	}
	for i, p := range probs {
		if !fieldPath.MatchString(p) {
			t.Errorf("problem %q does not start with a field path", p)
		}
		if strings.Contains(p, "\n") {
			t.Errorf("problem %q spans several lines", p)
		}
		if !matched[i] {
			t.Errorf("unexpected problem %q", p)
		}
	}
}

// TestValidationProblems checks one mistake at a time, each reported under
// its field.
func TestValidationProblems(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string // the problem, from its field path on (a prefix)
	}{
		{"no listen", "upstream: http://x\nroutes:\n" + strings.SplitN(withRoute(""), "routes:\n", 2)[1], "listen: required"},
		{"listen without port", strings.Replace(withRoute(""), "127.0.0.1:8080", "127.0.0.1", 1), `listen: "127.0.0.1" is not a host:port address`},
		{"listen port out of range", strings.Replace(withRoute(""), "127.0.0.1:8080", "127.0.0.1:99999", 1), `listen: "127.0.0.1:99999": port 99999 is not 0 to 65535 or a service name`},
		{"listen port unknown name", strings.Replace(withRoute(""), "127.0.0.1:8080", "127.0.0.1:no-such-service", 1), `listen: "127.0.0.1:no-such-service": port no-such-service is not 0 to 65535 or a service name`},
		{"admin port out of range", "admin: {listen: \"127.0.0.1:70000\"}\n" + withRoute(""), `admin.listen: "127.0.0.1:70000": port 70000 is not 0 to 65535 or a service name`},
		{"upstream port out of range", strings.Replace(withRoute(""), "http://127.0.0.1:9000", "http://127.0.0.1:99999", 1), `upstream: "http://127.0.0.1:99999": port 99999 is not 0 to 65535 or a service name`},
		{"no upstream", strings.Replace(withRoute(""), "upstream: http://127.0.0.1:9000\n", "", 1), "upstream: required"},
		{"relative upstream", strings.Replace(withRoute(""), "http://127.0.0.1:9000", "/api", 1), `upstream: "/api" is not an absolute`},
		{"upstream with query", strings.Replace(withRoute(""), "http://127.0.0.1:9000", "http://x/?a=1", 1), `upstream: "http://x/?a=1" must not carry a query`},
		{"admin on listen", "admin: {listen: \"127.0.0.1:8080\"}\n" + withRoute(""), "admin.listen: \"127.0.0.1:8080\" and listen \"127.0.0.1:8080\" would bind the same port"},
		{"admin without port", "admin: {listen: localhost}\n" + withRoute(""), `admin.listen: "localhost" is not a host:port`},
		{"admin token env", "admin: {token_env: \"MY TOKEN\"}\n" + withRoute(""), `admin.token_env: "MY TOKEN" is not an environment variable name`},
		{"no routes", "listen: :8080\nupstream: http://x\n", "routes: at least one route is required"},
		{"server timeout negative", "server: {read_timeout: -1s}\n" + withRoute(""), "server.read_timeout: must be positive"},
		{"body timeout negative", "server: {body_timeout: -1s}\n" + withRoute(""), "server.body_timeout: must be positive"},
		{"client share negative", "server: {max_buffered_bytes_per_client: -1}\n" + withRoute(""), "server.max_buffered_bytes_per_client: must be positive"},
		{"admin connections negative", "admin: {listen: 127.0.0.1:9091, max_connections: -1}\n" + withRoute(""), "admin.max_connections: must be positive"},
		{"client share over the budget", "server: {max_buffered_bytes: 2097152, max_buffered_bytes_per_client: 4194304}\n" + withRoute(""),
			"server.max_buffered_bytes_per_client: 4194304 exceeds server.max_buffered_bytes (2097152)"},
		{"client requests negative", "server: {max_requests_per_client: -1}\n" + withRoute(""), "server.max_requests_per_client: must be positive"},
		{"client requests over max_connections", "server: {max_connections: 100, max_requests_per_client: 101}\n" + withRoute(""),
			"server.max_requests_per_client: 101 exceeds server.max_connections (100)"},
		{"client resets negative", "server: {max_client_resets_per_second: -1}\n" + withRoute(""), "server.max_client_resets_per_second: must be positive"},
		{"drain delay negative", "server: {drain_delay: -1s}\n" + withRoute(""), "server.drain_delay: must not be negative"},
		{"badger gc negative", "store: {badger: {gc_interval: -1m}}\n" + withRoute(""), "store.badger.gc_interval: must be positive"},
		{"badger preallocate unknown", "store: {badger: {preallocate: always}}\n" + withRoute(""), `store.badger.preallocate: "always" is not one of auto, off, required`},
		{"badger preallocate as a bool", "store: {badger: {preallocate: false}}\n" + withRoute(""), `store.badger.preallocate: "false" is not one of auto, off, required`},
		{"badger preallocate in capitals", "store: {badger: {preallocate: Required}}\n" + withRoute(""), `store.badger.preallocate: "Required" is not one of auto, off, required`},
		{"epoch check negative", "store: {epoch_check_interval: -1s}\n" + withRoute(""), "store.epoch_check_interval: must be positive and at most 1m"},
		{"epoch check too rare", "store: {epoch_check_interval: 2m}\n" + withRoute(""), "store.epoch_check_interval: must be positive and at most 1m"},
		{"memory limit too small", "memory_limit: 1048576\n" + withRoute(""), "memory_limit: 1048576 bytes is below the minimum of 16777216 (16 MiB); 0 chooses it, -1 disables it"},
		{"memory limit negative", "memory_limit: -2\n" + withRoute(""), "memory_limit: -2 bytes is below the minimum of 16777216 (16 MiB); 0 chooses it, -1 disables it"},
		{"route histograms below -1", "metrics: {route_histograms: -2}\n" + withRoute(""), "metrics.route_histograms: -2: want a number of routes, 0 for the default (50) or -1 for none"},

		{"no name", head + "  - match: POST /a\n    key: {json: a}\n", `routes[0].name: "" must be 1 to 64`},
		{"long name", head + "  - name: " + strings.Repeat("n", 65) + "\n    match: POST /a\n    key: {json: a}\n", `routes[0].name: "nnnn`},
		{"duplicate names", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: a\n    match: POST /b\n    key: {json: a}\n",
			`routes[1].name: "a" is already used by routes[0]`},
		{"keyspace with a slash", head + "  - name: a\n    keyspace: a/b\n    match: POST /a\n    key: {json: a}\n", `routes[0].keyspace: "a/b" must be 1 to 64 letters, digits, '.', '_' or '-'`},
		{"keyspace too long", head + "  - name: a\n    keyspace: " + strings.Repeat("k", 65) + "\n    match: POST /a\n    key: {json: a}\n", `routes[0].keyspace: "kkkk`},
		{"keyspace shared with another key", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: b\n    keyspace: a\n    match: POST /b\n    key: {header: Idempotency-Key}\n",
			`routes[1].keyspace: "a" is also routes[0]'s keyspace, whose keys are made otherwise (json a; scope none; normalize none; here header Idempotency-Key; scope none; normalize none)`},
		{"keyspace shared with another scope", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: b\n    keyspace: a\n    match: POST /b\n    key: {json: a}\n    scope: {header: X-Api-Key}\n",
			`routes[1].keyspace: "a" is also routes[0]'s keyspace, whose keys are made otherwise (json a; scope none; normalize none; here json a; scope header X-Api-Key; normalize none)`},
		{"keyspace is another route's name", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: b\n    match: POST /b\n    key: {json: b}\n  - name: c\n    keyspace: b\n    match: POST /c\n    key: {json: b, normalize: nfc}\n",
			`routes[2].keyspace: "b" is also routes[1]'s keyspace, whose keys are made otherwise (json b; scope none; normalize none; here json b; scope none; normalize nfc)`},
		{"no match", head + "  - name: a\n    key: {json: a}\n", "routes[0].match: required"},
		{"two methods", head + "  - name: a\n    match: \"POST PUT /a\"\n    key: {json: a}\n", `routes[0].match: "POST PUT /a" never matches: its host part "PUT " holds white space`},
		{"leading space", head + "  - name: a\n    match: \" POST /a\"\n    key: {json: a}\n", `routes[0].match: " POST /a" never matches: its host part "POST " holds white space`},
		{"host with a port", head + "  - name: a\n    match: POST api.example.com:8080/a\n    key: {json: a}\n",
			`routes[0].match: "POST api.example.com:8080/a" never matches: hosts are matched on any port, so the port ":8080" must be left out`},
		{"IPv6 host with a port", head + "  - name: a\n    match: POST [::1]:8080/a\n    key: {json: a}\n",
			`routes[0].match: "POST [::1]:8080/a" never matches: hosts are matched on any port, so the port ":8080" must be left out`},
		{"lower-case method", head + "  - name: a\n    match: post /a\n    key: {json: a}\n", `routes[0].match: method "post" never matches: HTTP methods are case-sensitive (POST)`},
		{"bad method", head + "  - name: a\n    match: \"PO(ST /a\"\n    key: {json: a}\n", `routes[0].match: parsing "PO(ST /a": at offset 0: invalid method`},
		{"no slash", head + "  - name: a\n    match: POST charges\n    key: {json: a}\n", `routes[0].match: parsing "POST charges"`},
		{"bad wildcard", head + "  - name: a\n    match: POST /a/{id\n    key: {json: a}\n", `routes[0].match: parsing "POST /a/{id"`},
		{"same pattern twice", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: b\n    match: POST /a\n    key: {json: a}\n",
			`routes[1].match: "POST /a" conflicts with routes[0].match "POST /a": POST /a matches the same requests as POST /a`},
		{"same host in another case", head + "  - name: a\n    match: POST api.example.com/a\n    key: {json: a}\n  - name: b\n    match: POST API.Example.com./a\n    key: {json: a}\n",
			`routes[1].match: "POST API.Example.com./a" conflicts with routes[0].match "POST api.example.com/a"`},
		{"overlapping patterns", head + "  - name: a\n    match: POST /o/{id}/c\n    key: {json: a}\n  - name: b\n    match: POST /o/x/c\n    key: {json: a}\n  - name: c\n    match: POST /o/{x}/c\n    key: {json: a}\n",
			`routes[2].match: "POST /o/{x}/c" conflicts with routes[0].match "POST /o/{id}/c"`},

		{"no key", head + "  - name: a\n    match: POST /a\n", "routes[0].key: set exactly one of"},
		{"two sources", head + "  - name: a\n    match: POST /a\n    key: {json: a, query: b}\n", "routes[0].key: set exactly one of"},
		{"source and parts", head + "  - name: a\n    match: POST /a\n    key: {json: a, parts: [{json: b}, {json: c}]}\n", "routes[0].key: set exactly one of"},
		{"composite of one part", head + "  - name: a\n    match: POST /a\n    key: {parts: [{json: b}]}\n", "routes[0].key.parts: a composite key needs at least two parts"},
		{"nested parts", head + "  - name: a\n    match: POST /a\n    key: {parts: [{json: b}, {parts: [{json: c}, {json: d}]}]}\n", "routes[0].key.parts[1]: parts cannot be nested"},
		{"normalize unknown", head + "  - name: a\n    match: POST /a\n    key: {json: b, normalize: nfd}\n", "routes[0].key.normalize: \"nfd\" is not one of none, nfc"},
		{"normalize on a part", head + "  - name: a\n    match: POST /a\n    key: {parts: [{json: b, normalize: nfc}, {json: c}]}\n", "routes[0].key.parts[0].normalize: applies to the whole key: set it on routes[0].key.normalize"},
		{"part with two sources", head + "  - name: a\n    match: POST /a\n    key: {parts: [{json: b, header: C}, {json: d}]}\n", "routes[0].key.parts[0]: set exactly one of"},
		{"empty part", head + "  - name: a\n    match: POST /a\n    key: {parts: [{}, {json: d}]}\n", "routes[0].key.parts[0]: set exactly one of"},
		{"bad json path", head + "  - name: a\n    match: POST /a\n    key: {json: \"items[0]\"}\n", `routes[0].key.json: "items[0]" is not a JSON path`},
		{"gjson syntax", head + "  - name: a\n    match: POST /a\n    key: {json: \"items.#.id\"}\n", `routes[0].key.json: "items.#.id" is not a JSON path`},
		{"bad header", head + "  - name: a\n    match: POST /a\n    key: {header: \"Idempotency Key\"}\n", `routes[0].key.header: "Idempotency Key" is not a header name`},
		{"path key not in pattern", head + "  - name: a\n    match: POST /orders/{id}/charges\n    key: {path: orderId}\n",
			"routes[0].key.path: the match pattern has no wildcard {orderId}"},
		{"path key without wildcards", head + "  - name: a\n    match: POST /charges\n    key: {path: id}\n",
			"routes[0].key.path: the match pattern has no wildcard {id}"},
		{"path key is the end anchor", head + "  - name: a\n    match: POST /charges/{$}\n    key: {path: $}\n",
			"routes[0].key.path: the match pattern has no wildcard {$}"},
		{"path part not in pattern", head + "  - name: a\n    match: POST /orders/{id}\n    key: {parts: [{path: id}, {path: line}]}\n",
			"routes[0].key.parts[1].path: the match pattern has no wildcard {line}"},

		{"policy", withRoute("    policy: release-on-error\n"), `routes[0].policy: "release-on-error" is not one of reserve-then-commit, release-on-5xx`},
		{"duplicate", withRoute("    duplicate: drop\n"), `routes[0].duplicate: "drop" is not one of replay, reject`},
		{"concurrent", withRoute("    concurrent: queue\n"), `routes[0].concurrent: "queue" is not one of reject, wait`},
		{"on_missing_key", withRoute("    on_missing_key: ignore\n"), `routes[0].on_missing_key: "ignore" is not one of reject, forward`},
		{"on_store_error", withRoute("    on_store_error: open\n"), `routes[0].on_store_error: "open" is not one of reject, forward`},
		{"release status 399", withRoute("    release_statuses: [399]\n"), "routes[0].release_statuses[0]: 399 is not an error status (400-599)"},
		{"release status 600", withRoute("    release_statuses: [503, 600]\n"), "routes[0].release_statuses[1]: 600 is not an error status (400-599)"},
		{"release status 200", withRoute("    release_statuses: [200]\n"), "routes[0].release_statuses[0]: 200 is not an error status"},
		{"replay Set-Cookie", withRoute("    replay_headers: [Content-Type, Set-Cookie]\n"), "routes[0].replay_headers[1]: Set-Cookie is never replayed"},
		{"replay set-cookie", withRoute("    replay_headers: [set-cookie]\n"), "routes[0].replay_headers[0]: Set-Cookie is never replayed"},
		{"replay hop-by-hop", withRoute("    replay_headers: [connection]\n"), "routes[0].replay_headers[0]: Connection is never replayed"},
		{"replay TE", withRoute("    replay_headers: [TE]\n"), "routes[0].replay_headers[0]: Te is never replayed"},
		{"replay replayed marker", withRoute("    replay_headers: [Idempotent-Replayed]\n"), "routes[0].replay_headers[0]: Idempotent-Replayed is never replayed"},
		{"replay bad name", withRoute("    replay_headers: [\"X:Y\"]\n"), `routes[0].replay_headers[0]: "X:Y" is not a header name`},
		{"fingerprint ignore", withRoute("    fingerprint: {ignore: [\"meta..sentAt\"]}\n"), `routes[0].fingerprint.ignore[0]: "meta..sentAt" is not a JSON path`},
		{"scope header", withRoute("    scope: {header: \"X-Api Key\"}\n"), `routes[0].scope.header: "X-Api Key" is not a header name`},
		{"negative max body", withRoute("    max_body_bytes: -1\n"), "routes[0].max_body_bytes: must be positive"},
		{"negative max stored body", withRoute("    max_stored_body_bytes: -1\n"), "routes[0].max_stored_body_bytes: must be positive"},
		{"negative wait", withRoute("    wait_timeout: -1s\n"), "routes[0].wait_timeout: must be positive"},
		{"negative upstream timeout", withRoute("    upstream_timeout: -1s\n    lease: 5s\n"), "routes[0].upstream_timeout: must be positive"},

		{"lease equal to upstream timeout", withRoute("    upstream_timeout: 30s\n    lease: 30s\n"), "routes[0].lease: 30s must exceed upstream_timeout (30s)"},
		{"lease below upstream timeout", withRoute("    lease: 10s\n"), "routes[0].lease: 10s must exceed upstream_timeout (30s)"},
		{"ttl equal to lease", withRoute("    ttl: 35s\n"), "routes[0].ttl: 35s must exceed lease (35s)"},
		{"ttl below lease", withRoute("    ttl: 1s\n    lease: 1m\n"), "routes[0].ttl: 1s must exceed lease (1m0s)"},
		{"ttl below default lease", withRoute("    ttl: 10s\n"), "routes[0].ttl: 10s must exceed lease (35s)"},
		{"negative ttl", withRoute("    ttl: -24h\n"), "routes[0].ttl: -24h0m0s must exceed lease"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			probs := problemsOf(t, tc.src)
			found := false
			for _, p := range probs {
				if strings.HasPrefix(p, tc.want) {
					found = true
				}
				if !fieldPath.MatchString(p) {
					t.Errorf("problem %q does not start with a field path", p)
				}
			}
			if !found {
				t.Errorf("problems %q\nhave none starting with %q", probs, tc.want)
			}
		})
	}
}

func TestValidConfigs(t *testing.T) {
	tests := []struct {
		name string
		src  string
	}{
		{"header key", head + "  - name: a\n    match: POST /a\n    key: {header: Idempotency-Key}\n"},
		{"query key", head + "  - name: a\n    match: POST /a\n    key: {query: orderId}\n"},
		{"path key", head + "  - name: a\n    match: POST /orders/{id}/charges\n    key: {path: id}\n"},
		{"path key, rest wildcard", head + "  - name: a\n    match: PUT /files/{name...}\n    key: {path: name}\n"},
		{"nested json key", head + "  - name: a\n    match: POST /a\n    key: {json: items.0.sku}\n"},
		{"composite", head + "  - name: a\n    match: POST /o/{id}\n    key: {parts: [{path: id}, {json: order.line}, {header: X-Kind}, {query: q}]}\n"},
		{"no method in pattern", head + "  - name: a\n    match: /a\n    key: {json: a}\n"},
		{"host in pattern", head + "  - name: a\n    match: POST api.example.com/a\n    key: {json: a}\n"},
		{"two routes", head + "  - name: a\n    match: POST /a\n    key: {json: a}\n  - name: b\n    match: PUT /a\n    key: {json: a}\n"},
		{"more specific pattern", head + "  - name: a\n    match: POST /o/{id}\n    key: {json: a}\n  - name: b\n    match: POST /o/special\n    key: {json: a}\n"},
		{"route name characters", head + "  - name: Charges_v2.eu-west\n    match: POST /a\n    key: {json: a}\n"},
		{"release statuses bounds", withRoute("    release_statuses: [400, 503, 599]\n")},
		{"empty replay headers", withRoute("    replay_headers: []\n")},
		{"duration with days", withRoute("    ttl: 7d\n")},
		{"quoted duration", withRoute("    ttl: \"90m\"\n")},
		{"compound duration", withRoute("    ttl: 1h30m\n    lease: 1m30s\n    upstream_timeout: 1m\n")},
		{"ttl just above lease", withRoute("    ttl: 36s\n")},
		{"lease just above upstream timeout", withRoute("    lease: 30001ms\n")},
		{"https upstream", strings.Replace(withRoute(""), "http://127.0.0.1:9000", "https://svc.internal:8443/v1", 1)},
		{"IPv6 listen", strings.Replace(withRoute(""), "127.0.0.1:8080", "\"[::1]:8080\"", 1)},
		{"empty document marker", "---\n" + withRoute("")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustParse(t, tc.src)
		})
	}
}

func TestDurations(t *testing.T) {
	tests := []struct {
		value string // as written in YAML
		want  time.Duration
		err   string // a substring of the error, "" when valid
	}{
		{value: "500ms", want: 500 * time.Millisecond},
		{value: "45s", want: 45 * time.Second},
		{value: "24h", want: 24 * time.Hour},
		{value: "7d", want: 7 * 24 * time.Hour},
		{value: "1d", want: 24 * time.Hour},
		{value: "30d", want: 30 * 24 * time.Hour},
		{value: "1h30m", want: 90 * time.Minute},
		{value: `"48h"`, want: 48 * time.Hour},
		{value: "30", err: `duration "30" needs a unit`},
		{value: "0", err: `duration "0" needs a unit`},
		{value: "1.5", err: `duration "1.5" needs a unit`},
		{value: "true", err: `duration "true" needs a unit`},
		{value: `"30"`, err: `invalid duration "30"`},
		{value: "abc", err: `invalid duration "abc"`},
		{value: "7days", err: `invalid duration "7days"`},
		{value: "1.5d", err: `invalid duration "1.5d"`},
		{value: "-1d", err: `invalid duration "-1d"`},
		{value: "d", err: `invalid duration "d"`},
		{value: "7 d", err: `invalid duration "7 d"`},
		{value: "1d12h", err: `invalid duration "1d12h"`},
		{value: "99999d", err: `invalid duration "99999d"`},
		{value: "[24h]", err: `a duration such as "30s" expected, not a list`},
		{value: "{h: 24}", err: `a duration such as "30s" expected, not a mapping`},
	}
	for _, tc := range tests {
		t.Run(tc.value, func(t *testing.T) {
			src := withRoute("    ttl: " + tc.value + "\n    upstream_timeout: 100ms\n    lease: 200ms\n")
			c, err := Parse([]byte(src))
			if tc.err == "" {
				if err != nil {
					t.Fatalf("ttl: %s: %v", tc.value, err)
				}
				if got := c.Routes[0].TTL.D(); got != tc.want {
					t.Errorf("ttl: %s = %v, want %v", tc.value, got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ttl: %s accepted as %v, want an error", tc.value, c.Routes[0].TTL.D())
			}
			if !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ttl: %s: error %q does not contain %q", tc.value, err, tc.err)
			}
			if !strings.Contains(err.Error(), "routes[0].ttl: ") || !strings.Contains(err.Error(), "(line 8)") {
				t.Errorf("ttl: %s: error %q does not give the line", tc.value, err)
			}
		})
	}

	// Every duration field takes the same syntax.
	for _, field := range []string{"lease", "upstream_timeout", "wait_timeout"} {
		if _, err := Parse([]byte(withRoute("    " + field + ": 30\n"))); err == nil || !strings.Contains(err.Error(), "needs a unit") {
			t.Errorf("%s: 30 gave %v, want a unit error", field, err)
		}
	}
	if _, err := Parse([]byte("server: {read_timeout: 60}\n" + withRoute(""))); err == nil || !strings.Contains(err.Error(), "needs a unit") {
		t.Errorf("server.read_timeout: 60 gave %v, want a unit error", err)
	}
}

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{
		"0s": 0, "0d": 0, "1ns": 1, "2h45m": 2*time.Hour + 45*time.Minute, "14d": 14 * 24 * time.Hour, "65535d": 65535 * 24 * time.Hour,
	}
	for s, want := range good {
		if got, err := parseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1", "d", "+1d", "-1d", "0x10d", "65536d", "1e3d", "1w", "1 h"} {
		if got, err := parseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", s, got)
		}
	}
}

func TestDurationMarshalYAML(t *testing.T) {
	b, err := yaml.Marshal(struct {
		TTL Duration `yaml:"ttl"`
	}{Duration(36 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "ttl: 36h0m0s\n"; got != want {
		t.Errorf("Marshal = %q, want %q", got, want)
	}
	var back struct {
		TTL Duration `yaml:"ttl"`
	}
	if err := yaml.Unmarshal(b, &back); err != nil || back.TTL.D() != 36*time.Hour {
		t.Errorf("round trip: %v, %v", back.TTL.D(), err)
	}
}

func TestKeySpec(t *testing.T) {
	tests := []struct {
		key  string
		want []keyextract.Source
	}{
		{"{json: order.id}", []keyextract.Source{{Kind: keyextract.JSON, Name: "order.id"}}},
		{"{header: Idempotency-Key}", []keyextract.Source{{Kind: keyextract.Header, Name: "Idempotency-Key"}}},
		{"{query: orderId}", []keyextract.Source{{Kind: keyextract.Query, Name: "orderId"}}},
		{"{path: id}", []keyextract.Source{{Kind: keyextract.Path, Name: "id"}}},
		{"{parts: [{path: id}, {json: line}, {header: X-Kind}]}", []keyextract.Source{
			{Kind: keyextract.Path, Name: "id"}, {Kind: keyextract.JSON, Name: "line"}, {Kind: keyextract.Header, Name: "X-Kind"}}},
	}
	for _, tc := range tests {
		c := mustParse(t, head+"  - name: a\n    match: POST /orders/{id}\n    key: "+tc.key+"\n")
		if got := c.Routes[0].Key.Spec(); !reflect.DeepEqual(got.Parts, tc.want) {
			t.Errorf("key %s: Spec() = %v, want %v", tc.key, got.Parts, tc.want)
		}
	}
}

func TestRedis(t *testing.T) {
	t.Setenv("IDEMPROXY_TEST_REDIS_USER", "proxy")
	t.Setenv("IDEMPROXY_TEST_REDIS_PASSWORD", "")
	c, err := Load("testdata/redis.yaml")
	if err != nil {
		t.Fatalf("Load(redis.yaml): %v", err)
	}
	if c.Store.Badger != nil {
		t.Errorf("store.badger = %+v, want nil when redis is set", c.Store.Badger)
	}
	r := c.Store.Redis
	if r == nil {
		t.Fatal("store.redis = nil")
	}
	if len(r.Addrs) != 3 || r.MasterName != "idemproxy" || r.DB != 2 || !r.TLS {
		t.Errorf("store.redis = %+v", r)
	}
	if r.KeyPrefix != "idemproxy:" || r.DialTimeout.D() != time.Second || r.OpTimeout.D() != 500*time.Millisecond {
		t.Errorf("redis defaults: key_prefix %q, dial_timeout %v, op_timeout %v; want idemproxy:, 1s, 500ms",
			r.KeyPrefix, r.DialTimeout.D(), r.OpTimeout.D())
	}
	if got := c.Routes[0].TTL.D(); got != 7*24*time.Hour {
		t.Errorf("ttl = %v, want 7d", got)
	}
	if got := c.Routes[0].Lease.D(); got != 15*time.Second {
		t.Errorf("lease = %v, want 15s", got)
	}

	redis := func(fields string) string { return "store:\n  redis:\n" + fields + withRoute("") }
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"no addrs", redis("    key_prefix: x\n"), []string{"store.redis.addrs: at least one host:port is required"}},
		{"empty addrs", redis("    addrs: []\n"), []string{"store.redis.addrs: at least one"}},
		{"sentinel without addrs", redis("    master_name: m\n"), []string{"store.redis.addrs: at least one", "store.redis.master_name: needs the Sentinel addresses"}},
		{"bad addr", redis("    addrs: [redis, \"r:6379\", \"\"]\n"), []string{`store.redis.addrs[0]: "redis" is not a host:port`, "store.redis.addrs[2]: required"}},
		{"password env unset", redis("    addrs: [r:6379]\n    password_env: IDEMPROXY_TEST_SURELY_UNSET_6B1F\n"),
			[]string{"store.redis.password_env: environment variable IDEMPROXY_TEST_SURELY_UNSET_6B1F is not set"}},
		{"username env unset", redis("    addrs: [r:6379]\n    username_env: IDEMPROXY_TEST_SURELY_UNSET_6B1F\n"),
			[]string{"store.redis.username_env: environment variable IDEMPROXY_TEST_SURELY_UNSET_6B1F is not set"}},
		{"password env not a name", redis("    addrs: [r:6379]\n    password_env: \"my password\"\n"),
			[]string{`store.redis.password_env: "my password" is not an environment variable name`}},
		{"negative db", redis("    addrs: [r:6379]\n    db: -1\n"), []string{"store.redis.db: must not be negative"}},
		{"db on a cluster", redis("    addrs: [r1:6379, r2:6379]\n    db: 1\n"), []string{"store.redis.db: a Redis Cluster has only database 0"}},
		{"db on a cluster endpoint", redis("    addrs: [r:6379]\n    cluster: true\n    db: 2\n"), []string{"store.redis.db: a Redis Cluster has only database 0"}},
		{"cluster and sentinel", redis("    addrs: [s:26379]\n    cluster: true\n    master_name: m\n"),
			[]string{"store.redis.cluster: a Redis Cluster has no master_name"}},
		{"sentinel credentials without sentinel", redis("    addrs: [r:6379]\n    sentinel_password_env: HOME\n"),
			[]string{"store.redis.sentinel_password_env: Sentinel credentials need master_name"}},
		{"negative timeouts", redis("    addrs: [r:6379]\n    dial_timeout: -1s\n    op_timeout: -1ms\n"),
			[]string{"store.redis.dial_timeout: must be positive", "store.redis.op_timeout: must be positive"}},
		{"negative wait_replicas", redis("    addrs: [r:6379]\n    wait_replicas: -1\n"),
			[]string{"store.redis.wait_replicas: must not be negative"}},
		{"wait_replicas neither auto nor a number", redis("    addrs: [r:6379]\n    wait_replicas: one\n"),
			[]string{`store.redis.wait_replicas: "one" is neither auto nor a number of replicas`}},
		{"auto without a timeout", redis("    addrs: [r:6379]\n    wait_timeout: -1ms\n"),
			[]string{"store.redis.wait_timeout: must be positive when wait_replicas is set"}},
		{"wait without a timeout", redis("    addrs: [r:6379]\n    wait_replicas: 1\n    wait_timeout: -1ms\n"),
			[]string{"store.redis.wait_timeout: must be positive when wait_replicas is set"}},
		{"wait on a cluster", redis("    addrs: [r1:6379, r2:6379]\n    wait_replicas: 1\n"),
			[]string{"store.redis.wait_replicas: is not supported on a Redis Cluster"}},
		{"wait on a cluster endpoint", redis("    addrs: [r:6379]\n    cluster: true\n    wait_replicas: 2\n"),
			[]string{"store.redis.wait_replicas: is not supported on a Redis Cluster"}},
		// The default route: upstream_timeout 30s, lease 35s.
		{"wait as long as the lease margin", redis("    addrs: [r:6379]\n    wait_replicas: 1\n    wait_timeout: 5s\n"),
			[]string{"store.redis.wait_timeout: 5s must be shorter than routes[0]'s lease minus its upstream_timeout (5s)"}},
		{"wait longer than the lease", redis("    addrs: [r:6379]\n    wait_replicas: 1\n    wait_timeout: 1m\n"),
			[]string{"store.redis.wait_timeout: 1m0s must be shorter than routes[0]'s lease"}},
		{"unknown record_layout", redis("    addrs: [r:6379]\n    record_layout: json\n"),
			[]string{`store.redis.record_layout: "json" is not one of packed, hash`}},
		{"record_layout in capitals", redis("    addrs: [r:6379]\n    record_layout: Hash\n"),
			[]string{`store.redis.record_layout: "Hash" is not one of packed, hash`}},
		{"record_layout not a string", redis("    addrs: [r:6379]\n    record_layout: [hash]\n"),
			[]string{"store.redis.record_layout"}},
		{"CA file without a certificate", redis("    addrs: [r:6379]\n    tls: true\n    tls_ca_file: " + notPEM + "\n"),
			[]string{"store.redis.tls_ca_file: no PEM certificate in " + notPEM}},
		{"badger and redis", "store:\n  badger: {dir: /d}\n  redis: {addrs: [\"r:6379\"]}\n" + withRoute(""), []string{"store: set exactly one of badger, redis and postgres"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			probs := problemsOf(t, tc.src)
			for _, w := range tc.want {
				if !slices.ContainsFunc(probs, func(p string) bool { return strings.HasPrefix(p, w) }) {
					t.Errorf("problems %q\nhave none starting with %q", probs, w)
				}
			}
		})
	}

	if n, auto := r.ReplicaWait(); r.WaitReplicas != "auto" || !auto || n != 0 || r.WaitTimeout.D() != 500*time.Millisecond {
		t.Errorf("redis defaults: wait_replicas %q (%d, auto %v), wait_timeout %v; want auto, 500ms", r.WaitReplicas, n, auto, r.WaitTimeout.D())
	}
	if r.RecordLayout != "packed" {
		t.Errorf("redis default record_layout %q, want packed", r.RecordLayout)
	}
	for _, layout := range []string{"packed", "hash"} {
		if c := mustParse(t, redis("    addrs: [r:6379]\n    record_layout: "+layout+"\n")); c.Store.Redis.RecordLayout != layout {
			t.Errorf("record_layout: %s read as %q", layout, c.Store.Redis.RecordLayout)
		}
	}
	// Waiting for replicas: a single node or Sentinel, within the margin.
	// An integer keeps its meaning (0: no waiting); auto, the default,
	// is allowed on a Cluster too, where it waits for none.
	for _, tc := range []struct {
		src  string
		n    int
		auto bool
	}{
		{redis("    addrs: [r:6379]\n    wait_replicas: 1\n"), 1, false},
		{redis("    addrs: [s1:26379, s2:26379]\n    master_name: m\n    wait_replicas: 2\n    wait_timeout: 4s\n"), 2, false},
		{redis("    addrs: [r:6379]\n    wait_replicas: 0\n"), 0, false},
		{redis("    addrs: [r:6379]\n    wait_replicas: auto\n"), 0, true},
		{redis("    addrs: [r1:6379, r2:6379]\n"), 0, true},
	} {
		if n, auto := mustParse(t, tc.src).Store.Redis.ReplicaWait(); n != tc.n || auto != tc.auto {
			t.Errorf("wait_replicas of\n%s= %d, auto %v; want %d, auto %v", tc.src, n, auto, tc.n, tc.auto)
		}
	}

	// Both variables set: valid; the file holds names, never secrets.
	t.Setenv("IDEMPROXY_TEST_SURELY_UNSET_6B1F", "s3cret")
	c = mustParse(t, redis("    addrs: [r:6379]\n    password_env: IDEMPROXY_TEST_SURELY_UNSET_6B1F\n"))
	if c.Store.Redis.PasswordEnv != "IDEMPROXY_TEST_SURELY_UNSET_6B1F" {
		t.Errorf("password_env = %q", c.Store.Redis.PasswordEnv)
	}
}

func TestPostgres(t *testing.T) {
	t.Setenv("IDEMPROXY_TEST_PG_DSN", "postgres://proxy@db/idem")
	pg := func(fields string) string { return "store:\n  postgres:\n" + fields + withRoute("") }
	c := mustParse(t, pg("    dsn_env: IDEMPROXY_TEST_PG_DSN\n"))
	if c.Store.Badger != nil || c.Store.Redis != nil {
		t.Errorf("store = %+v; want only postgres", c.Store)
	}
	got := *c.Store.Postgres
	want := Postgres{
		DSNEnv: "IDEMPROXY_TEST_PG_DSN", MaxConns: 16,
		ConnectTimeout: Duration(time.Second), StatementTimeout: Duration(500 * time.Millisecond),
		Schema: "public", Table: "idemproxy_keys",
	}
	if got != want {
		t.Errorf("store.postgres with defaults = %+v; want %+v", got, want)
	}
	c = mustParse(t, pg("    dsn_env: IDEMPROXY_TEST_PG_DSN\n    max_conns: 4\n    connect_timeout: 2s\n"+
		"    statement_timeout: 250ms\n    schema: idem\n    table: keys\n    synchronous_commit: remote_apply\n"))
	got = *c.Store.Postgres
	want = Postgres{
		DSNEnv: "IDEMPROXY_TEST_PG_DSN", MaxConns: 4,
		ConnectTimeout: Duration(2 * time.Second), StatementTimeout: Duration(250 * time.Millisecond),
		Schema: "idem", Table: "keys", SynchronousCommit: "remote_apply",
	}
	if got != want {
		t.Errorf("store.postgres = %+v; want %+v", got, want)
	}

	t.Setenv("IDEMPROXY_TEST_PG_EMPTY", " ")
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"no dsn_env", pg("    table: keys\n"), []string{"store.postgres.dsn_env: is required"}},
		{"dsn env unset", pg("    dsn_env: IDEMPROXY_TEST_SURELY_UNSET_6B1F\n"),
			[]string{"store.postgres.dsn_env: environment variable IDEMPROXY_TEST_SURELY_UNSET_6B1F is not set"}},
		{"dsn env empty", pg("    dsn_env: IDEMPROXY_TEST_PG_EMPTY\n"),
			[]string{"store.postgres.dsn_env: environment variable IDEMPROXY_TEST_PG_EMPTY is empty"}},
		{"dsn in the file", pg("    dsn_env: \"postgres://u:p@db/x\"\n"),
			[]string{`store.postgres.dsn_env: "postgres://u:p@db/x" is not an environment variable name`}},
		{"negative pool and timeouts", pg("    dsn_env: IDEMPROXY_TEST_PG_DSN\n    max_conns: -1\n    connect_timeout: -1s\n    statement_timeout: -5ms\n"),
			[]string{"store.postgres.max_conns: must be positive", "store.postgres.connect_timeout: must be positive",
				"store.postgres.statement_timeout: must be at least 1ms"}},
		{"names", pg("    dsn_env: IDEMPROXY_TEST_PG_DSN\n    schema: \"My Schema\"\n    table: 1keys\n"),
			[]string{`store.postgres.schema: "My Schema" must be`, `store.postgres.table: "1keys" must be`}},
		{"synchronous_commit", pg("    dsn_env: IDEMPROXY_TEST_PG_DSN\n    synchronous_commit: always\n"),
			[]string{`store.postgres.synchronous_commit: "always" is not one of on, remote_apply, remote_write, local, off`}},
		{"redis and postgres", "store:\n  redis: {addrs: [\"r:6379\"]}\n  postgres: {dsn_env: IDEMPROXY_TEST_PG_DSN}\n" + withRoute(""),
			[]string{"store: set exactly one of badger, redis and postgres"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			probs := problemsOf(t, tc.src)
			for _, w := range tc.want {
				if !slices.ContainsFunc(probs, func(p string) bool { return strings.HasPrefix(p, w) }) {
					t.Errorf("problems %q\nhave none starting with %q", probs, w)
				}
			}
		})
	}
}

// TestEmptyStoreSection: a store section whose fields are all commented
// out must not fall back to the per-replica Badger default in silence.
func TestEmptyStoreSection(t *testing.T) {
	for _, store := range []string{"redis", "badger", "postgres"} {
		y := "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nstore:\n  " + store +
			":\n    # addrs: [redis:6379]\nroutes:\n  - {name: c, match: POST /c, key: {json: id}}\n"
		_, err := Parse([]byte(y))
		if err == nil || !strings.Contains(err.Error(), "store."+store+": the section is empty") {
			t.Errorf("store.%s with nothing under it: err = %v, want it reported", store, err)
		}
	}
	y := "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nstore:\n  # redis: {addrs: [redis:6379]}\n" +
		"routes:\n  - {name: c, match: POST /c, key: {json: id}}\n"
	if _, err := Parse([]byte(y)); err == nil || !strings.Contains(err.Error(), "store: the section is empty") {
		t.Errorf("store with nothing under it: err = %v, want it reported", err)
	}
}

func TestListenersAndHostKey(t *testing.T) {
	base := "upstream: http://127.0.0.1:9000\nroutes:\n  - {name: c, match: POST /c, key: {json: id}}\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"same address", "listen: 127.0.0.1:8080\nadmin: {listen: 127.0.0.1:8080}\n" + base, "admin.listen"},
		{"wildcard admin", "listen: 127.0.0.1:8080\nadmin: {listen: ':8080'}\n" + base, "admin.listen"},
		{"wildcard proxy", "listen: 0.0.0.0:9091\nadmin: {listen: 127.0.0.1:9091}\n" + base, "admin.listen"},
		{"Host as key", "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nroutes:\n  - {name: c, match: POST /c, key: {header: host}}\n", "routes[0].key.header: Host"},
		{"different ports", "listen: 127.0.0.1:8080\nadmin: {listen: ':9091'}\n" + base, ""},
		{"both on port 0", "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\n" + base, ""},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.yaml))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.want)
		}
	}
}

// TestKeyspaces: a route's keyspace is its name unless set; routes share
// one when their keys are made alike (header names in any case), and the
// recipe says how, in words.
func TestKeyspaces(t *testing.T) {
	c, err := Parse([]byte(head + `  - name: charges-v2
    keyspace: charges
    match: POST /v2/charges
    key: {header: idempotency-key}
    scope: {header: x-api-key}
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    scope: {header: X-Api-Key}
  - name: orders
    match: POST /orders/{id}
    key: {parts: [{path: id}, {json: line}], normalize: nfc}
`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ keyspace, recipe string }{
		{"charges", "header Idempotency-Key; scope header X-Api-Key; normalize none"},
		{"charges", "header Idempotency-Key; scope header X-Api-Key; normalize none"},
		{"orders", "parts(path id, json line); scope none; normalize nfc"},
	} {
		r := c.Routes[i]
		if r.Keyspace != want.keyspace || r.KeyRecipe() != want.recipe {
			t.Errorf("routes[%d] (%s): keyspace %q, recipe %q; want %q, %q", i, r.Name, r.Keyspace, r.KeyRecipe(), want.keyspace, want.recipe)
		}
	}
}
