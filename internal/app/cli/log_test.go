package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
)

// TestLogDurationsAsText: durations in log lines read "30s", not
// 30000000000, in both formats, also inside groups and for the
// configuration's own Duration type.
func TestLogDurationsAsText(t *testing.T) {
	tests := []struct {
		format string
		want   []string
	}{
		{"json", []string{`"timeout":"30s"`, `"drain_delay":"1.5s"`, `"g":{"lease":"35s"}`, `"n":3`}},
		{"text", []string{`timeout=30s`, `drain_delay=1.5s`, `g.lease=35s`, `n=3`}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			var out strings.Builder
			log, err := newLogger(&out, tt.format, "info")
			if err != nil {
				t.Fatal(err)
			}
			log.Info("m", "timeout", 30*time.Second, "drain_delay", config.Duration(1500*time.Millisecond), "n", 3)
			log.WithGroup("g").Info("m", "lease", config.Duration(35*time.Second))
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("log output %q lacks %s", out.String(), w)
				}
			}
			if strings.Contains(out.String(), "30000000000") {
				t.Errorf("a duration logged in nanoseconds: %s", out.String())
			}
		})
	}
}
