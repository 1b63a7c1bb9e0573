package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const chargesRoute = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 10s
    lease: 15s
`

func charge(p *proc, order string, hdr ...string) result {
	return do("POST", p.url("/charges"), fmt.Sprintf(`{"orderId": %q, "amount": 10}`, order), hdr...)
}

func problemType(r result) string {
	if i := strings.Index(r.body, `"type":"urn:idemproxy:problem:`); i >= 0 {
		rest := r.body[i+len(`"type":"urn:idemproxy:problem:`):]
		return rest[:strings.IndexByte(rest, '"')]
	}
	return ""
}

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := writeConfig(t, filepath.Join(dir, "good.yaml"), "http://127.0.0.1:9000", dir, "", chargesRoute)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte(`listen: 127.0.0.1:8080
upstream: ftp://nowhere
routes:
  - name: charges
    match: POST /charges
    key: {json: orderId, header: Idempotency-Key}
    policy: sometimes
    lease: 10s
    upstream_timeout: 30s
  - name: charges
    match: POST /charges/{id}
    key: {path: orderId}
`), 0o600)
	creds := writeConfig(t, filepath.Join(dir, "creds.yaml"), "http://127.0.0.1:9000", dir, "", chargesRoute+
		"    scope: {header: X-Tenant}\n    replay_headers: [Content-Type, authorization, COOKIE, X-Api-Key, x-tenant, Connection]\n")
	badTLS := writeConfig(t, filepath.Join(dir, "tls.yaml"), "https://127.0.0.1:9443", dir,
		"upstream_tls: {ca_file: "+filepath.Join(dir, "nope.pem")+", cert_file: "+good+"}", chargesRoute)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"example config", []string{"-config", "config.example.yaml", "-check"}, 0, []string{"ok (2 routes)"}},
		{"credentials in replay_headers", []string{"-config", creds, "-check"}, 1, []string{
			"routes[0].replay_headers[1]: Authorization is never replayed", "routes[0].replay_headers[2]: Cookie is never replayed",
			"routes[0].replay_headers[3]: X-Api-Key is never replayed", "routes[0].replay_headers[4]: X-Tenant is never replayed",
			"routes[0].replay_headers[5]: Connection is never replayed",
		}},
		{"good", []string{"-config", good, "-check"}, 0, []string{"ok (1 routes)"}},
		{"every problem, each with its field", []string{"-config", bad, "-check"}, 1, []string{
			"upstream:", "routes[0].key:", "routes[0].policy:", "routes[0].lease:", "routes[1].name:", "routes[1].key.path:",
		}},
		{"upstream_tls files", []string{"-config", badTLS, "-check"}, 1, []string{
			"upstream_tls.ca_file: open " + filepath.Join(dir, "nope.pem"), "upstream_tls.key_file: required with cert_file",
		}},
		{"missing file", []string{"-config", filepath.Join(dir, "nope.yaml"), "-check"}, 1, []string{"no such file"}},
		{"unknown flag", []string{"-nope"}, 2, []string{"flag provided but not defined"}},
		{"version", []string{"-version"}, 0, []string{"idemproxy "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			cmd := exec.Command(bin, tt.args...)
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.Run()
			if got := cmd.ProcessState.ExitCode(); got != tt.wantCode {
				t.Errorf("exit code = %d, want %d\n%s", got, tt.wantCode, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not mention %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestCrashAndRestart: after kill -9 and a restart on the same data,
// committed answers are still replayed and a request that was in flight is
// in doubt: never forwarded twice.
func TestCrashAndRestart(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	p := startProxy(t, cfg)
	first := charge(p, "ORD-C1")
	if first.status != 201 {
		t.Fatalf("first charge: %d %s %v", first.status, first.body, first.err)
	}
	// ORD-C2 is in flight (the stub charged it and sits on the answer) when
	// the proxy is killed.
	go charge(p, "ORD-C2", "X-Stub-Fault", "delay", "X-Stub-Delay", "3s")
	eventually(t, "ORD-C2 reaches the upstream", func() bool { return chargeCount(t, up.URL, "ORD-C2") == 1 })
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait()

	p2 := startProxy(t, cfg)
	replay := charge(p2, "ORD-C1")
	if replay.status != 201 || replay.header.Get("Idempotent-Replayed") != "true" || replay.body != first.body {
		t.Errorf("committed answer after restart = %d %q (replayed %q), want the first answer replayed",
			replay.status, replay.body, replay.header.Get("Idempotent-Replayed"))
	}
	doubt := charge(p2, "ORD-C2")
	if doubt.status != 409 || problemType(doubt) != "outcome-in-doubt" {
		t.Errorf("in-flight key after restart = %d %s, want 409 outcome-in-doubt", doubt.status, doubt.body)
	}
	time.Sleep(3 * time.Second) // let the stub finish its delayed answer
	for order, want := range map[string]int{"ORD-C1": 1, "ORD-C2": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
	if l := p2.log.logLines("reservations left in flight by the previous process are now in doubt"); len(l) != 1 || l[0]["keys"] != float64(1) {
		t.Errorf("restart did not report the orphaned reservation: %v", l)
	}
}

// TestGracefulShutdown: SIGTERM turns /readyz 503 at once, a request in
// flight finishes, and the exit status is 0.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		"server:\n  drain_delay: 500ms\n  shutdown_timeout: 10s", chargesRoute)
	p := startProxy(t, cfg)
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
		t.Fatalf("readyz before shutdown = %d %s", r.status, r.body)
	}
	inFlight := make(chan result, 1)
	go func() { inFlight <- charge(p, "ORD-G1", "X-Stub-Fault", "delay", "X-Stub-Delay", "1s") }()
	eventually(t, "the charge reaches the upstream", func() bool { return chargeCount(t, up.URL, "ORD-G1") == 1 })
	p.signal(syscall.SIGTERM)
	eventually(t, "readyz turns 503", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 503 })
	if r := do("GET", p.adminURL("/livez"), ""); r.status != 200 {
		t.Errorf("livez during shutdown = %d, want 200", r.status)
	}
	r := <-inFlight
	if r.status != 201 {
		t.Errorf("in-flight request = %d %s %v, want 201", r.status, r.body, r.err)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit code = %d, want 0\n%s", code, p.log)
	}
}

// TestShutdownDeadline: a request still waiting for the upstream when the
// shutdown deadline passes leaves its key in doubt.
func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		"server:\n  shutdown_timeout: 200ms", chargesRoute)
	p := startProxy(t, cfg)
	inFlight := make(chan result, 1)
	go func() { inFlight <- charge(p, "ORD-D1", "X-Stub-Fault", "delay", "X-Stub-Delay", "2s") }()
	eventually(t, "the charge reaches the upstream", func() bool { return chargeCount(t, up.URL, "ORD-D1") == 1 })
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit code = %d, want 0\n%s", code, p.log)
	}
	if r := <-inFlight; r.status == 201 {
		t.Errorf("the cut request got 201; it should have been cut by the deadline")
	}
	p2 := startProxy(t, cfg)
	r := charge(p2, "ORD-D1")
	if r.status != 409 || problemType(r) != "outcome-in-doubt" {
		t.Errorf("retry after restart = %d %s, want 409 outcome-in-doubt", r.status, r.body)
	}
	if got := chargeCount(t, up.URL, "ORD-D1"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestHealthcheckFlag(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	for _, tt := range []struct {
		url  string
		want int
	}{
		{p.adminURL("/livez"), 0},
		{p.adminURL("/nope"), 1},
		{"http://127.0.0.1:1/livez", 1},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bin, "-healthcheck", tt.url)
		cmd.Run()
		cancel()
		if got := cmd.ProcessState.ExitCode(); got != tt.want {
			t.Errorf("-healthcheck %s = %d, want %d", tt.url, got, tt.want)
		}
	}
}
