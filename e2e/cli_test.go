package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app/buildinfo"
)

// gitCmd runs git in dir with a fixed identity and fails the test on an
// error; it returns git's output.
func gitCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestVersionNamesTheCommit: a binary built with go build in a git
// checkout prints the commit of HEAD and its date, and says when it was
// built with uncommitted changes; built with -buildvcs=false in the same
// checkout, it says only that the build carried no VCS stamp. The sources
// are copied to a fresh repository: the Go tool stamps a checkout's commit
// only where .git is a directory (not in a git worktree), and the
// environment may set -buildvcs=false.
//
// It builds as the Dockerfile does (CGO_ENABLED=0, -trimpath), which
// stamps the commit as any go build does: without a path of the copy in
// them, the module's packages are the ones the static build
// (TestDockerfileBuildsAStaticBinary) compiled, taken from the build
// cache, where a plain go build in a fresh directory compiles them all
// again (about 30 s on two idle cores).
func TestVersionNamesTheCommit(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	files := strings.Split(gitCmd(t, ".", "ls-files", "-co", "--exclude-standard"), "\n")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitCmd(t, src, "init", "-q")
	gitCmd(t, src, "add", ".")
	gitCmd(t, src, "commit", "-q", "-m", "test")
	head := gitCmd(t, src, "rev-parse", "HEAD")
	date := gitCmd(t, src, "show", "-s", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "HEAD")

	build := func(buildvcs string) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "idemproxy")
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs="+buildvcs, "-o", out, ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOFLAGS=", "TZ=UTC", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		v, err := exec.Command(out, "-version").Output()
		if err != nil {
			t.Fatalf("-version: %v", err)
		}
		return string(v)
	}
	got := build("true")
	lines := strings.Split(got, "\n")
	if !strings.HasPrefix(lines[0], "idemproxy v0.0.0-") || !strings.HasSuffix(lines[0], head[:12]) {
		t.Errorf("first line = %q, want idemproxy and the pseudo-version of commit %s", lines[0], head[:12])
	}
	if want := "commit:  " + head + "\n"; !strings.Contains(got, want) {
		t.Errorf("-version =\n%s\nwant %q", got, want)
	}
	if want := "date:    " + date; !strings.Contains(got, want) {
		t.Errorf("-version =\n%s\nwant %q", got, want)
	}
	if strings.Contains(got, "uncommitted") {
		t.Errorf("-version of a clean checkout =\n%s\nwant no uncommitted changes", got)
	}

	if err := os.WriteFile(filepath.Join(src, "main.go"), append(must(os.ReadFile(filepath.Join(src, "main.go"))), "\n// changed\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := build("true"); !strings.Contains(got, "commit:  "+head+" (with uncommitted changes)") {
		t.Errorf("-version with a changed file =\n%s\nwant the commit with uncommitted changes", got)
	}
	got = build("false")
	if want := "commit:  " + buildinfo.NoCommit + "\n"; !strings.Contains(got, want) || strings.Contains(got, "date:") {
		t.Errorf("-version built with -buildvcs=false in a checkout =\n%s\nwant %q and no date", got, want)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestHelp: -h starts with what the binary does, then an example, where
// the example configuration is, and the flags and subcommands.
func TestHelp(t *testing.T) {
	t.Parallel()
	out, errOut, code := runBin(t, nil, "-h")
	help := out + errOut
	if code != 0 {
		t.Errorf("-h = exit %d, want 0", code)
	}
	if !strings.HasPrefix(help, "idemproxy is a sidecar reverse proxy that makes an HTTP service idempotent") {
		t.Errorf("-h starts with %q, want what the binary does", help[:min(len(help), 80)])
	}
	order := []string{"Examples:", "idemproxy -config config.yaml", "config.example.yaml", "keys list", "-check", "-config", "-version"}
	at := 0
	for _, w := range order {
		i := strings.Index(help[at:], w)
		if i < 0 {
			t.Fatalf("-h does not show %q after the earlier parts:\n%s", w, help)
		}
		at += i
	}
}

// TestConfigPath: the configuration path comes from -config, then
// IDEMPROXY_CONFIG, then ./config.yaml; a missing file points to
// config.example.yaml.
func TestConfigPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"flag.yaml", "env.yaml", "config.yaml"} {
		writeConfig(t, filepath.Join(dir, name), "http://127.0.0.1:9000", filepath.Join(dir, "data"), "", chargesRoute)
	}
	tests := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		want     []string
	}{
		{"flag first", []string{config.DefaultAdminTokenEnv + "=x", "IDEMPROXY_CONFIG=env.yaml"}, []string{"-config", "flag.yaml", "-check"}, 0, []string{"flag.yaml: ok"}},
		{"then the environment", []string{"IDEMPROXY_CONFIG=env.yaml"}, []string{"-check"}, 0, []string{"env.yaml: ok"}},
		{"then ./config.yaml", nil, []string{"-check"}, 0, []string{"config.yaml: ok"}},
		{"missing from the flag", nil, []string{"-config", "nope.yaml", "-check"}, 1, []string{
			"nope.yaml: read config: open nope.yaml: no such file", "comes from -config", "config.example.yaml"}},
		{"missing from the environment", []string{"IDEMPROXY_CONFIG=nope.yaml"}, []string{"-check"}, 1, []string{
			"comes from $IDEMPROXY_CONFIG", "config.example.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			cmd.Dir = dir
			cmd.Env = append(cleanEnv(), tt.env...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tt.wantCode {
				t.Errorf("exit %d, want %d:\n%s", code, tt.wantCode, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
	// Without any configuration, the default is missing and the message
	// says how to start.
	empty := t.TempDir()
	cmd := exec.Command(bin)
	cmd.Dir = empty
	cmd.Env = cleanEnv()
	out, _ := cmd.CombinedOutput()
	for _, w := range []string{"config.yaml: read config", "neither -config nor $IDEMPROXY_CONFIG is set", "config.example.yaml", "-config"} {
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), w) {
			t.Errorf("bare idemproxy = exit %d:\n%s\nwant 1 and %q", cmd.ProcessState.ExitCode(), out, w)
		}
	}
}

// TestStartAndStopLogLines: the first log line names the version, the
// store and where it is, and the routes; a stop on a signal logs the
// signal and "idemproxy stopped" with exit 0, a fatal error logs
// "idemproxy failed" with exit 1 and never "idemproxy stopped".
func TestStartAndStopLogLines(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	routes := chargesRoute + "  - name: refunds\n    match: POST /refunds\n    key: {header: Idempotency-Key}\n"
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, data, "", routes)
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatalf("-version: %v", err)
	}
	version := strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "idemproxy ")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p := startProxy(t, cfg)
		p.signal(sig)
		if code := p.wait(); code != 0 {
			t.Errorf("exit after %v = %d, want 0", sig, code)
		}
		first := strings.SplitN(p.log.String(), "\n", 2)[0]
		var m map[string]any
		if err := json.Unmarshal([]byte(first), &m); err != nil {
			t.Fatalf("first log line %q: %v", first, err)
		}
		keys := orderedKeys(t, first)
		if m["msg"] != "idemproxy starting" || m["version"] != version || m["store"] != "badger" || m["badger_dir"] != data ||
			!equalAny(m["routes"], []string{"charges", "refunds"}) {
			t.Errorf("first log line = %s, want idemproxy starting with version, store badger, its directory and the routes", first)
		}
		if i, j, k := indexOf(keys, "version"), indexOf(keys, "store"), indexOf(keys, "routes"); !(i >= 0 && i < j && j < k) {
			t.Errorf("first log line's fields = %v, want version, then store, then routes", keys)
		}
		name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}[sig]
		if l := p.log.logLines("shutting down"); len(l) != 1 || l[0]["signal"] != name {
			t.Errorf("shutting down lines = %v, want one naming %s", l, name)
		}
		if l := p.log.logLines("idemproxy stopped"); len(l) != 1 || l[0]["level"] != "INFO" || l[0]["signal"] != name {
			t.Errorf("stopped lines = %v, want one at INFO naming %s", l, name)
		}
		if l := p.log.logLines("idemproxy failed"); len(l) != 0 {
			t.Errorf("a clean stop logged %v", l)
		}
	}

	// A fatal error: the admin address is taken.
	p := startProxy(t, cfg)
	taken := writeConfig(t, filepath.Join(dir, "taken.yaml"), up.URL, filepath.Join(dir, "data2"), "", routes)
	b := must(os.ReadFile(taken))
	os.WriteFile(taken, []byte(strings.Replace(string(b), "admin:\n  listen: 127.0.0.1:0", "admin:\n  listen: "+p.addr, 1)), 0o600)
	var logs syncBuffer
	cmd := exec.Command(bin, "-config", taken)
	cmd.Env, cmd.Stderr = cleanEnv(), &logs
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit on a fatal error = %d, want 1\n%s", code, logs.String())
	}
	if l := logs.logLines("idemproxy failed"); len(l) != 1 || l[0]["level"] != "ERROR" || !strings.Contains(l[0]["err"].(string), "admin listen") {
		t.Errorf("failed lines = %v, want one ERROR with the error\n%s", l, logs.String())
	}
	if l := logs.logLines("idemproxy stopped"); len(l) != 0 {
		t.Errorf("a fatal error logged %v", l)
	}
}

// orderedKeys returns the names of a JSON object's fields in order.
func orderedKeys(t *testing.T, line string) []string {
	dec := json.NewDecoder(strings.NewReader(line))
	dec.Token() // {
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func indexOf(s []string, v string) int {
	for i, e := range s {
		if e == v {
			return i
		}
	}
	return -1
}

func equalAny(v any, want []string) bool {
	l, ok := v.([]any)
	if !ok || len(l) != len(want) {
		return false
	}
	for i := range l {
		if l[i] != want[i] {
			return false
		}
	}
	return true
}
