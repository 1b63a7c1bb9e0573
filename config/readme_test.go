package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// readmeYAML returns the README's yaml blocks: the configuration reference
// (the first block under "## Configuration") and the Redis store's block
// (the first under "## A shared store for replicas").
func readmeYAML(t *testing.T) (reference, redis string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(section string) string {
		_, rest, ok := strings.Cut(string(b), "\n"+section)
		if !ok {
			t.Fatalf("the README has no section %q", section)
		}
		_, rest, ok = strings.Cut(rest, "```yaml\n")
		if !ok {
			t.Fatalf("the README's section %q has no yaml block", section)
		}
		y, _, _ := strings.Cut(rest, "```")
		return y
	}
	return block("## Configuration"), block("## A shared store for replicas")
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
// in the README's configuration reference or its Redis block.
func TestREADMEDocumentsEveryField(t *testing.T) {
	ref, redis := readmeYAML(t)
	fields := map[string]string{}
	fieldPaths(reflect.TypeFor[Config](), "", fields)
	for name, path := range fields {
		re := regexp.MustCompile(`(?m)[\s{\[#]` + regexp.QuoteMeta(name) + `:`)
		if !re.MatchString(ref) && !re.MatchString(redis) {
			t.Errorf("%s is not in the README's configuration reference", path)
		}
	}
}

// TestREADMEReferenceLoadsWithDocumentedDefaults: the README's configuration
// reference is a valid file, and every value it gives a field whose comment
// does not say otherwise is that field's default.
func TestREADMEReferenceLoadsWithDocumentedDefaults(t *testing.T) {
	ref, redisBlock := readmeYAML(t)
	t.Setenv("IDEMPROXY_REDIS_PASSWORD", "x") // the Redis block's password_env
	c, err := Parse([]byte(ref))
	if err != nil {
		t.Fatalf("the README's configuration reference does not load: %v", err)
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
		t.Errorf("server: the README's reference gives %+v, the defaults are %+v", c.Server, d.Server)
	}
	if c.Admin.TokenEnv != d.Admin.TokenEnv || c.Admin.Pprof != d.Admin.Pprof {
		t.Errorf("admin: the README's reference gives %+v, the defaults are %+v", c.Admin, d.Admin)
	}
	if !reflect.DeepEqual(c.Store, d.Store) {
		t.Errorf("store.badger: the README's reference gives %+v, the defaults are %+v", *c.Store.Badger, *d.Store.Badger)
	}
	if c.MemoryLimit != d.MemoryLimit {
		t.Errorf("memory_limit: the README's reference gives %d, the default is %d", c.MemoryLimit, d.MemoryLimit)
	}
	// The route's fields that show an example rather than the default.
	got, want := c.Routes[0], d.Routes[0]
	got.Key, got.ReleaseStatuses, got.Fingerprint, got.Scope = want.Key, want.ReleaseStatuses, want.Fingerprint, want.Scope
	if !reflect.DeepEqual(got, want) {
		t.Errorf("routes[0]: the README's reference gives\n%+v\nthe defaults are\n%+v", got, want)
	}

	r, err := Parse([]byte(`listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
routes: [{name: charges, match: POST /charges, key: {json: orderId}}]
` + redisBlock))
	if err != nil {
		t.Fatalf("the README's Redis block does not load: %v", err)
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
		t.Errorf("store.redis: the README's block gives %+v, the defaults are %+v", gr, wr)
	}
}
