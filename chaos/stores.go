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
	"syscall"
	"time"
)

// storeSrv is a shared store server of the run (Redis or PostgreSQL), the
// replicas' fault layer in front of it, and how to tell it is up.
type storeSrv struct {
	name  string // redis or postgres: in the fault kinds
	proc  *proc
	addr  string
	fault *faultProxy
	ready func(ctx context.Context) error
	// forget makes the server lose every key it holds and serve again:
	// Redis restarted without its files, PostgreSQL's table truncated.
	forget func(ctx context.Context) error
}

// startRedis starts redis-server with the append-only file, synced on every
// write, as the README recommends.
func (r *run) startRedis(ctx context.Context) (*storeSrv, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found: install it (apt-get install redis-server)")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(r.out, "redis")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &storeSrv{name: "redis", addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.proc = &proc{name: "redis", bin: bin, log: filepath.Join(r.out, "redis.log"), args: []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--daemonize", "no",
		"--protected-mode", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--maxmemory-policy", "noeviction",
	}}
	s.ready = func(ctx context.Context) error { return waitRedis(ctx, s.addr, 20*time.Second) }
	s.forget = func(ctx context.Context) error {
		// As a Redis without persistence, or whose volume was lost,
		// comes back from a crash: empty.
		s.proc.kill()
		files, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, f := range files {
			if err := os.RemoveAll(filepath.Join(dir, f.Name())); err != nil {
				return err
			}
		}
		if err := s.proc.start(); err != nil {
			return err
		}
		return s.ready(ctx)
	}
	return s, r.launchStore(ctx, s)
}

// startPostgres creates a PostgreSQL cluster (initdb) in the run's folder
// and starts it, durable (fsync on, synchronous_commit on), as the postgres
// user when the run is root (initdb and postgres refuse root).
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
	sock := filepath.Join(dir, "sock")
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return nil, err
	}
	for _, d := range []string{dir, sock} {
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, err
		}
		if cred != nil {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"--no-sync", "--encoding=UTF8", "--locale=C", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = append(os.Environ(), "HOME="+dir)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &storeSrv{name: "postgres", addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.proc = &proc{name: "postgres", bin: filepath.Join(bin, "postgres"), log: filepath.Join(r.out, "postgres.log"),
		tree: true, cred: cred, env: []string{"HOME=" + dir}, args: []string{
			"-D", data, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + sock, "-c", "fsync=on", "-c", "synchronous_commit=on",
			"-c", "shared_buffers=16MB", "-c", "max_connections=60", "-c", "logging_collector=off",
		}}
	psql := filepath.Join(bin, "psql")
	s.ready = func(ctx context.Context) error {
		deadline := time.Now().Add(60 * time.Second)
		for {
			cmd := exec.CommandContext(ctx, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres",
				"-d", "postgres", "-Atc", "SELECT 1")
			cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=5")
			out, err := cmd.CombinedOutput()
			if err == nil {
				return nil
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("postgres on port %d not ready: %v: %s", port, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.forget = func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres",
			"-d", "postgres", "-v", "ON_ERROR_STOP=1", "-Atc", "TRUNCATE "+pgTable)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("truncate %s: %v: %s", pgTable, err, out)
		}
		return nil
	}
	return s, r.launchStore(ctx, s)
}

// pgTable is the proxies' table of key records: the default of
// store.postgres.table.
const pgTable = "idemproxy_keys"

// launchStore starts s, waits until it is up and puts its fault layer in
// front of it.
func (r *run) launchStore(ctx context.Context, s *storeSrv) error {
	if err := s.proc.start(); err != nil {
		return err
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	var err error
	s.fault, err = newFaultProxy(s.addr)
	return err
}

// postgresBin finds the PostgreSQL server binaries: the newest
// /usr/lib/postgresql/<version>/bin (Debian's layout), else the directory of
// postgres on the PATH.
func postgresBin() (string, error) {
	ok := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres", "psql"} {
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
	return "", errors.New("PostgreSQL server binaries (initdb, postgres, psql) not found: install them (apt-get install postgresql)")
}
