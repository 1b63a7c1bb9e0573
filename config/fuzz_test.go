package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// FuzzParse feeds arbitrary files to the configuration parser: it must
// never panic, and whatever it accepts must validate again and name a
// listen address, an upstream and at least one route. The seed corpus is
// every YAML file in testdata/ plus the repository's example.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	seeds = append(seeds, "../config.example.yaml")
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := config.Parse(b)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Errorf("an empty error for %q", b)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Parse accepted a configuration that Validate rejects: %v", err)
		}
		if cfg.Listen == "" || cfg.Upstream == "" || len(cfg.Routes) == 0 {
			t.Errorf("Parse accepted a configuration without listen, upstream or routes: %+v", cfg)
		}
	})
}
