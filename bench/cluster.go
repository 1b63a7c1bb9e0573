//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/freeport"
)

// clusterNodes is the number of masters of the redis-cluster target's
// Redis Cluster (no replicas): the fewest Redis Cluster accepts.
const clusterNodes = 3

// redisCluster is the Redis Cluster of one redis-cluster target: masters
// only, each a redis-server on loopback with its own directory.
type redisCluster struct {
	addrs []string
	pids  []int
}

// cpu is the CPU time so far of every node together.
func (rc *redisCluster) cpu() time.Duration {
	var total time.Duration
	for _, pid := range rc.pids {
		total += cpuTime(pid)
	}
	return total
}

// isRedis says whether a target needs redis-server.
func isRedis(name string) bool {
	return name == "redis" || name == "redis-cluster" || isReplicated(name)
}

// isReplicated says whether a target's Redis has a replica: redis-replica
// (wait_replicas auto, the default: every write waits for it) and
// redis-replica-nowait (wait_replicas: 0).
func isReplicated(name string) bool { return name == "redis-replica" || name == "redis-replica-nowait" }

// redisAvailable returns names without the targets whose programs are not
// on the PATH (redis-server for redis and redis-cluster; redis-cli, which
// joins the cluster's nodes, for redis-cluster), and says on w which it
// left out and why.
func redisAvailable(names []string, w io.Writer) []string {
	leaveOut := func(prog, why string, which func(string) bool) {
		gone := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !which(n) })
		if len(gone) == 0 {
			return
		}
		if _, err := exec.LookPath(prog); err == nil {
			return
		}
		what := "the " + strings.Join(gone, ", ") + " target is"
		if len(gone) > 1 {
			what = "the " + strings.Join(gone, ", ") + " targets are"
		}
		fmt.Fprintf(w, "%s is not on the PATH%s: %s left out\n", prog, why, what)
		names = slices.DeleteFunc(names, which)
	}
	leaveOut("redis-server", "", isRedis)
	leaveOut("redis-cli", " (it joins the Redis Cluster's nodes)", func(n string) bool { return n == "redis-cluster" })
	return names
}

// startRedisCluster starts n cluster-enabled redis-servers (AOF everysec,
// as the redis target's server) through ps, each in its own directory
// under dir on a free loopback port whose cluster bus port (+10000) is free
// too, joins them with redis-cli --cluster create (masters only) and waits
// until every node says cluster_state:ok. The nodes are ps's processes:
// ps.stop stops them, on every exit path, whatever this returns.
func startRedisCluster(ps *procSet, dir string, n int) (*redisCluster, error) {
	rc := &redisCluster{}
	for i := range n {
		addr, pid, err := startClusterNode(ps, filepath.Join(dir, "node-"+strconv.Itoa(i)))
		if err != nil {
			return nil, err
		}
		rc.addrs, rc.pids = append(rc.addrs, addr), append(rc.pids, pid)
	}
	args := append([]string{"--cluster", "create"}, rc.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range rc.addrs {
		for {
			info, err := redisDo(addr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("cluster node %s not ok within 30s: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return rc, nil
}

// startClusterNode starts one node in dir and returns its address and
// process id once it answers from that process. A port taken between
// choosing it and binding it (by another program's server) makes it try
// another, a few times.
func startClusterNode(ps *procSet, dir string) (string, int, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, err
	}
	var errs []error
	for range 5 {
		port, err := freeport.Pick(10000)
		if err != nil {
			return "", 0, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		c := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000", "--logfile", filepath.Join(dir, "redis.log"))
		if err := ps.start(c); err != nil {
			return "", 0, err
		}
		pid := c.Process.Pid
		if err := waitRedis(addr, pid, filepath.Join(dir, "redis.log")); err != nil {
			c.Process.Kill() // ps.stop reaps it
			errs = append(errs, err)
			continue
		}
		return addr, pid, nil
	}
	return "", 0, fmt.Errorf("start a Redis Cluster node: %w", errors.Join(errs...))
}

// waitRedis waits until the redis-server at addr answers and says it is
// process pid: a PONG alone could come from another server on the port.
// logPath is the server's log, named when it exits.
func waitRedis(addr string, pid int, logPath string) error {
	const within = 90 * time.Second // generous: see waitListening
	deadline := time.Now().Add(within)
	for {
		info, err := redisDo(addr, "INFO", "server")
		if err == nil {
			if strings.Contains(info, "\nprocess_id:"+strconv.Itoa(pid)+"\r") {
				return nil
			}
			return fmt.Errorf("%s is another redis-server's, not process %d's", addr, pid)
		}
		if f, serr := statFields(pid); serr != nil || f[0] == "Z" {
			return fmt.Errorf("redis-server on %s exited (its log: %s)", addr, logPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not answering within %s: %w", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisDo sends one command to the Redis at addr, alone (not as a cluster
// client would), and returns its reply as text.
func redisDo(addr string, args ...any) (string, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 5 * time.Second,
		MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return "", err
	}
	return fmt.Sprint(v), nil
}
