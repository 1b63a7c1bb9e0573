package pgtest_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
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

// TestStandbyFollowsAndPromotes: a standby receives the primary's rows, is
// read-only until promoted, and takes writes after.
func TestStandbyFollowsAndPromotes(t *testing.T) {
	primary := pgtest.Start(t)
	primary.MustExec("CREATE TABLE t (k text PRIMARY KEY)")
	standby := pgtest.StartStandby(t, primary)
	if got := standby.MustExec("SELECT pg_is_in_recovery()"); got != "t" {
		t.Errorf("standby in recovery = %q; want t", got)
	}
	primary.MustExec("INSERT INTO t VALUES ('replicated')")
	for deadline := time.Now().Add(30 * time.Second); standby.MustExec("SELECT count(*) FROM t") != "1"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the row never reached the standby")
		}
	}
	if got := primary.MustExec("SELECT application_name FROM pg_stat_replication"); got != pgtest.ApplicationName {
		t.Errorf("the primary's replication client = %q; want %q", got, pgtest.ApplicationName)
	}
	if _, err := standby.Exec("INSERT INTO t VALUES ('refused')"); err == nil {
		t.Error("the standby took a write before its promotion")
	}
	primary.Kill()
	standby.Promote()
	if got := standby.MustExec("SELECT pg_is_in_recovery()"); got != "f" {
		t.Errorf("promoted standby in recovery = %q; want f", got)
	}
	standby.MustExec("INSERT INTO t VALUES ('after')")
}
