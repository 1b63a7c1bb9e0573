package pgtest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestRowsSurviveStopAndKill writes a row, stops the server cleanly, starts
// it, kills it with SIGKILL, starts it again (crash recovery) and finds the
// row each time on the same port: the restart tests of the store rely on it.
func TestRowsSurviveStopAndKill(t *testing.T) {
	s := pgtest.Start(t)
	port := s.Port()
	s.MustExec("CREATE TABLE t (k text PRIMARY KEY); INSERT INTO t VALUES ('kept')")

	steps := []struct {
		name string
		down func()
	}{
		{"stop", s.Stop},
		{"kill", s.Kill},
	}
	for _, step := range steps {
		step.down()
		if s.PID() != 0 {
			t.Fatalf("after %s: PID() = %d; want 0 for a server that is down", step.name, s.PID())
		}
		if _, err := s.Exec("SELECT 1"); err == nil {
			t.Fatalf("after %s: a query succeeded; want the server down", step.name)
		}
		s.Start()
		if s.Port() != port {
			t.Errorf("after %s and Start: port = %d; want the same port %d", step.name, s.Port(), port)
		}
		if got := s.MustExec("SELECT k FROM t"); got != "kept" {
			t.Errorf("after %s and Start: rows = %q; want %q", step.name, got, "kept")
		}
	}
}

// TestServerUserAndCleanup checks that the server does not run as root (it
// refuses to) and that its files are gone when the test ends.
func TestServerUserAndCleanup(t *testing.T) {
	var dir string
	t.Run("server", func(t *testing.T) {
		s := pgtest.Start(t)
		dir = s.Dir()
		if got := s.MustExec("SELECT current_user"); got != pgtest.User {
			t.Errorf("current_user = %q; want %q", got, pgtest.User)
		}
		if got := s.MustExec("SHOW fsync"); got != "off" {
			t.Errorf("fsync = %q; want off by default", got)
		}
		if !strings.Contains(s.DSN(), "127.0.0.1") {
			t.Errorf("DSN() = %q; want a loopback address", s.DSN())
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data directory %s after the test: stat error %v; want it removed", dir, err)
	}
}

// TestSettingsOverrideDefaults passes fsync=on and finds it in effect.
func TestSettingsOverrideDefaults(t *testing.T) {
	s := pgtest.Start(t, "fsync=on")
	if got := s.MustExec("SHOW fsync"); got != "on" {
		t.Errorf("fsync = %q; want on", got)
	}
}
