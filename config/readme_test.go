package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The pages whose configuration the tests below keep in step with the
// code.
const (
	configurationDoc = "../docs/configuration.md"
	redisDoc         = "../docs/redis.md"
)

// docYAML returns the first yaml block under the Markdown file's section.
func docYAML(t *testing.T, file, section string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+section+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", file, section)
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	if !ok {
		t.Fatalf("%s: the section %q has no yaml block", file, section)
	}
	y, _, _ := strings.Cut(rest, "```")
	return y
}

// readmeYAML returns the documented yaml blocks: the configuration
// reference (docs/configuration.md, "## Reference") and the Redis store's
// block (docs/redis.md, "## Configuration").
func readmeYAML(t *testing.T) (reference, redis string) {
	t.Helper()
	return docYAML(t, configurationDoc, "## Reference"), docYAML(t, redisDoc, "## Configuration")
}

// fieldPaths lists the yaml names of every field of t, nested structs,
// pointers and slices of structs included.
func fieldPaths(t reflect.Type, prefix string, out map[string]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		if _, seen := out[name]; !seen || len(path) < len(out[name]) {
			out[name] = path
		}
		if f.Type != reflect.TypeFor[Duration]() && f.Type != reflect.TypeFor[[]Key]() { // parts nest Keys
			fieldPaths(f.Type, path+".", out)
		}
	}
}

// TestREADMEDocumentsEveryField: every field of the configuration appears
// in the configuration reference (docs/configuration.md) or the Redis block
// (docs/redis.md).
func TestREADMEDocumentsEveryField(t *testing.T) {
	ref, redis := readmeYAML(t)
	fields := map[string]string{}
	fieldPaths(reflect.TypeFor[Config](), "", fields)
	for name, path := range fields {
		re := regexp.MustCompile(`(?m)[\s{\[#]` + regexp.QuoteMeta(name) + `:`)
		if !re.MatchString(ref) && !re.MatchString(redis) {
			t.Errorf("%s is not in the configuration reference", path)
		}
	}
}

// TestREADMEReferenceLoadsWithDocumentedDefaults: the configuration
// reference of docs/configuration.md is a valid file, and every value it gives a field whose comment
// does not say otherwise is that field's default.
func TestREADMEReferenceLoadsWithDocumentedDefaults(t *testing.T) {
	ref, redisBlock := readmeYAML(t)
	t.Setenv("IDEMPROXY_REDIS_PASSWORD", "x") // the Redis block's password_env
	c, err := Parse([]byte(ref))
	if err != nil {
		t.Fatalf("the configuration reference does not load: %v", err)
	}
	// The same file with only what is required, for its defaults.
	d, err := Parse([]byte(`listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes:
  - name: charges
    match: POST /charges
    key: {json: orderId}
    reconcile: {lookup: "GET /orders/{key}/charge"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != d.Server {
		t.Errorf("server: the documented reference gives %+v, the defaults are %+v", c.Server, d.Server)
	}
	if c.Admin.TokenEnv != d.Admin.TokenEnv || c.Admin.Pprof != d.Admin.Pprof {
		t.Errorf("admin: the documented reference gives %+v, the defaults are %+v", c.Admin, d.Admin)
	}
	if !reflect.DeepEqual(c.Store, d.Store) {
		t.Errorf("store.badger: the documented reference gives %+v, the defaults are %+v", *c.Store.Badger, *d.Store.Badger)
	}
	if c.MemoryLimit != d.MemoryLimit {
		t.Errorf("memory_limit: the documented reference gives %d, the default is %d", c.MemoryLimit, d.MemoryLimit)
	}
	// The route's fields that show an example rather than the default.
	got, want := c.Routes[0], d.Routes[0]
	got.Key, got.ReleaseStatuses, got.Fingerprint, got.Scope = want.Key, want.ReleaseStatuses, want.Fingerprint, want.Scope
	if !reflect.DeepEqual(got, want) {
		t.Errorf("routes[0]: the documented reference gives\n%+v\nthe defaults are\n%+v", got, want)
	}

	r, err := Parse([]byte(`listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes: [{name: charges, match: POST /charges, key: {json: orderId}}]
` + redisBlock))
	if err != nil {
		t.Fatalf("the Redis block of docs/redis.md does not load: %v", err)
	}
	dr, err := Parse([]byte(`listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes: [{name: charges, match: POST /charges, key: {json: orderId}}]
store: {redis: {addrs: [redis:6379]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	gr, wr := *r.Store.Redis, *dr.Store.Redis
	gr.PasswordEnv = "" // an example: no password by default
	if !reflect.DeepEqual(gr, wr) {
		t.Errorf("store.redis: the Redis block of docs/redis.md gives %+v, the defaults are %+v", gr, wr)
	}
}

// fullFieldPaths lists the yaml path of every field of t, as the table of
// docs/configuration.md writes it: routes[].key.json, store.redis.addrs.
func fullFieldPaths(t reflect.Type, prefix string, out map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeFor[Duration]() || ft == reflect.TypeFor[[]Key]():
			out[path] = true
		case ft.Kind() == reflect.Struct:
			fullFieldPaths(ft, path+".", out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			fullFieldPaths(ft.Elem(), path+"[].", out)
		default:
			out[path] = true
		}
	}
}

// TestConfigurationTableListsEveryField: the table "Every field" of
// docs/configuration.md has a row, with its type, default and what applies
// it, for every field of the configuration, and none for a field that does
// not exist.
func TestConfigurationTableListsEveryField(t *testing.T) {
	b, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Every field\n")
	if !ok {
		t.Fatalf("%s has no section %q", configurationDoc, "## Every field")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	rows := map[string][]string{}
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		path := strings.Trim(strings.TrimSpace(cells[0]), "`")
		rows[path] = cells
	}
	fields := map[string]bool{}
	fullFieldPaths(reflect.TypeFor[Config](), "", fields)
	for f := range fields {
		cells, ok := rows[f]
		switch {
		case !ok:
			t.Errorf("%s: the table has no row for %s", configurationDoc, f)
		case len(cells) != 4:
			t.Errorf("%s: the row for %s has %d cells, want 4 (field, type, default, applied by)", configurationDoc, f, len(cells))
		case !strings.HasPrefix(strings.TrimSpace(cells[3]), "reload") && !strings.HasPrefix(strings.TrimSpace(cells[3]), "restart"):
			t.Errorf("%s: the row for %s says %q is what applies it, want reload or restart", configurationDoc, f, cells[3])
		}
	}
	for path := range rows {
		if !fields[path] {
			t.Errorf("%s: the table has a row for %s, which is not a field", configurationDoc, path)
		}
	}
}

// TestREADMERouteExampleLoads: the routes the README shows under "Configure
// a route" are a valid configuration.
func TestREADMERouteExampleLoads(t *testing.T) {
	routes := docYAML(t, "../README.md", "## Configure a route")
	c, err := Parse([]byte("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\n" + routes))
	if err != nil {
		t.Fatalf("the README's route example does not load: %v", err)
	}
	if got, want := len(c.Routes), 2; got != want {
		t.Errorf("the README's route example has %d routes, want %d", got, want)
	}
	if got, want := c.Routes[1].Key.Header, "Idempotency-Key"; got != want {
		t.Errorf("the README's second route is keyed by header %q, want %q", got, want)
	}
}
