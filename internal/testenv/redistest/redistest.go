// Package redistest starts real redis-server processes for tests: a single
// node (Start), a Sentinel (StartSentinel) or a small Redis Cluster
// (StartCluster). It never fakes Redis:
// the Redis tests are required, so a machine without redis-server fails them
// with a clear message instead of skipping.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/freeport"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

const (
	// startAttempts bounds the retries when a chosen port is taken between
	// probing it and redis-server binding it.
	startAttempts = 8
	// readyTimeout bounds the wait for a started server to answer PING.
	readyTimeout = 10 * time.Second
	// clusterBusOffset is the fixed offset of the Redis Cluster bus port.
	clusterBusOffset = 10000
)

const notFound = "redis-server not found: install it (apt-get install redis-server); the Redis tests are required"

// Server is one redis-server process listening on a loopback port.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	port int
	pre  []string // arguments before the defaults (a config file, --sentinel)
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts redis-server on a free loopback port with its own data
// directory in tb.TempDir(), the append-only file off and RDB snapshots on
// a schedule they never reach in a test (--save "86400 1" --appendonly no:
// persistence as the proxy's settings check sees it, with nothing written
// to disk, so that Stop's SIGKILL and Restart bring it back empty; --save
// "" turns persistence off) unless args say otherwise, and waits until it answers PING and INFO server shows
// the process_id of the process it started (so a foreign redis-server that
// holds the port is never mistaken for it). Extra args are passed
// after the defaults, so they override them (for example "--appendonly",
// "yes"). The server is killed when the test ends.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir(), args: args}
	tb.Cleanup(s.cleanup)
	s.launch(false, "redis-server")
	return s
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a free
// loopback port, monitoring master under masterName with a quorum of 1, and
// waits until it answers PING. Extra args are passed as for Start. The
// Sentinel is killed when the test ends.
func StartSentinel(tb testing.TB, master *Server, masterName string, args ...string) *Server {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir(), args: args}
	tb.Cleanup(s.cleanup)
	// Sentinel insists on a config file it can rewrite.
	conf := filepath.Join(s.dir, "sentinel.conf")
	monitor := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n", masterName, master.Port())
	if err := os.WriteFile(conf, []byte(monitor), 0o644); err != nil {
		tb.Fatalf("redistest: write sentinel config: %v", err)
	}
	s.pre = []string{conf, "--sentinel"}
	s.launch(false, "redis sentinel")
	return s
}

// launch starts s on a free port, trying another one when the chosen port
// was taken in the meantime. With bus set, the cluster bus port is free too.
func (s *Server) launch(bus bool, what string) {
	s.tb.Helper()
	var errs []error
	for range startAttempts {
		port, err := freePort(bus)
		if err != nil {
			s.tb.Fatalf("redistest: %v", err)
		}
		s.port = port
		err = s.start()
		if err == nil {
			return
		}
		errs = append(errs, err)
	}
	s.tb.Fatalf("redistest: could not start %s after %d attempts: %v", what, startAttempts, errors.Join(errs...))
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's data directory.
func (s *Server) Dir() string { return s.dir }

// Stop kills the server with SIGKILL, simulating a crash, and waits for the
// process to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Restart starts the server again on the same port with the same data
// directory and arguments (so persisted data, if persistence was turned on, is
// loaded again) and waits until it answers PING from the process it started
// (see Start): a foreign redis-server that took the freed port fails the
// test. A running server is killed first.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	// The port was ours a moment ago; retry briefly in case the kernel is
	// slow to release it.
	var err error
	for range startAttempts {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart on port %d: %v", s.port, err)
}

// Do sends one command to the server and returns its reply as text (see
// Command).
func (s *Server) Do(args ...string) (string, error) {
	return Command(s.Addr(), args...)
}

func (s *Server) start() error {
	args := append([]string(nil), s.pre...)
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", s.logPath(),
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "86400 1",
		"--appendonly", "no",
	)
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	testrun.SetProcAttr(cmd) // dies with the test binary, cleanups run or not
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, s.logTail())
		default:
		}
		reply, err := Command(s.Addr(), "PING")
		if err == nil && reply == "PONG" {
			// A PONG proves that some Redis listens on the port, not that
			// it is ours: a foreign redis-server may have taken the port
			// between freePort and our bind (ours then exits, perhaps only
			// after this PING), or, on Restart, since Stop freed it.
			pid, perr := serverPID(s.Addr())
			if perr == nil && pid == cmd.Process.Pid {
				return nil
			}
			s.Stop()
			if perr != nil {
				return fmt.Errorf("redis-server on port %d: INFO server: %w", s.port, perr)
			}
			return fmt.Errorf("port %d is held by another redis-server (process_id %d, ours is %d)",
				s.port, pid, cmd.Process.Pid)
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v (last: %q, %v): %s",
				s.port, readyTimeout, reply, err, s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serverPID returns the process_id that INFO server of the Redis at addr
// reports.
func serverPID(addr string) (int, error) {
	info, err := Command(addr, "INFO", "server")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

func (s *Server) cleanup() {
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	if s.tb.Failed() {
		s.tb.Logf("redistest: log of redis-server %s:\n%s", s.Addr(), s.logTail())
	}
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// logTail returns the last lines of the server log, for failure messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Cluster is a Redis Cluster of master nodes, each a Server.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n (at least 3) cluster-enabled nodes, joins them with
// redis-cli --cluster create (no replicas) and waits until every node reports
// cluster_state:ok. The nodes are killed when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", n)
	}
	bin := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, startClusterNode(tb, bin))
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range c.Nodes {
		for {
			info, err := node.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: cluster node %s not ok after 30s: %v\n%s", node.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func startClusterNode(tb testing.TB, bin string) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir()}
	s.args = []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
		"--cluster-node-timeout", "5000",
	}
	tb.Cleanup(s.cleanup)
	s.launch(true, "cluster node")
	return s
}

// Addrs returns the host:port of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

func lookPath(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if name == "redis-server" {
			tb.Fatal(notFound)
		}
		tb.Fatalf("%s not found: install it (apt-get install redis-tools); the Redis tests are required", name)
	}
	return p
}

// freePort returns a loopback TCP port that was free a moment ago, outside
// the ephemeral range so that a restart finds it free again. With bus set,
// port+10000 (the cluster bus port) was free too.
func freePort(bus bool) (int, error) {
	if bus {
		return freeport.Pick(clusterBusOffset)
	}
	return freeport.Pick(0)
}

// Command sends one command to addr over a fresh connection (RESP2) and
// returns the reply: a simple or bulk string as is, an integer in decimal, an
// array as its elements joined by newlines, a nil reply as "". A Redis error
// reply is returned as an error. It exists so the harness does not depend on
// the client library under test.
func Command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("bad bulk length %q", body)
		}
		if n < 0 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("bad array length %q", body)
		}
		elems := make([]string, 0, max(n, 0))
		for range n {
			e, err := readReply(r)
			if err != nil {
				return "", err
			}
			elems = append(elems, e)
		}
		return strings.Join(elems, "\n"), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}
