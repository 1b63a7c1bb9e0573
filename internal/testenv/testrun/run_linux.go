package testrun

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// envNamespaces tells the run that it was started in namespaces of its
// own, which it finishes setting up (enterNamespaces).
const envNamespaces = "IDEMPROXY_TESTRUN_NAMESPACES"

// exitNoNamespaces is the run's exit code when it cannot set up its
// namespaces (a container that lets it create them but not mount /proc):
// the supervisor then starts it again without them.
const exitNoNamespaces = 97

// killAfter is how long Main waits after interrupting the run, when go
// test went away, before it kills the run.
const killAfter = 10 * time.Second

func isolate() {
	if os.Getenv(envInside) == "" {
		os.Exit(supervise())
	}
	// Test binaries started by the tests inherit the variables; only the
	// run itself is the first process of its PID namespace.
	if os.Getenv(envNamespaces) != "" && os.Getpid() == 1 {
		if err := enterNamespaces(); err != nil {
			fmt.Fprintf(os.Stderr, "testrun: %v: the tests run without namespaces of their own\n", err)
			os.Exit(exitNoNamespaces)
		}
	}
}

// enterNamespaces makes the new mount namespace's mounts private (so that
// the tests' mounts are seen nowhere else and vanish with it) and mounts a
// /proc of the new PID namespace, so that the process ids in /proc are
// those the tests see.
func enterNamespaces() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc of the PID namespace: %w", err)
	}
	return nil
}

// supervise is Main outside the run: it sweeps what killed runs left,
// starts the run, passes signals on, waits, and removes the run's
// directory.
func supervise() int {
	cache := os.TempDir()
	root := filepath.Join(cache, "idemproxy-tests")
	if err := os.MkdirAll(root, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "testrun: %v\n", err)
		return 1
	}
	sweep(root)
	dir, lock, err := newRunDir(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testrun: %v\n", err)
		return 1
	}
	defer lock.Close()
	defer removeRunDir(dir)

	namespaces := os.Geteuid() == 0
	var cmd *exec.Cmd
	for {
		c, inNamespaces, err := startRun(dir, cache, namespaces)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testrun: start the tests: %v\n", err)
			return 1
		}
		done := make(chan struct{})
		go passSignals(c, done)
		err = c.Wait()
		close(done)
		if inNamespaces && c.ProcessState.ExitCode() == exitNoNamespaces {
			namespaces = false
			continue
		}
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			fmt.Fprintf(os.Stderr, "testrun: %v\n", err)
			return 1
		}
		cmd = c
		break
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		fmt.Fprintf(os.Stderr, "testrun: the tests were killed by %v\n", ws.Signal())
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

// newRunDir creates the run's directory under root and locks it for as
// long as this process lives (the lock is let go when it dies, however it
// dies).
func newRunDir(root string) (string, *os.File, error) {
	dir, err := os.MkdirTemp(root, fmt.Sprintf("run-%d-", os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	// Like /tmp: the servers run as other users (postgres) create their
	// directories in it.
	if err := os.Chmod(dir, 0o1777); err != nil {
		return "", nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return "", nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	return dir, lock, nil
}

// sweep removes the directories of runs whose supervisor is gone: the
// lock is free, or there is none and the directory is older than a minute
// (a supervisor between creating it and locking it is younger).
func sweep(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "run-") {
			continue
		}
		dir := filepath.Join(root, e.Name())
		f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR, 0)
		if err != nil {
			info, serr := e.Info()
			if serr != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
		} else {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			f.Close()
			if err != nil {
				continue // its supervisor lives
			}
		}
		removeRunDir(dir)
	}
}

// removeRunDir unmounts what is still mounted under dir in this mount
// namespace (a run without namespaces of its own mounts here) and removes
// it, retrying for a few seconds while the last processes of a run that
// had no PID namespace die.
func removeRunDir(dir string) {
	var err error
	for range 50 {
		unmountUnder(dir)
		if err = os.RemoveAll(dir); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "testrun: remove %s: %v\n", dir, err)
}

// unmountUnder detaches every mount at or below dir, the deepest first.
func unmountUnder(dir string) {
	for _, mp := range slices.Backward(mountsUnder(dir)) {
		_ = syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}

// mountsUnder returns the mount points at or below dir in this process's
// mount namespace, in the order of /proc/self/mountinfo (parents first).
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// startRun starts the test binary again, as the run, with TMPDIR dir: in
// new PID and mount namespaces when asked and allowed, else without. It
// reports which.
func startRun(dir, cache string, namespaces bool) (*exec.Cmd, bool, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, false, err
	}
	mk := func(namespaces bool) *exec.Cmd {
		cmd := exec.Command(exe, os.Args[1:]...)
		cmd.Args[0] = os.Args[0]
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), "TMPDIR="+dir, envInside+"=1", envCache+"="+cache)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if namespaces {
			cmd.Env = append(cmd.Env, envNamespaces+"=1")
			cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
		}
		return cmd
	}
	if namespaces {
		cmd := mk(true)
		if err := cmd.Start(); err == nil {
			return cmd, true, nil
		}
		// A container without CAP_SYS_ADMIN: run without the namespaces.
	}
	cmd := mk(false)
	return cmd, false, cmd.Start()
}

// passSignals passes the signals a user or go test sends on to the run,
// and interrupts it (then kills it) when go test, the parent, is gone,
// until done is closed.
func passSignals(cmd *exec.Cmd, done <-chan struct{}) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	parent := os.Getppid()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var kill <-chan time.Time
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case <-tick.C:
			if kill == nil && os.Getppid() != parent {
				_ = cmd.Process.Signal(syscall.SIGINT)
				kill = time.After(killAfter)
			}
		case <-kill:
			_ = cmd.Process.Kill()
		}
	}
}
