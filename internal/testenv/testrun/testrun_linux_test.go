package testrun_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/powerloss"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

func TestMain(m *testing.M) { testrun.Main(m) }

// The helper's environment: where it reports what it started, and the
// token every process it starts inherits.
const (
	envReady = "TESTRUN_HELPER_READY"
	envToken = "TESTRUN_HELPER_TOKEN"
)

// started is what the helper reports once everything runs.
type started struct {
	TempDir string   // the run's TMPDIR
	Mounts  []string // mount points made by the run (as root)
	Image   string   // the loop-mounted image (as root)
}

// TestHelperLeavesEverythingRunning is the run that
// TestNothingOutlivesAKilledRun kills: with TESTRUN_HELPER_READY set it
// starts a redis-server, a PostgreSQL cluster (as the postgres user when
// root), a process without any Pdeathsig (as a process that escaped the
// harnesses would be), and as root a tmpfs, an ext4 image on a loop device
// and a FUSE file system; writes what it started to the file the variable
// names; and waits to be killed. Without the variable it does nothing.
func TestHelperLeavesEverythingRunning(t *testing.T) {
	ready := os.Getenv(envReady)
	if ready == "" {
		return
	}
	redistest.Start(t)
	pgtest.Start(t)
	s := started{TempDir: os.TempDir()}
	if os.Geteuid() == 0 {
		escaped := exec.Command("sleep", "600")
		escaped.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := escaped.Start(); err != nil {
			t.Fatal(err)
		}
		tmpfs := t.TempDir()
		run(t, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tmpfs)
		s.Image = filepath.Join(t.TempDir(), "ext4.img")
		if err := os.WriteFile(s.Image, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(s.Image, 16<<20); err != nil {
			t.Fatal(err)
		}
		run(t, "mkfs.ext4", "-q", "-F", s.Image)
		ext4 := t.TempDir()
		run(t, "mount", "-o", "loop", s.Image, ext4)
		fuse := powerloss.MountT(t, t.TempDir(), powerloss.Options{})
		s.Mounts = []string{tmpfs, ext4, fuse.Mountpoint()}
	}
	if err := os.MkdirAll(filepath.Join(os.TempDir(), "left", "behind"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s)
	if err := os.WriteFile(ready+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(ready+".tmp", ready); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Minute) // until killed
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestNothingOutlivesAKilledRun runs this package's tests as go test would
// (the test binary, or go test itself), kills them while the helper above
// has servers running and file systems mounted, and finds no process, no
// mount, no loop device and no directory of the run left: the run's PID
// and mount namespaces end them when the run dies, and the directory is
// removed by the supervisor or, when the supervisor itself was killed, by
// the next test binary that starts.
func TestNothingOutlivesAKilledRun(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The runs' TMPDIR, shared so that pgtest's template is made once: a
	// short path (a Unix socket's path has at most 107 bytes), which the
	// postgres user reaches, as it does /tmp.
	tmp, err := os.MkdirTemp(testrun.CacheDir(), "testrun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		// start starts the run with env; kill kills it.
		start func(env []string) *exec.Cmd
		kill  func(cmd *exec.Cmd)
		// swept: the directory is removed only by the next run.
		swept bool
	}{
		{
			name:  "SIGKILL of the test binary",
			start: func(env []string) *exec.Cmd { return testBinary(exe, env) },
			kill:  func(cmd *exec.Cmd) { _ = cmd.Process.Kill() },
			swept: true,
		},
		{
			name: "the -timeout of go test panics the run",
			start: func(env []string) *exec.Cmd {
				return testBinary(exe, env, "-test.timeout=30s")
			},
			kill: func(*exec.Cmd) {},
		},
		{
			name:  "Ctrl-C of go test",
			start: func(env []string) *exec.Cmd { return goTest(env) },
			// The terminal signals the foreground process group.
			kill: func(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) },
		},
		{
			name:  "SIGTERM of go test",
			start: func(env []string) *exec.Cmd { return goTest(env) },
			kill:  func(cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGTERM) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each waits on its own run; the timeout case for 30 s
			token := fmt.Sprintf("%x", rand.Uint64())
			ready := filepath.Join(t.TempDir(), "ready.json")
			env := append(outsideEnv(), "TMPDIR="+tmp, envReady+"="+ready, envToken+"="+token)
			cmd := tc.start(env)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })

			var s started
			waitFor(t, 3*time.Minute, "the helper reports everything started", func() bool {
				select {
				case <-exited:
					t.Fatalf("the run exited before it was ready:\n%s", out.String())
				default:
				}
				b, err := os.ReadFile(ready)
				return err == nil && json.Unmarshal(b, &s) == nil
			})
			procs := ofRun(token, s.TempDir)
			byUser := map[int]int{}
			for _, uid := range procs {
				byUser[uid]++
			}
			// The supervisor, the run, redis-server, sleep; the postmaster
			// and its backends, as the postgres user when root.
			if len(procs) < 6 || (os.Geteuid() == 0 && len(byUser) < 2) {
				t.Fatalf("processes of the run before the kill (pid: uid): %v; want the supervisor, the run, redis-server and postgres' processes", procs)
			}
			for _, mp := range s.Mounts {
				if !mountedAnywhere(mp) {
					t.Fatalf("%s is not mounted in any namespace before the kill: the test would prove nothing", mp)
				}
			}
			if s.Image != "" && !loopBacked(s.Image) {
				t.Fatalf("no loop device is backed by %s before the kill", s.Image)
			}
			t.Logf("running: %d processes, mounts %v, in %s", len(procs), s.Mounts, s.TempDir)

			tc.kill(cmd)
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the run did not end within 2 minutes of the kill:\n%s", out.String())
			}
			waitFor(t, time.Minute, "no process of the run is left", func() bool { return len(ofRun(token, s.TempDir)) == 0 })
			for _, mp := range s.Mounts {
				waitFor(t, time.Minute, mp+" is mounted nowhere", func() bool { return !mountedAnywhere(mp) })
			}
			if s.Image != "" {
				waitFor(t, time.Minute, "the loop device is let go", func() bool { return !loopBacked(s.Image) })
			}
			if tc.swept {
				if _, err := os.Stat(s.TempDir); err != nil {
					t.Fatalf("the run's directory after a SIGKILL of its supervisor: %v; want it left for the next run", err)
				}
				next := testBinary(exe, append(outsideEnv(), "TMPDIR="+tmp), "-test.run=^$")
				if b, err := next.CombinedOutput(); err != nil {
					t.Fatalf("the next run: %v\n%s", err, b)
				}
			}
			if _, err := os.Stat(s.TempDir); !os.IsNotExist(err) {
				t.Errorf("the run's directory %s is left: %v", s.TempDir, err)
			}
			if t.Failed() {
				t.Logf("output of the run:\n%s", out.String())
			}
		})
	}
}

