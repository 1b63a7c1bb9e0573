//go:build unix

package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
)

// pinnedEnv marks the bench process that -pin started on CPUs 1 and up.
const pinnedEnv = "IDEMPROXY_BENCH_PINNED"

// repin runs this command again, with the same arguments, on every CPU but
// CPU 0 (taskset): the load generator and every process it starts inherit
// that set, except the measured targets, which pinned puts on CPU 0 alone.
// It returns the exit code.
func repin() int {
	n := runtime.NumCPU()
	if n < 2 {
		fmt.Fprintln(os.Stderr, "bench: -pin needs at least 2 CPUs")
		return 2
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -pin needs taskset (util-linux) on the PATH")
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	c := exec.Command("taskset", append([]string{"-c", fmt.Sprintf("1-%d", n-1), self}, os.Args[1:]...)...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.Env = append(os.Environ(), pinnedEnv+"=1")
	// The pinned run stops what it started on Ctrl-C or SIGTERM: pass them
	// on and wait for it.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			c.Process.Signal(s)
		}
	}()
	if err := c.Wait(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

// pinned makes c run on CPU 0 alone when pin is set (a sidecar given one
// core; its Go runtime then runs with GOMAXPROCS 1), and returns c.
func pinned(c *exec.Cmd, pin bool) *exec.Cmd {
	if !pin {
		return c
	}
	args := append([]string{"-c", "0", c.Path}, c.Args[1:]...)
	p := exec.Command("taskset", args...)
	p.Env, p.Dir = c.Env, c.Dir
	return p
}
