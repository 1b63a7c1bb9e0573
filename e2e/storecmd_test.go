package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/app/cli"
	"github.com/idemproxy/idemproxy/store/badger"
)

// TestStoreAcceptLossCommand: the exit statuses of idemproxy store
// accept-loss, and what it writes: the new epoch's ID on stdout, the audit
// line on stderr, the accepted marker in the store.
func TestStoreAcceptLossCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), "http://127.0.0.1:9", data, "", chargesRoute)
	getenv := func(k string) string {
		if k == "USER" {
			return "carol"
		}
		return ""
	}
	cases := []struct {
		name     string
		args     []string
		code     int
		inStderr string
	}{
		{"no subcommand", []string{"store"}, 2, "want the subcommand accept-loss"},
		{"another subcommand", []string{"store", "forget"}, 2, "want the subcommand accept-loss"},
		{"help", []string{"store", "-h"}, 0, "idemproxy store accept-loss -config FILE"},
		{"stray argument", []string{"store", "accept-loss", "-config", cfg, "now"}, 2, "unexpected arguments"},
		{"no such configuration", []string{"store", "accept-loss", "-config", filepath.Join(dir, "none.yaml")}, 1, "none.yaml"},
		{"accepted", []string{"store", "accept-loss", "-config", cfg, "-reason", "disk replaced"}, 0, `"operator":"carol"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Run(context.Background(), c.args, &stdout, &stderr, getenv)
			if code != c.code || !strings.Contains(stderr.String(), c.inStderr) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), c.code, c.inStderr)
			}
			if c.code != 0 || c.name == "help" {
				return
			}
			id := strings.TrimSpace(stdout.String())
			s, err := badger.Open(badger.Options{Dir: data})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			m, err := s.Epoch(context.Background())
			if err != nil || m == nil || m.ID != id || m.State != "accepted" || !strings.Contains(m.Note, "disk replaced") {
				t.Errorf("marker %+v, %v; want the accepted epoch %q printed on stdout", m, err, id)
			}
		})
	}
	// A directory a running proxy holds cannot be opened: 1, naming why.
	startProxy(t, cfg)
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), []string{"store", "accept-loss", "-config", cfg}, &stdout, &stderr, getenv); code != 1 {
		t.Errorf("with the directory held: exit %d, want 1; stderr %s", code, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("with the directory held: stdout %q, want nothing", stdout.String())
	}
}
