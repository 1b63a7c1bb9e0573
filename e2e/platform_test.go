package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/freeport"
)

// pickPorts returns n free loopback ports.
func pickPorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := freeport.Pick(0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

// TestListenAndUpstreamFromFlagsAndEnvironment: -listen, -admin-listen and
// -upstream and their IDEMPROXY_* variables take the place of the file's
// values, a flag before its variable; the start log says where each came
// from, and -check honours them.
func TestListenAndUpstreamFromFlagsAndEnvironment(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	ports := pickPorts(t, 3)
	// The file's upstream answers nothing and its ports are the example's:
	// only the overrides make the proxy work.
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:%d
upstream: http://127.0.0.1:1
admin:
  listen: 127.0.0.1:%d
store:
  badger:
    dir: %s
routes:
%s`, ports[2], ports[2], filepath.Join(dir, "data"), chargesRoute)), 0o600)
	listen := fmt.Sprintf("127.0.0.1:%d", ports[0])
	adminListen := fmt.Sprintf("127.0.0.1:%d", ports[1])

	p := startCmd(t, exec.Command(bin, "-config", cfg, "-listen", listen),
		"IDEMPROXY_LISTEN=127.0.0.1:0", // the flag wins over the variable
		"IDEMPROXY_ADMIN_LISTEN="+adminListen, "IDEMPROXY_UPSTREAM="+up.URL)
	if p.addr != listen || p.admin != adminListen {
		t.Errorf("listening on %s, admin on %s; want %s (-listen) and %s ($IDEMPROXY_ADMIN_LISTEN)", p.addr, p.admin, listen, adminListen)
	}
	if r := charge(p, "ORD-F1"); r.status != 201 {
		t.Errorf("charge through $IDEMPROXY_UPSTREAM = %d %s %v, want 201", r.status, r.body, r.err)
	}
	start := p.log.logLines("idemproxy starting")
	if len(start) != 1 {
		t.Fatalf("start log lines = %d, want 1:\n%s", len(start), p.log)
	}
	for k, want := range map[string]string{
		"listen": listen, "listen_from": "-listen",
		"admin_listen": adminListen, "admin_listen_from": "$IDEMPROXY_ADMIN_LISTEN",
		"upstream": up.URL, "upstream_from": "$IDEMPROXY_UPSTREAM",
	} {
		if got := start[0][k]; got != want {
			t.Errorf("start log %s = %v, want %q", k, got, want)
		}
	}

	checks := []struct {
		name     string
		args     []string
		env      []string
		wantCode int
		want     string
	}{
		{"the file alone: its listen and admin.listen share a port", []string{"-config", cfg, "-check"}, nil, 1,
			"admin.listen:"},
		{"overridden", []string{"-config", cfg, "-check", "-admin-listen", adminListen},
			[]string{"IDEMPROXY_UPSTREAM=" + up.URL}, 0,
			"ok (1 routes) with admin.listen=" + adminListen + " (-admin-listen), upstream=" + up.URL + " ($IDEMPROXY_UPSTREAM)"},
		{"a bad override is named with where it came from", []string{"-config", cfg, "-check", "-listen", "nowhere"},
			[]string{"IDEMPROXY_ADMIN_LISTEN=" + adminListen}, 1, `listen (from -listen): "nowhere" is not a host:port address`},
		{"a bad variable", []string{"-config", cfg, "-check"},
			[]string{"IDEMPROXY_ADMIN_LISTEN=" + adminListen, "IDEMPROXY_UPSTREAM=ftp://x"}, 1, `upstream (from $IDEMPROXY_UPSTREAM): "ftp://x"`},
	}
	for _, tt := range checks {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			cmd := exec.Command(bin, tt.args...)
			cmd.Env = append(os.Environ(), tt.env...)
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.Run()
			if got := cmd.ProcessState.ExitCode(); got != tt.wantCode || !strings.Contains(out.String(), tt.want) {
				t.Errorf("exit %d, output:\n%s\nwant exit %d and %q", got, out.String(), tt.wantCode, tt.want)
			}
		})
	}
}

// TestReloadCommand: idemproxy reload applies the file through the admin
// API with the token from the environment; a file that does not load
// exits 1 saying why, a missing token 2.
func TestReloadCommand(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	data := filepath.Join(dir, "data")
	writeConfig(t, path, up.URL, data, "", chargesRoute)
	const token = "reload-command-token"
	p := startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)
	env := []string{"IDEMPROXY_ADMIN_TOKEN=" + token, "IDEMPROXY_ADMIN_URL=" + p.adminURL("")}

	writeConfig(t, path, up.URL, data, "", chargesRoute+"    duplicate: reject\n")
	if out, errOut, code := runBin(t, env, "reload"); code != 0 || strings.TrimSpace(out) != "reloaded" {
		t.Errorf("reload = exit %d, %q %q; want 0, reloaded", code, out, errOut)
	}
	charge(p, "ORD-R1")
	if r := charge(p, "ORD-R1"); r.status != 409 {
		t.Errorf("duplicate after the reload = %d %s, want 409 (duplicate: reject applied)", r.status, r.body)
	}
	if l := p.log.logLines("configuration reloaded"); len(l) != 1 || l[0]["trigger"] != "api" {
		t.Errorf("reload log lines = %v, want one, trigger api", l)
	}

	os.WriteFile(path, []byte("listen: [\n"), 0o600)
	if _, errOut, code := runBin(t, env, "reload"); code != 1 || !strings.Contains(errOut, "running configuration is kept") {
		t.Errorf("reload of a broken file = exit %d, %q; want 1 and the running configuration kept", code, errOut)
	}
	if _, errOut, code := runBin(t, []string{"IDEMPROXY_ADMIN_TOKEN=", "IDEMPROXY_ADMIN_URL=" + p.adminURL("")}, "reload"); code != 2 ||
		!strings.Contains(errOut, "IDEMPROXY_ADMIN_TOKEN is not set") {
		t.Errorf("reload without a token = exit %d, %q; want 2 naming the variable", code, errOut)
	}
	if _, errOut, code := runBin(t, []string{"IDEMPROXY_ADMIN_TOKEN=wrong", "IDEMPROXY_ADMIN_URL=" + p.adminURL("")}, "reload"); code != 1 ||
		!strings.Contains(errOut, "401") {
		t.Errorf("reload with a wrong token = exit %d, %q; want 1 and the 401", code, errOut)
	}
}

// configMapDir lays out dir as the kubelet lays out a ConfigMap volume:
// the file is a symlink to ..data/config.yaml, ..data a symlink to a
// timestamped directory holding the content. It returns the function
// that publishes new content as the kubelet does: a new timestamped
// directory, a ..data_tmp symlink to it renamed over ..data (atomic),
// then the old directory removed.
func configMapDir(t *testing.T, dir, content string) (publish func(content string)) {
	t.Helper()
	n := 0
	write := func(content string) string {
		n++
		ts := fmt.Sprintf("..2026_12_07_15_%02d_00.%09d", n, n)
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ts, "config.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	current := write(content)
	if err := os.Symlink(current, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	return func(content string) {
		next := write(content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(next, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, current)); err != nil {
			t.Fatal(err)
		}
		current = next
	}
}

// TestConfigWatchAppliesAConfigMapSwap: with config.watch, a ConfigMap
// update (the kubelet's symlink swap) is applied as a reload, with the
// flags' and variables' overrides still in place; a broken file keeps the
// running configuration, logged and counted once.
func TestConfigWatchAppliesAConfigMapSwap(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	vol := filepath.Join(dir, "configmap")
	os.Mkdir(vol, 0o755)
	// The file's upstream answers nothing: $IDEMPROXY_UPSTREAM, kept by
	// every reload, is the stub.
	file := func(route string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
upstream: http://127.0.0.1:1
admin:
  listen: 127.0.0.1:0
store:
  badger:
    dir: %s
config:
  watch: true
routes:
%s`, filepath.Join(dir, "data"), route)
	}
	publish := configMapDir(t, vol, file(chargesRoute))
	p := startCmd(t, exec.Command(bin, "-config", filepath.Join(vol, "config.yaml"), "-listen", "127.0.0.1:0"),
		"IDEMPROXY_UPSTREAM="+up.URL)
	if r := charge(p, "ORD-W1"); r.status != 201 {
		t.Fatalf("first charge = %d %s %v", r.status, r.body, r.err)
	}
	if r := charge(p, "ORD-W1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate before the swap = %d %s, want the replay", r.status, r.body)
	}

	publish(file(chargesRoute + "    duplicate: reject\n"))
	eventually(t, "the swapped ConfigMap is applied", func() bool {
		return len(p.log.logLines("configuration reloaded")) == 1
	})
	if l := p.log.logLines("configuration reloaded"); l[0]["trigger"] != "watch" {
		t.Errorf("reload log = %v, want trigger watch", l[0])
	}
	if r := charge(p, "ORD-W1"); r.status != 409 {
		t.Errorf("duplicate after the swap = %d %s, want 409 (duplicate: reject)", r.status, r.body)
	}
	if r := charge(p, "ORD-W2"); r.status != 201 {
		t.Errorf("new order after the swap = %d %s, want 201 through $IDEMPROXY_UPSTREAM", r.status, r.body)
	}

	publish("listen: [\n")
	eventually(t, "the broken ConfigMap is refused", func() bool {
		return len(p.log.logLines("configuration reload failed; the running configuration is kept")) == 1
	})
	time.Sleep(3 * config.WatchInterval) // the same broken content: not reloaded again
	if n := len(p.log.logLines("configuration reload failed; the running configuration is kept")); n != 1 {
		t.Errorf("the broken file was reported %d times, want once", n)
	}
	if got := scrapeValue(t, p, `idemproxy_config_reloads_total{result="failed",trigger="watch"}`); got != 1 {
		t.Errorf("failed watch reloads = %v, want 1", got)
	}
	if got := scrapeValue(t, p, `idemproxy_config_last_reload_successful`); got != 0 {
		t.Errorf("last_reload_successful = %v, want 0", got)
	}
	if r := charge(p, "ORD-W2"); r.status != 409 {
		t.Errorf("duplicate under the kept configuration = %d %s, want 409", r.status, r.body)
	}

	publish(file(chargesRoute))
	eventually(t, "the mended ConfigMap is applied", func() bool {
		return len(p.log.logLines("configuration reloaded")) == 2
	})
	if r := charge(p, "ORD-W2"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("duplicate after the mend = %d %s, want the replay", r.status, r.body)
	}
}
