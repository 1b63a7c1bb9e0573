//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestRedisAvailable: a target whose program is missing is left out with a
// message naming the target and the program; the others stay.
func TestRedisAvailable(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: install it (apt-get install redis-server); the bench tests need it")
	}
	onlyServer := t.TempDir()
	if err := os.Symlink(server, filepath.Join(onlyServer, "redis-server")); err != nil {
		t.Fatal(err)
	}
	all := []string{"bare", "redis", "redis-cluster", "badger-sync"}
	tests := []struct {
		name     string
		path     string
		want     []string
		wantSays []string
	}{
		{"neither", t.TempDir(), []string{"bare", "badger-sync"},
			[]string{"redis-server is not on the PATH: the redis, redis-cluster targets are left out"}},
		{"no redis-cli", onlyServer, []string{"bare", "redis", "badger-sync"},
			[]string{"redis-cli is not on the PATH (it joins the Redis Cluster's nodes): the redis-cluster target is left out"}},
		{"both", os.Getenv("PATH"), all, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", tt.path)
			var out bytes.Buffer
			got := redisAvailable(slices.Clone(all), &out)
			if !slices.Equal(got, tt.want) {
				t.Errorf("targets: got %v, want %v", got, tt.want)
			}
			says := strings.Split(strings.TrimSpace(out.String()), "\n")
			if out.Len() == 0 {
				says = nil
			}
			if !slices.Equal(says, tt.wantSays) {
				t.Errorf("message: got %q, want %q", says, tt.wantSays)
			}
		})
	}
	t.Run("only the cluster asked for", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		var out bytes.Buffer
		if got := redisAvailable([]string{"redis-cluster"}, &out); len(got) != 0 {
			t.Errorf("targets: got %v, want none", got)
		}
		if want := "redis-server is not on the PATH: the redis-cluster target is left out\n"; out.String() != want {
			t.Errorf("message: got %q, want %q", out.String(), want)
		}
	})
}

// TestRedisCluster: the redis-cluster target's cluster has three masters
// that share the slots, the prefill's keys land on every node, its CPU is
// every node's, and stop leaves no node running and no directory behind.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "cluster")
	ps := &procSet{logDir: t.TempDir()}
	ps.cleanup(func() { os.RemoveAll(dir) })
	defer ps.stop()
	rc, err := startRedisCluster(ps, dir, clusterNodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(rc.addrs) != 3 || len(rc.pids) != 3 {
		t.Fatalf("got %d nodes and %d processes, want 3", len(rc.addrs), len(rc.pids))
	}
	for _, addr := range rc.addrs {
		info, err := redisDo(addr, "CLUSTER", "INFO")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_size:3"} {
			if !strings.Contains(info, want+"\r\n") {
				t.Errorf("%s: CLUSTER INFO has no %q:\n%s", addr, want, info)
			}
		}
	}
	const keys = 300
	if err := prefillRedis(rc.addrs, true, keys, time.Hour); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, addr := range rc.addrs {
		n, err := redisDo(addr, "DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		k, _ := strconv.Atoi(n)
		if k < keys/10 {
			t.Errorf("%s holds %d keys, want a share of the %d", addr, k, keys)
		}
		total += k
	}
	if total < keys+1 {
		t.Errorf("the nodes hold %d keys, want at least %d (the seed and its copies)", total, keys+1)
	}
	var sum time.Duration
	for _, pid := range rc.pids {
		sum += cpuTime(pid)
	}
	// Not "more than 0": /proc counts in 10 ms ticks, and three nodes can
	// each serve a small prefill within one tick.
	if got := rc.cpu(); got < sum {
		t.Errorf("cluster CPU %v, want every node's (%v)", got, sum)
	}

	ps.stop()
	for i, addr := range rc.addrs {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("node %s still listening after stop", addr)
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(rc.pids[i])); err == nil {
			t.Errorf("node process %d still exists after stop", rc.pids[i])
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory after stop: %v, want it removed", err)
	}
	if err := ps.start(exec.Command("true")); !errors.Is(err, errStopping) {
		t.Errorf("start after stop: got %v, want errStopping", err)
	}
}

var (
	buildOnce sync.Once
	benchBin  string
	buildErr  error
)

// bench builds this command once and returns a command running it from
// the repository root (it builds the binary and the stub from there) with
// its temporary directories in tmp.
func bench(t *testing.T, tmp string, args ...string) *exec.Cmd {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bench-test-bin")
		if err != nil {
			buildErr = err
			return
		}
		benchBin = filepath.Join(dir, "bench")
		if out, err := exec.Command("go", "build", "-o", benchBin, ".").CombinedOutput(); err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build ./bench: %v", buildErr)
	}
	c := exec.Command(benchBin, args...)
	c.Dir = ".."
	c.Env = append(os.Environ(), "TMPDIR="+tmp)
	return c
}

func TestMain(m *testing.M) {
	testrun.Isolate() // no server of a bench run outlives the test binary
	code := m.Run()
	if benchBin != "" {
		os.RemoveAll(filepath.Dir(benchBin))
	}
	os.Exit(code)
}

// TestInterruptStopsEverything: Ctrl-C (SIGINT) while the targets run
// stops every process the bench started, the Cluster's nodes included,
// removes its temporary directory and exits with status 130.
func TestInterruptStopsEverything(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	c := bench(t, tmp, "-targets", "redis-cluster", "-duration", "60s", "-driver", "go", "-log-level", "error")
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	go func() {
		<-ctx.Done()
		c.Process.Kill()
	}()
	// "load:" is printed once every target runs.
	sc := bufio.NewScanner(stdout)
	var printed []string
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "load:") {
		printed = append(printed, sc.Text())
	}
	children := childrenOf(c.Process.Pid)
	if len(children) < clusterNodes+2 { // the nodes, the stub, the proxy
		t.Errorf("bench runs %d processes, want at least %d (%d nodes, the stub, the proxy)", len(children), clusterNodes+2, clusterNodes)
	}
	var nodes []string
	for _, pid := range children {
		// Redis rewrites its command line: its name is redis-server.
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil && strings.TrimSpace(string(b)) == "redis-server" {
			nodes = append(nodes, strconv.Itoa(pid))
		}
	}
	if len(nodes) != clusterNodes {
		t.Errorf("got %d redis-servers among the bench's processes, want %d", len(nodes), clusterNodes)
	}
	if err := c.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	err = c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit: %v, want status 130\nstdout: %s\nstderr: %s", err, strings.Join(printed, "\n"), stderr.String())
	}
	for _, pid := range children {
		if alive(pid) {
			t.Errorf("process %d (%s) still running after the bench exited", pid, cmdline(pid))
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("temporary directories left after Ctrl-C: %v", left)
	}
	if !strings.Contains(stderr.String(), "interrupt") {
		t.Errorf("stderr does not say the bench was interrupted: %q", stderr.String())
	}
}

// childrenOf returns the process ids whose parent is pid.
func childrenOf(pid int) []int {
	var kids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentPID(p); err == nil && ppid == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// alive says whether pid runs (a zombie does not).
func alive(pid int) bool {
	f, err := statFields(pid)
	return err == nil && f[0] != "Z"
}

func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " ")
}