// testBinary runs this test binary's helper as go test runs a test binary.
func testBinary(exe string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(exe, append([]string{"-test.run=^TestHelperLeavesEverythingRunning$", "-test.v"}, args...)...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// goTest runs the helper with go test, in a process group of its own as a
// shell runs a command in the foreground.
func goTest(env []string) *exec.Cmd {
	cmd := exec.Command("go", "test", "-count=1", "-v", "-run=^TestHelperLeavesEverythingRunning$", ".")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// outsideEnv is this process's environment without testrun's variables,
// so that the test binary started with it supervises a run of its own.
func outsideEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMPROXY_TESTRUN_") {
			env = append(env, kv)
		}
	}
	return env
}

// ofRun returns the processes of the run: those whose environment holds
// the token, and those working in the run's directory (postgres overwrites
// its environment with its process title, and works in its data
// directory), with the user each runs as.
func ofRun(token, dir string) map[int]int {
	want := []byte("\x00" + envToken + "=" + token + "\x00")
	procs := map[int]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "environ"))
		cwd, _ := os.Readlink(filepath.Join(d, "cwd"))
		if !bytes.Contains(append([]byte{0}, b...), want) && !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		info, err := os.Stat(d)
		if err != nil {
			continue // gone meanwhile
		}
		var pid int
		fmt.Sscan(filepath.Base(d), &pid)
		procs[pid] = int(info.Sys().(*syscall.Stat_t).Uid)
	}
	return procs
}

// mountedAnywhere reports whether mp is a mount point in the mount
// namespace of any process.
func mountedAnywhere(mp string) bool {
	infos, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	for _, p := range infos {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 4 && f[4] == mp {
				return true
			}
		}
	}
	return false
}

// loopBacked reports whether a loop device is backed by img.
func loopBacked(img string) bool {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), img) {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
