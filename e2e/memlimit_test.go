package e2e

import (
	"path/filepath"
	"syscall"
	"testing"
)

// TestMemoryLimitReloadBackToGOMEMLIMIT: a reload that removes
// memory_limit gives the limit back to GOMEMLIMIT, the one the process was
// started with, not to whatever the configuration had set meanwhile.
func TestMemoryLimitReloadBackToGOMEMLIMIT(t *testing.T) {
	t.Parallel()
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
