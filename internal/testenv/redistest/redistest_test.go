package redistest_test

import (
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

func TestStartStopRestart(t *testing.T) {
	s := redistest.Start(t)
	if got, err := s.Do("PING"); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v; want PONG, nil", got, err)
	}
	// Snapshots on a schedule no test reaches: persistence for the
	// proxy's settings check, nothing on disk for a Restart.
	if got, err := s.Do("CONFIG", "GET", "save"); err != nil || got != "save\n86400 1" {
		t.Errorf("CONFIG GET save = %q, %v; want 86400 1", got, err)
	}
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatalf("SET: %v", err)
	}
	addr := s.Addr()

	s.Stop()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING after Stop succeeded; want an error")
	}
	s.Stop() // stopping twice is harmless

	s.Restart()
	if s.Addr() != addr {
		t.Errorf("Addr after Restart = %s, want %s", s.Addr(), addr)
	}
	if got, err := s.Do("GET", "k"); err != nil || got != "" {
		t.Errorf("GET k after a crash and Restart before any snapshot = %q, %v; want empty", got, err)
	}
}

func TestRestartKeepsPersistedData(t *testing.T) {
	s := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Stop()
	s.Restart()
	if got, err := s.Do("GET", "k"); err != nil || got != "v" {
		t.Errorf("GET k after crash and Restart = %q, %v; want v", got, err)
	}
}

func TestTwoServersIndependent(t *testing.T) {
	t.Parallel()
	a, b := redistest.Start(t), redistest.Start(t)
	if a.Addr() == b.Addr() || a.Dir() == b.Dir() {
		t.Fatalf("servers share an address or directory: %s %s / %s %s", a.Addr(), a.Dir(), b.Addr(), b.Dir())
	}
	if _, err := a.Do("SET", "k", "a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Do("GET", "k"); got != "" {
		t.Errorf("GET k on the other server = %q, want empty", got)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("len(Addrs()) = %d, want 3", got)
	}
	for _, n := range c.Nodes {
		info, err := n.Do("CLUSTER", "INFO")
		if err != nil {
			t.Fatalf("CLUSTER INFO on %s: %v", n.Addr(), err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_known_nodes:3", "cluster_slots_assigned:16384"} {
			if !strings.Contains(info, want) {
				t.Errorf("CLUSTER INFO on %s lacks %q:\n%s", n.Addr(), want, info)
			}
		}
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Pause()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING of a paused server succeeded; want a timeout")
	}
	s.Resume()
	if got, err := s.Do("PING"); err != nil || got != "PONG" {
		t.Fatalf("PING after Resume = %q, %v; want PONG", got, err)
	}
	s.Pause() // cleanup must kill a paused server
}

// fatalRecorder is a testing.TB whose Fatal records the message and ends
// the goroutine, as the real one does, without failing the test.
type fatalRecorder struct {
	*testing.T
	msg string
}

func (r *fatalRecorder) Fatal(args ...any) { r.msg = fmt.Sprint(args...); runtime.Goexit() }
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *fatalRecorder) Skip(...any)          { r.msg = "skipped"; runtime.Goexit() }
func (r *fatalRecorder) Skipf(string, ...any) { r.msg = "skipped"; runtime.Goexit() }
func (r *fatalRecorder) SkipNow()             { r.msg = "skipped"; runtime.Goexit() }

// TestMissingRedisFails checks that a machine without redis-server fails
// the Redis tests with instructions instead of skipping them.
func TestMissingRedisFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for name, start := range map[string]func(testing.TB){
		"Start":        func(tb testing.TB) { redistest.Start(tb) },
		"StartCluster": func(tb testing.TB) { redistest.StartCluster(tb, 3) },
	} {
		rec := &fatalRecorder{T: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			start(rec)
		}()
		<-done
		if want := "redis-server not found: install it (apt-get install redis-server); the Redis tests are required"; rec.msg != want {
			t.Errorf("%s without redis-server: message %q, want %q", name, rec.msg, want)
		}
	}
}

// TestRestartRefusesForeignServer gives the port of a stopped server to a
// redis-server that redistest did not start: Restart must fail instead of
// taking that server's PONG for its own.
func TestRestartRefusesForeignServer(t *testing.T) {
	rec := &fatalRecorder{T: t}
	var s *redistest.Server
	runTB(func() { s = redistest.Start(rec) })
	if rec.msg != "" {
		t.Fatalf("Start: %s", rec.msg)
	}
	s.Stop()

	foreign := exec.Command("redis-server", "--port", strconv.Itoa(s.Port()), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = foreign.Process.Kill(); _ = foreign.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := s.Do("PING"); err == nil && got == "PONG" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the foreign redis-server did not answer PING within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	runTB(func() { s.Restart() })
	if want := fmt.Sprintf("redistest: restart on port %d:", s.Port()); !strings.HasPrefix(rec.msg, want) {
		t.Fatalf("Restart with a foreign redis-server on the port: message %q, want one starting with %q", rec.msg, want)
	}
	t.Logf("Restart refused: %s", rec.msg)
	// The foreign server was left alone.
	if got, err := s.Do("INFO", "server"); err != nil || !strings.Contains(got, "process_id:"+strconv.Itoa(foreign.Process.Pid)) {
		t.Errorf("INFO server after the refused Restart = %v; want the foreign server (pid %d) still there", err, foreign.Process.Pid)
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	m := redistest.Start(t)
	sen := redistest.StartSentinel(t, m, "mymaster")
	got, err := sen.Do("SENTINEL", "get-master-addr-by-name", "mymaster")
	if want := "127.0.0.1\n" + strconv.Itoa(m.Port()); err != nil || got != want {
		t.Fatalf("SENTINEL get-master-addr-by-name = %q, %v; want %q", got, err, want)
	}
	if info, err := sen.Do("INFO", "server"); err != nil || !strings.Contains(info, "redis_mode:sentinel") {
		t.Errorf("INFO server of the sentinel = %v; want redis_mode:sentinel", err)
	}
}

// runTB runs f in a goroutine of its own, so that a fatalRecorder's Fatal
// (runtime.Goexit) ends only f, and waits for it.
func runTB(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}
