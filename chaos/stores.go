//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// storeNode is one server process of a shared store: a Redis node or a
// PostgreSQL cluster, with the clients' fault layer in front of it.
type storeNode struct {
	name  string // redis-a, postgres-b: in the run's folder and log
	proc  *proc
	port  int
	dir   string // its files: the Redis dir, the PostgreSQL data directory
	fault *faultProxy
}

func (n *storeNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// storeSrv is a shared store of the run (Redis or PostgreSQL): a primary
// and a replica (Redis, behind a Sentinel) or a synchronous standby
// (PostgreSQL), the replicas' fault layer in front of each node, and how
// to tell it is up.
type storeSrv struct {
	name  string // redis or postgres: in the fault kinds
	nodes []*storeNode

	mu      sync.Mutex
	primary int // the index in nodes of the node that takes writes

	// sentinel is Redis' Sentinel, which the proxies ask for the master.
	sentinel     *proc
	sentinelPort int

	ready func(ctx context.Context) error
	// forget makes the server lose every key it holds and serve again:
	// Redis restarted without its files, PostgreSQL's table truncated.
	forget func(ctx context.Context) error
	// failover stops the primary without warning and promotes the other
	// node; once the new primary serves, the old node follows it.
	failover func(ctx context.Context, f fault) error
	// psql runs sql on node n of PostgreSQL and returns its output.
	psql func(ctx context.Context, n *storeNode, sql string) (string, error)
}

// prim returns the node that takes writes, and the other one. For Redis
// it asks the Sentinel, which may have failed over by itself (a master
// killed or paused for longer than sentinelDownAfter, or too slow to
// answer on a loaded machine).
func (s *storeSrv) prim() (primary, other *storeNode) {
	if s.sentinel != nil && s.sentinel.running() {
		if m, err := s.sentinelPrimary(); err == nil {
			s.setPrimary(m)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[s.primary], s.nodes[1-s.primary]
}

// setPrimary records that n takes writes now.
func (s *storeSrv) setPrimary(n *storeNode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.nodes {
		if m == n {
			s.primary = i
		}
	}
}

// eachFault calls fn on the fault layer of every node.
func (s *storeSrv) eachFault(fn func(*faultProxy)) {
	for _, n := range s.nodes {
		if n.fault != nil {
			fn(n.fault)
		}
	}
}

// procs returns every process of the store: its nodes and the Sentinel.
func (s *storeSrv) procs() []*proc {
	var out []*proc
	for _, n := range s.nodes {
		out = append(out, n.proc)
	}
	if s.sentinel != nil {
		out = append(out, s.sentinel)
	}
	return out
}

// storeSource is the loopback address the stores' own connections
// (replication, Sentinel's checks and commands) come from. The fault
// layers let them through untouched: a net-S-* fault is between the
// proxies and the store, not inside the store.
const storeSource = "127.0.0.3"

// replSource is the loopback address the Redis nodes' own connections
// (replication) come from: exempt like storeSource, and apart from the
// Sentinel's, so that redis-failover-lagging can cut the replica off its
// master alone.
const replSource = "127.0.0.4"

// sentinelMaster is the master's name in the Sentinel.
const sentinelMaster = "chaos"

// Sentinel's timing: the master is down after sentinelDownAfter without an
// answer; a failover must be over within sentinelFailoverTimeout, and the
// Sentinel starts another one on the same master only twice that later.
const (
	sentinelDownAfter       = time.Second
	sentinelFailoverTimeout = 3 * time.Second
)

// startRedis starts two redis-server nodes with the append-only file,
// synced on every write, as the README recommends, the second a replica of
// the first, and a Sentinel that watches them. Every address they announce
// is their fault layer's, so that the proxies, which ask the Sentinel where
// the master is, go through the fault layer; the nodes' and the Sentinel's
// own connections come from storeSource, which the layers let through.
func (r *run) startRedis(ctx context.Context) (*storeSrv, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found: install it (apt-get install redis-server)")
	}
	s := &storeSrv{name: "redis"}
	for _, suffix := range []string{"a", "b"} {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		n := &storeNode{name: "redis-" + suffix, port: port, dir: filepath.Join(r.out, "redis-"+suffix)}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, err
		}
		if n.fault, err = newFaultProxyExempt(n.addr(), storeSource, replSource); err != nil {
			return nil, err
		}
		n.proc = &proc{name: n.name, bin: bin, log: filepath.Join(r.out, n.name+".log")}
		s.nodes = append(s.nodes, n)
	}
	a, b := s.nodes[0], s.nodes[1]
	a.proc.args = redisArgs(a, nil)
	b.proc.args = redisArgs(b, a)
	for _, n := range s.nodes {
		if err := n.proc.start(); err != nil {
			return s, err
		}
		if err := waitRedis(ctx, n.addr(), 20*time.Second); err != nil {
			return s, err
		}
	}
	if s.sentinelPort, err = freePort(); err != nil {
		return s, err
	}
	sdir := filepath.Join(r.out, "sentinel")
	if err := os.MkdirAll(sdir, 0o755); err != nil {
		return s, err
	}
	conf := filepath.Join(sdir, "sentinel.conf")
	c := fmt.Sprintf(`port %d
bind 127.0.0.1
bind-source-addr %s
protected-mode no
dir %s
sentinel monitor %s 127.0.0.1 %d 1
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, s.sentinelPort, storeSource, sdir, sentinelMaster, faultPort(a), sentinelMaster, sentinelDownAfter.Milliseconds(),
		sentinelMaster, sentinelFailoverTimeout.Milliseconds(), sentinelMaster)
	if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
		return s, err
	}
	s.sentinel = &proc{name: "sentinel", bin: bin, args: []string{conf, "--sentinel"}, log: filepath.Join(r.out, "sentinel.log")}
	if err := s.sentinel.start(); err != nil {
		return s, err
	}
	s.ready = func(ctx context.Context) error {
		if err := waitRedis(ctx, s.sentinelAddr(), 20*time.Second); err != nil {
			return err
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, err := s.sentinelPrimary()
			if err == nil && redisRole(m.addr()) == "master" {
				s.setPrimary(m)
				return nil
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("redis: no master that the Sentinel names and that says so within 30s: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.forget = func(ctx context.Context) error {
		// Every key gone, on the master and so on its replica, as a
		// Redis without persistence, or whose volume was lost, comes back
		// from a crash. (Killing the master and starting it without its
		// files, as the run did before the Sentinel, lets the Sentinel
		// promote the replica, keys and all, when the start takes longer
		// than sentinelDownAfter.)
		m, _ := s.prim()
		_, err := redisDo(m.addr(), "FLUSHALL", "SYNC")
		return err
	}
	s.failover = func(ctx context.Context, f fault) error { return r.redisFailover(ctx, s, f, nil) }
	if err := s.ready(ctx); err != nil {
		return s, err
	}
	return s, s.waitRedisReplica(ctx, 30*time.Second)
}

// redisArgs returns the command line of Redis node n, a replica of master
// unless master is nil.
func redisArgs(n, master *storeNode) []string {
	args := []string{
		"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1", "--bind-source-addr", replSource,
		"--dir", n.dir, "--daemonize", "no",
		"--protected-mode", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0",
		"--replica-announce-ip", "127.0.0.1", "--replica-announce-port", strconv.Itoa(faultPort(n)),
	}
	if master != nil {
		args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(faultPort(master)))
	}
	return args
}

// faultPort returns the port of n's fault layer.
func faultPort(n *storeNode) int {
	_, p, _ := strings.Cut(n.fault.addr(), ":")
	port, _ := strconv.Atoi(p)
	return port
}

func (s *storeSrv) sentinelAddr() string { return "127.0.0.1:" + strconv.Itoa(s.sentinelPort) }

// sentinelPrimary returns the node the Sentinel names as the master.
func (s *storeSrv) sentinelPrimary() (*storeNode, error) {
	reply, err := redisDo(s.sentinelAddr(), "SENTINEL", "get-master-addr-by-name", sentinelMaster)
	if err != nil {
		return nil, err
	}
	if len(reply) != 2 {
		return nil, fmt.Errorf("sentinel: get-master-addr-by-name answered %q", reply)
	}
	for _, n := range s.nodes {
		if reply[1] == strconv.Itoa(faultPort(n)) {
			return n, nil
		}
	}
	return nil, fmt.Errorf("sentinel: the master %s:%s is none of the run's nodes", reply[0], reply[1])
}

// redisRole returns what the node at addr says it is (INFO replication:
// master or slave), or "" when it does not answer.
func redisRole(addr string) string {
	reply, err := redisDo(addr, "ROLE")
	if err != nil || len(reply) == 0 {
		return ""
	}
	return reply[0]
}

// waitRedisReplica waits until the master has its replica online and
// caught up (its offset the master's), so that a failover loses nothing
// that replication alone could have kept.
func (s *storeSrv) waitRedisReplica(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for {
		m, _ := s.prim()
		info, err := redisDo(m.addr(), "INFO", "replication")
		if err == nil && len(info) == 1 {
			last = info[0]
			if strings.Contains(last, "role:master") && strings.Contains(last, "connected_slaves:1") && strings.Contains(last, "state=online") {
				return nil
			}
		} else if err != nil {
			last = err.Error()
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("redis: the replica is not online within %v: %s", d, strings.ReplaceAll(strings.TrimSpace(last), "\r\n", "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSentinel waits until the Sentinel can fail over: out of its TILT mode
// (which a pause of the whole store puts it in for 30 s) and seeing the
// replica as a good one (flags "slave" alone: not down, not
// disconnected).
func (s *storeSrv) waitSentinel(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for {
		info, err := redisDo(s.sentinelAddr(), "INFO", "sentinel")
		if err == nil && len(info) == 1 && strings.Contains(info[0], "sentinel_tilt:0") {
			reply, err := redisDo(s.sentinelAddr(), "SENTINEL", "replicas", sentinelMaster)
			if err == nil {
				last = strings.Join(reply, " ")
				for i := 0; i+1 < len(reply); i++ {
					if reply[i] == "flags" && reply[i+1] == "slave" {
						return nil
					}
				}
			}
		} else if err == nil && len(info) == 1 {
			last = "in TILT mode"
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("redis: the Sentinel cannot fail over within %v: %s", d, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// redisFailover kills the master (SIGKILL), waits until the Sentinel has
// promoted the replica, and starts the old master again as a replica of the
// new one (it never serves as a master again: a master that comes back
// before the Sentinel turns it into a replica takes writes it then
// drops). lag, if set, is called once the replica is in sync, before the
// kill: it cuts the replica off (redis-failover-lagging), and returns what
// to call once the replica is promoted.
func (r *run) redisFailover(ctx context.Context, s *storeSrv, f fault, lag func(old, next *storeNode) (promoted func())) error {
	bctx := context.WithoutCancel(ctx)
	if err := s.waitRedisReplica(bctx, time.Minute); err != nil {
		return err
	}
	if err := s.waitSentinel(bctx, 60*time.Second); err != nil {
		return err
	}
	old, next := s.prim()
	promoted := func() {}
	if lag != nil {
		promoted = lag(old, next)
	}
	old.proc.kill()
	deadline := time.Now().Add(sentinelDownAfter + 2*sentinelFailoverTimeout + 30*time.Second)
	for {
		m, err := s.sentinelPrimary()
		if err == nil && m == next && redisRole(next.addr()) == "master" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-failover: the Sentinel did not promote %s: %v", next.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.setPrimary(next)
	promoted()
	old.proc.args = redisArgs(old, next)
	if err := old.proc.start(); err != nil {
		return err
	}
	if err := waitRedis(bctx, old.addr(), 20*time.Second); err != nil {
		return err
	}
	return s.waitRedisReplica(bctx, 60*time.Second)
}

// startPostgres creates a PostgreSQL cluster (initdb) in the run's folder
// and starts it, durable (fsync on, synchronous_commit on), as the postgres
// user when the run is root (initdb and postgres refuse root), then a
// streaming standby of it (pg_basebackup) that the primary waits for at
// every commit (synchronous_standby_names).
func (r *run) startPostgres(ctx context.Context) (*storeSrv, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, and initdb refuses root: the postgres user is missing: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir := filepath.Join(r.out, "postgres")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	s := &storeSrv{name: "postgres"}
	for _, suffix := range []string{"a", "b"} {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		n := &storeNode{name: "postgres-" + suffix, port: port, dir: filepath.Join(dir, "data-"+suffix)}
		if n.fault, err = newFaultProxy(n.addr()); err != nil {
			return nil, err
		}
		n.proc = &proc{name: n.name, bin: filepath.Join(bin, "postgres"), log: filepath.Join(r.out, n.name+".log"),
			tree: true, cred: cred, env: []string{"HOME=" + dir}, args: []string{
				"-D", n.dir, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1",
				"-c", "unix_socket_directories=", "-c", "fsync=on", "-c", "synchronous_commit=on",
				"-c", "synchronous_standby_names=" + pgStandbyName, "-c", "wal_retrieve_retry_interval=500ms",
				"-c", "shared_buffers=16MB", "-c", "max_connections=60", "-c", "logging_collector=off",
			}}
		s.nodes = append(s.nodes, n)
	}
	a, b := s.nodes[0], s.nodes[1]
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", a.dir, "-U", "postgres", "--auth=trust",
		"--no-sync", "--encoding=UTF8", "--locale=C", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = append(os.Environ(), "HOME="+dir)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	psql := func(ctx context.Context, n *storeNode, sql string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-h", "127.0.0.1", "-p", strconv.Itoa(n.port), "-U", "postgres",
			"-d", "postgres", "-v", "ON_ERROR_STOP=1", "-Atc", sql)
		cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=5")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s on %s: %v: %s", sql, n.name, err, strings.TrimSpace(string(out)))
		}
		return strings.TrimSpace(string(out)), nil
	}
	s.psql = psql
	// up waits until n answers; with primary set, until it takes writes
	// and its standby is synchronous.
	up := func(ctx context.Context, n *storeNode, primary bool, d time.Duration) error {
		deadline := time.Now().Add(d)
		for {
			q := "SELECT 1"
			if primary {
				q = "SELECT NOT pg_is_in_recovery() AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = '" + pgStandbyName + "' AND sync_state = 'sync')"
			}
			got, err := psql(ctx, n, q)
			if err == nil && (got == "1" || got == "t") {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("%s: not a primary with a synchronous standby yet", n.name)
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("postgres not ready within %v: %w", d, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// follow makes n a new standby of primary: a base backup in place of
	// its data directory.
	follow := func(ctx context.Context, n, primary *storeNode) error {
		if err := os.RemoveAll(n.dir); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
			"-U", "postgres", "-D", n.dir, "-R", "-X", "stream", "--checkpoint=fast",
			"-d", "application_name="+pgStandbyName)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Env = append(os.Environ(), "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("pg_basebackup of %s: %v\n%s", primary.name, err, out)
		}
		if err := n.proc.start(); err != nil {
			return err
		}
		return up(ctx, n, false, 60*time.Second)
	}
	s.ready = func(ctx context.Context) error {
		p, _ := s.prim()
		return up(ctx, p, true, 90*time.Second)
	}
	s.forget = func(ctx context.Context) error {
		p, _ := s.prim()
		_, err := psql(ctx, p, "TRUNCATE "+pgTable)
		return err
	}
	s.failover = func(ctx context.Context, f fault) error {
		bctx := context.WithoutCancel(ctx)
		old, next := s.prim()
		// Every acknowledged commit is on the standby.
		if err := up(bctx, old, true, 60*time.Second); err != nil {
			return err
		}
		// pg_ctl stop -m immediate: SIGQUIT to the postmaster, which
		// quits with every backend, without a checkpoint.
		old.proc.signal(syscall.SIGQUIT)
		if !old.proc.waitExit(10 * time.Second) {
			old.proc.kill()
		}
		sleep(ctx, f.For/2)
		if _, err := psql(bctx, next, "SELECT pg_promote(true, 60)"); err != nil {
			return fmt.Errorf("promote %s: %w", next.name, err)
		}
		s.setPrimary(next)
		// Commits wait for a synchronous standby again: the old primary,
		// rebuilt from the new one.
		if err := follow(bctx, old, next); err != nil {
			return err
		}
		return up(bctx, next, true, 60*time.Second)
	}

	if err := a.proc.start(); err != nil {
		return s, err
	}
	if err := up(ctx, a, false, 60*time.Second); err != nil {
		return s, err
	}
	if err := follow(ctx, b, a); err != nil {
		return s, err
	}
	return s, s.ready(ctx)
}

// pgStandbyName is the application_name of the PostgreSQL standby, which
// the primary names in synchronous_standby_names.
const pgStandbyName = "standby"

// pgDSN is the proxies' connection string: both nodes, through their fault
// layers, read-write sessions only, so that a proxy finds the primary
// wherever it is.
func (s *storeSrv) pgDSN() string {
	var hosts []string
	for _, n := range s.nodes {
		hosts = append(hosts, n.fault.addr())
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write"
}

// pgTable is the proxies' table of key records: the default of
// store.postgres.table.
const pgTable = "idemproxy_keys"

// postgresBin finds the PostgreSQL server binaries: the newest
// /usr/lib/postgresql/<version>/bin (Debian's layout), else the directory of
// postgres on the PATH.
func postgresBin() (string, error) {
	ok := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres", "psql", "pg_basebackup"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return false
			}
		}
		return true
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return v }
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil && ok(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres, psql, pg_basebackup) not found: install them (apt-get install postgresql)")
}
