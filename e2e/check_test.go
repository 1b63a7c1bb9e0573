package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckNamesLines: -check names the line of every field a problem is
// about, a value found wanting as much as a misspelt field, and tells an
// upstream without a scheme to add one; exit status 1.
func TestCheckNamesLines(t *testing.T) {
	t.Parallel()
	const file = "config/testdata/lines_routes.yaml"
	out, errOut, code := runBin(t, nil, "-config", file, "-check")
	want := "idemproxy: " + file + ": invalid config:\n" +
		`  upstream: "127.0.0.1:9000" is not an absolute http or https URL (add http:// or https://) (line 4)` + "\n" +
		`  routes[0].policy: "sometimes" is not one of reserve-then-commit, release-on-5xx (line 9)` + "\n" +
		`  routes[0].lease: 10s must exceed upstream_timeout (30s), or a slow answer could find its key taken (line 11)` + "\n" +
		`  routes[1].key.json: "items[0]" is not a JSON path of names and indexes separated by dots (order.id, items.0.sku) (line 15)` + "\n" +
		`  routes[1].ttl: 30s must exceed lease (1m0s) (line 17)` + "\n" +
		`  routes[2].key: set exactly one of json, header, query, path or parts (line 18)` + "\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("-check = exit %d, stdout %q, stderr:\n%s\nwant exit 1, stderr:\n%s", code, out, errOut, want)
	}
}

// TestCheckWarnsOfAnUnresolvedUpstream: an upstream host that does not
// resolve passes -check (exit 0: DNS in a container may come later) with
// a warning on stderr; one that resolves, or an address, passes silently.
// .invalid never resolves (RFC 6761).
func TestCheckWarnsOfAnUnresolvedUpstream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name     string
		upstream string
		warning  string // the start of the warning; "" for none
	}{
		{"does not resolve", "http://nonexistent.invalid:9000", `upstream: host "nonexistent.invalid" does not resolve (`},
		{"localhost", "http://localhost:9000", ""},
		{"an address", "http://127.0.0.1:9000", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeConfig(t, filepath.Join(dir, tt.name+".yaml"), tt.upstream, filepath.Join(dir, "data"), "", chargesRoute)
			out, errOut, code := runBin(t, nil, "-config", cfg, "-check")
			if code != 0 || out != cfg+": ok (1 routes)\n" {
				t.Errorf("-check = exit %d, stdout %q, want 0 and ok", code, out)
			}
			switch prefix := "idemproxy: " + cfg + ": warning: " + tt.warning; {
			case tt.warning == "" && errOut != "":
				t.Errorf("stderr = %q, want nothing", errOut)
			case tt.warning != "" && (!strings.HasPrefix(errOut, prefix) || strings.Count(errOut, "\n") != 1):
				t.Errorf("stderr = %q, want one line starting %q", errOut, prefix)
			}
		})
	}
}

// TestStartWarnsOfAnUnresolvedUpstream: the proxy starts with an upstream
// host that does not resolve, and logs the warning -check prints.
func TestStartWarnsOfAnUnresolvedUpstream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), "http://nonexistent.invalid:9000", filepath.Join(dir, "data"), "", chargesRoute))
	eventually(t, "the warning is logged", func() bool { return len(p.log.logLines("a host of the configuration does not resolve")) == 1 })
	l := p.log.logLines("a host of the configuration does not resolve")[0]
	if w, _ := l["warning"].(string); l["level"] != "WARN" || !strings.HasPrefix(w, `upstream: host "nonexistent.invalid" does not resolve (`) {
		t.Errorf("log line = %v, want a WARN naming the upstream's host", l)
	}
}

// TestCheckTracingEnvironment: with tracing.enabled, -check refuses an
// OTEL_* setting the proxy would refuse to start with (exit 1, naming the
// variable); with tracing off, the same environment is no concern of the
// file's.
func TestCheckTracingEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name    string
		tracing string
		env     []string
		problem string // in stderr; "" for ok
	}{
		{"usable", "tracing: {enabled: true}", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.01"}, ""},
		{"http/json", "tracing: {enabled: true}", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, `tracing.enabled: the environment: OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not supported (grpc or http/protobuf)`},
		{"a ratio in percent", "tracing: {enabled: true}", []string{"OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=1%"}, `OTEL_TRACES_SAMPLER_ARG: "1%" is not a ratio between 0 and 1`},
		{"off", "tracing: {enabled: false}", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeConfig(t, filepath.Join(dir, strings.ReplaceAll(tt.name, "/", "-")+".yaml"), "http://127.0.0.1:9000", filepath.Join(dir, "data"), tt.tracing, chargesRoute)
			out, errOut, code := runBin(t, tt.env, "-config", cfg, "-check")
			if tt.problem == "" {
				if code != 0 || out != cfg+": ok (1 routes)\n" || errOut != "" {
					t.Errorf("-check = exit %d, stdout %q, stderr %q; want 0 and ok", code, out, errOut)
				}
				return
			}
			if code != 1 || !strings.Contains(errOut, tt.problem) {
				t.Errorf("-check = exit %d, stderr %q; want 1 and %q", code, errOut, tt.problem)
			}
		})
	}
}
