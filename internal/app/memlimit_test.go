package app

import (
	"math"
	"os"
	"path/filepath"
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
