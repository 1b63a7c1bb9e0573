package app

import (
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestMemoryLimit: the soft memory limit comes from the configuration,
// else GOMEMLIMIT, else the cgroup limit, else the default.
func TestMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	limited := write("limited", "134217728\n")
	unlimited := write("unlimited", "max\n")
	tiny := write("tiny", "8388608\n")
	missing := filepath.Join(dir, "none")
	current := envMemoryLimit
	tests := []struct {
		name       string
		configured int64
		env        string
		cgroup     string
		want       int64
		from       string
	}{
		{"configured wins", 96 << 20, "1GiB", limited, 96 << 20, "memory_limit"},
		{"disabled", -1, "1GiB", limited, math.MaxInt64, "memory_limit: -1 (none)"},
		{"GOMEMLIMIT left to the runtime", 0, "1GiB", limited, current, "GOMEMLIMIT"},
		{"cgroup", 0, "", limited, 128 << 20 / 10 * 8, "80% of the cgroup limit 134217728"},
		{"tiny cgroup", 0, "", tiny, config.MinMemoryLimit, "80% of the cgroup limit 8388608"},
		{"cgroup without limit", 0, "", unlimited, config.DefaultMemoryLimit, "default"},
		{"no cgroup file", 0, "", missing, config.DefaultMemoryLimit, "default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := func(k string) string {
				if k == "GOMEMLIMIT" {
					return tt.env
				}
				return ""
			}
			got, from := memoryLimit(tt.configured, env, tt.cgroup)
			if got != tt.want || from != tt.from {
				t.Errorf("memoryLimit = %d (%s), want %d (%s)", got, from, tt.want, tt.from)
			}
		})
	}
}

// TestMemoryLimitReloadBackToGOMEMLIMIT: a reload that removes
// memory_limit gives the limit back to GOMEMLIMIT, the one the process was
// started with, not to whatever the configuration had set meanwhile.
func TestMemoryLimitReloadBackToGOMEMLIMIT(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	path, data := filepath.Join(dir, "c.yaml"), filepath.Join(dir, "data")
	writeConfig(t, path, up.URL, data, "memory_limit: 104857600", chargesRoute)
	p := startProxy(t, path, "GOMEMLIMIT=314572800") // 300 MiB
	limit := func() string {
		v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "go_gc_gomemlimit_bytes")
		return v
	}
	if got := limit(); got != "1.048576e+08" {
		t.Fatalf("soft limit at start = %s, want memory_limit's 100 MiB", got)
	}
	for i, extra := range []string{"", "memory_limit: -1", ""} {
		writeConfig(t, path, up.URL, data, extra, chargesRoute)
		p.signal(syscall.SIGHUP)
		eventually(t, "the reload", func() bool { return len(p.log.logLines("configuration reloaded")) == i+1 })
		want := "3.145728e+08"
		if extra != "" {
			want = "9.223372036854776e+18"
		}
		if got := limit(); got != want {
			t.Errorf("reload %d (%q): soft limit %s, want %s", i, extra, got, want)
		}
	}
	for _, l := range p.log.logLines("memory limit") {
		t.Logf("memory limit: %v (from %v)", l["soft_limit"], l["from"])
	}
}
