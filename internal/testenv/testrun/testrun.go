// Package testrun runs a package's tests so that nothing they start
// outlives them: no process, no mount, no temporary directory, also when
// the run is killed by go test's -timeout (which panics the test binary:
// t.Cleanup does not run then), by Ctrl-C or SIGTERM of go test, or by a
// SIGKILL of the test binary.
//
// A package whose tests start processes (redis-server, PostgreSQL, the
// idemproxy binary, Chromium) or mount file systems calls Main from its
// TestMain, or Isolate first thing in a TestMain of its own. Neither runs
// the tests in the test binary go test started (the supervisor): it
// re-runs the test binary as a child (the run) with its own temporary
// directory, and waits:
//
//   - On Linux as root the run gets a PID namespace and a mount namespace
//     of its own. The run is the namespace's first process: when it exits,
//     however it exits, the kernel kills every process left in the
//     namespace (postgres backends, processes started through another
//     user's credentials, Chromium's helpers), and the mounts made in it
//     (tmpfs, loop-mounted images, FUSE) vanish with it. Without the
//     privilege (not root, or a container that refuses namespaces) the run
//     is started without them, and the harnesses' Pdeathsig (SetProcAttr)
//     is what ends their processes.
//   - TMPDIR of the run is a directory of its own, RunRoot/run-PID-*, so
//     that t.TempDir, os.MkdirTemp and os.CreateTemp land there. Main
//     removes it when the run ends. A directory left by a run whose Main
//     was itself killed (SIGKILL) is removed by the next Main, of any
//     package: each run holds a lock on its directory while it lives.
//   - SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the supervisor are
//     passed to the run (SIGQUIT makes go test's goroutine dump work as
//     before); when go test itself goes away, the supervisor interrupts
//     the run, and kills it 10 s later.
//
// The supervisor exits with the run's exit code, and go test sees the
// run's output as the test binary's.
//
// CacheDir is the temporary directory outside the runs, for what is kept
// across runs as a build cache is (pgtest's template cluster).
package testrun

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// Environment variables between Main and the run.
const (
	// envInside marks the run (and every process it starts, which inherit
	// it): a test binary started with it set runs its tests directly.
	envInside = "IDEMPROXY_TESTRUN_INSIDE"
	// envCache holds CacheDir for the run.
	envCache = "IDEMPROXY_TESTRUN_CACHE"
)

// Main runs the tests of m in a run, as described in the package comment,
// and exits with their exit code.
func Main(m *testing.M) {
	Isolate()
	os.Exit(m.Run())
}

// MainParallel is Main for a package whose tests mostly wait (for the
// servers they start, for outages, timeouts and standbys) rather than
// compute: it runs up to n of their parallel tests at once, unless
// -test.parallel was given (a -parallel on the command line wins). Its
// default, GOMAXPROCS, is 2 on a 2-core machine, which leaves such tests
// waiting in line behind each other's waits.
func MainParallel(m *testing.M, n int) {
	Isolate()
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// Isolate returns in the run, which then sets up and runs the tests as a
// TestMain does. In the supervisor (the test binary go test started) it
// starts the run, waits for it and exits: it never returns. Outside Linux
// it returns at once: the tests run without a supervisor.
func Isolate() { isolate() }

// CacheDir returns the temporary directory that holds the runs' directories
// and what outlives a run: the TMPDIR go test was started with.
func CacheDir() string {
	if d := os.Getenv(envCache); d != "" {
		return d
	}
	return os.TempDir()
}

// RunRoot returns the directory under which each run has its temporary
// directory.
func RunRoot() string { return filepath.Join(CacheDir(), "idemproxy-tests") }

// SetProcAttr makes cmd's process die with the test binary (Pdeathsig on
// Linux) and puts it in a process group of its own, which KillGroup ends
// with all its children. It keeps what cmd.SysProcAttr already holds
// (credentials, for instance).
func SetProcAttr(cmd *exec.Cmd) { setProcAttr(cmd) }

// KillGroup kills the process group that cmd's process leads (see
// SetProcAttr) with SIGKILL; elsewhere than Unix, the process only.
func KillGroup(cmd *exec.Cmd) { killGroup(cmd) }
