//go:build unix

package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// errStopping is start's error once stop has begun (an interrupted run).
var errStopping = errors.New("the bench is stopping")

// procSet is what a run started: processes, stopped last first (the
// proxies before the servers they use, the servers before the stub), and
// then the cleanups, run last first (directories removed once nothing
// writes into them). Its methods are safe for concurrent use, so that the
// signal handler can stop everything while the run is starting more.
type procSet struct {
	// logDir holds each process' stderr, as <binary>-<n>.log; empty: the
	// output is discarded.
	logDir string

	mu       sync.Mutex
	cmds     []*exec.Cmd
	cleanups []func()
	stopped  bool
}

// start starts c with its standard error in a log file, adding env to the
// environment (and the profiled targets' admin token), so that stop stops
// it. Unless c says otherwise, the kernel kills c if the bench dies
// without stopping it (SIGKILL: Linux only). After stop it returns
// errStopping and starts nothing.
func (p *procSet) start(c *exec.Cmd, env ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errStopping
	}
	c.Env = append(os.Environ(), "IDEMPROXY_ADMIN_TOKEN="+benchToken) // for -profile
	c.Env = append(c.Env, env...)
	if c.SysProcAttr == nil {
		c.SysProcAttr = procAttr(nil)
	}
	c.Stdout, c.Stderr = io.Discard, io.Discard // a pipe, like a container's log
	if p.logDir != "" {
		logf, err := os.Create(filepath.Join(p.logDir, filepath.Base(c.Path)+"-"+strconv.Itoa(len(p.cmds))+".log"))
		if err != nil {
			return err
		}
		defer logf.Close() // the child has its own descriptor
		c.Stderr = logf
	}
	if err := c.Start(); err != nil {
		return err
	}
	p.cmds = append(p.cmds, c)
	return nil
}

// cleanup registers f to run after every process stopped. After stop it
// runs f at once.
func (p *procSet) cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		f()
		return
	}
	p.cleanups = append(p.cleanups, f)
}

// stop sends SIGTERM to every process, last started first, waiting at
// most 5 s for each before SIGKILL, and then runs the cleanups. It runs
// once: a second call waits until the first is done.
func (p *procSet) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	for _, c := range slices.Backward(p.cmds) {
		terminate(c)
	}
	for _, f := range slices.Backward(p.cleanups) {
		f()
	}
}

// stopOne stops c, one of the processes started, before the others (as
// stop would: SIGTERM, SIGKILL after 5 s), and forgets it. After stop, or
// for a process it did not start, it does nothing.
func (p *procSet) stopOne(c *exec.Cmd) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.cmds, c)
	if p.stopped || i < 0 {
		return
	}
	p.cmds = slices.Delete(p.cmds, i, i+1)
	terminate(c)
}

// terminate sends c SIGTERM and waits at most 5 s for it to exit before
// SIGKILL.
func terminate(c *exec.Cmd) {
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.Process.Kill()
		<-done
	}
}
