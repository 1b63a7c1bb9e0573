package badger_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store/badger"
)

// TestOpenOptions: Open applies no defaults of its own (package config
// does): an Options it cannot use is refused with an error that names the
// field, and nothing is created.
func TestOpenOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    func(dir string) badger.Options
		wantErr string
	}{
		{"no directory", func(string) badger.Options { return badger.Options{} }, "a data directory is required"},
		{"negative gc interval", func(dir string) badger.Options { return badger.Options{Dir: dir, GCInterval: -time.Minute} },
			"gc interval -1m0s is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := tt.opts(dir)
			s, err := badger.Open(opts)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%+v) succeeded, want an error containing %q", opts, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Open(%+v) = %v, want an error containing %q", opts, err, tt.wantErr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("the refused Open left %d files in the directory", len(entries))
			}
		})
	}
}
