//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/freeport"
)

// proc is one child process the run starts, and may kill and start again.
// Its output goes to a log file in the run's folder.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string
	// tree: signals go to the process and every descendant (postgres'
	// postmaster and its backends, which each start a session of their own,
	// so a process group does not hold them).
	tree bool
	cred *syscall.Credential // run as another user (postgres refuses root)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", p.log, err)
	}
	fmt.Fprintf(f, "\n--- chaos: start %s at %s\n", p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	// The kernel kills the child if the run dies without stopping it.
	cmd.SysProcAttr = procAttr(p.cred)
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// note writes a line of the run's into the process's log, such as
// "--- chaos: power cut at 12.345s of the run".
func (p *proc) note(msg string) {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "\n--- chaos: %s at %s\n", msg, time.Now().UTC().Format(time.RFC3339Nano))
	f.Close()
}

// pid returns the process's id, or 0 if it does not run.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// waitStopped waits up to d until every thread of pid is stopped (state T
// in /proc), and reports whether they are. A process that is gone counts
// as stopped.
func waitStopped(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return true
		}
		stopped := true
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
			if err != nil {
				continue
			}
			// pid (comm) state ...: comm may hold spaces.
			i := strings.LastIndexByte(string(b), ')')
			if f := strings.Fields(string(b[i+1:])); i < 0 || len(f) == 0 || (f[0] != "T" && f[0] != "t" && f[0] != "Z" && f[0] != "X") {
				stopped = false
				break
			}
		}
		if stopped {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		p.cmd, p.done = nil, nil
		return false
	default:
		return true
	}
}

// signal sends sig to the process, if it runs.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.send(p.cmd, sig)
	}
}

// send sends sig to cmd's process, and with tree set to its descendants,
// children first for a stop or a kill, so none is left running alone.
func (p *proc) send(cmd *exec.Cmd, sig syscall.Signal) {
	if p.tree {
		for _, pid := range descendants(cmd.Process.Pid) {
			_ = syscall.Kill(pid, sig)
		}
	}
	_ = cmd.Process.Signal(sig)
}

// descendants returns the processes below pid, read from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			walk(c)
			out = append(out, c)
		}
	}
	walk(pid)
	return out
}

// kill kills the process with SIGKILL and waits for it.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	if p.tree {
		// Stopped, the root forks no child after the list of its
		// descendants is read (a PostgreSQL backend started then would
		// outlive the postmaster and hold its shared memory, and the
		// next start would refuse it).
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	}
	p.send(p.cmd, syscall.SIGKILL)
	<-p.done
	p.cmd, p.done = nil, nil
}

// stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	p.send(cmd, syscall.SIGCONT)
	p.send(cmd, syscall.SIGTERM)
	select {
	case <-done:
		p.mu.Lock()
		p.cmd, p.done = nil, nil
		p.mu.Unlock()
	case <-time.After(grace):
		p.kill()
	}
}

// waitExit waits up to d for the process to exit by itself.
func (p *proc) waitExit(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		p.mu.Lock()
		p.cmd, p.done = nil, nil
		p.mu.Unlock()
		return true
	case <-time.After(d):
		return false
	}
}

// freePort returns a loopback port that was free a moment ago, below the
// kernel's ephemeral range: the run kills and restarts proxies and stores
// on their ports, and a port from that range may meanwhile be taken by
// any process's outgoing connection ("address already in use").
func freePort() (int, error) { return freeport.Pick(0) }

// waitHTTP waits until url answers 200, up to d.
func waitHTTP(ctx context.Context, url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	c := &http.Client{Timeout: time.Second}
	var last string
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %v: %s", url, d, last)
}

// redisPing sends PING to the Redis at addr and reports whether it answered
// PONG.
func redisPing(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

func waitRedis(ctx context.Context, addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if redisPing(addr) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("redis at %s did not answer PING within %v", addr, d)
}

// redisDo sends one command to the Redis (or Sentinel) at addr and returns
// its reply, flattened: a string or an integer is one element, an array its
// elements in order (nested arrays flattened), a nil reply none.
func redisDo(addr string, args ...string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	var out []string
	return out, readRESP(bufio.NewReader(c), &out)
}

// readRESP reads one RESP reply into out.
func readRESP(r *bufio.Reader, out *[]string) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return fmt.Errorf("redis: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		*out = append(*out, line[1:])
	case '-':
		return fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return fmt.Errorf("redis: bad bulk length %q", line)
		}
		if n < 0 {
			return nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		*out = append(*out, string(buf[:n]))
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return fmt.Errorf("redis: bad array length %q", line)
		}
		for range n {
			if err := readRESP(r, out); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("redis: unexpected reply %q", line)
	}
	return nil
}
