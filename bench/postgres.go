//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pgServer is a PostgreSQL server started for one bench target: its own
// cluster in a temporary directory, on a loopback port.
type pgServer struct {
	dir  string // removed by cleanup
	addr string
	cmd  *exec.Cmd
}

// dsn is the connection string of the server's superuser database.
func (s *pgServer) dsn() string {
	return "postgres://postgres@" + s.addr + "/postgres?sslmode=disable"
}

// pgBinDir finds Debian's server binaries: the directory of initdb on the
// PATH, else the newest /usr/lib/postgresql/*/bin; empty when there is none.
func pgBinDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "postgres")); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgMajor(a) - pgMajor(b) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// pgMajor is the major version in a path such as /usr/lib/postgresql/15/bin.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// pgCredential is who runs initdb and postgres: they refuse to run as root,
// so root runs them as the postgres user (Debian's package creates it);
// nil means the current user.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("initdb refuses to run as root and there is no postgres user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startPostgres creates a cluster in a new temporary directory and starts
// its server on a free loopback port, through start (so that it is stopped
// with the other processes), and waits until it accepts connections. The
// server keeps fsync on: synchronous_commit is what the targets compare.
// Once the server started, the server is returned even with an error, for
// its directory to be removed.
func startPostgres(binDir string, start func(cmd *exec.Cmd) error) (*pgServer, error) {
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	// Not under the bench's own temporary directory: that one is 0700 and
	// owned by whoever runs the bench, which the postgres user may not be.
	dir, err := os.MkdirTemp("", "idemproxy-bench-pg")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &pgServer{dir: dir, addr: freeAddr()}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(binDir, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	_, port, _ := strings.Cut(s.addr, ":")
	s.cmd = exec.Command(filepath.Join(binDir, "postgres"), "-D", data, "-p", port,
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir)
	s.cmd.SysProcAttr = procAttr(cred)
	if err := start(s.cmd); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// From here on the caller stops the server and removes dir.
	if err := s.waitReady(filepath.Join(binDir, "pg_isready"), port); err != nil {
		return s, err
	}
	return s, nil
}

// waitReady waits until pg_isready says the server accepts connections.
func (s *pgServer) waitReady(pgIsReady, port string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command(pgIsReady, "-q", "-h", "127.0.0.1", "-p", port, "-U", "postgres").CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres on %s not ready within 30s: %w %s", s.addr, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanup removes the cluster's directory; the server must have stopped.
func (s *pgServer) cleanup() error { return os.RemoveAll(s.dir) }

// pgCPUTime is the CPU time of a PostgreSQL server: the postmaster's own,
// that of its children that exited (cutime and cstime, which the postmaster
// reaps) and that of its children still running (the connections'
// backends, the writers, autovacuum).
func pgCPUTime(postmaster int) time.Duration {
	total := cpuTime(postmaster) + childCPUTime(postmaster)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if ppid, err := parentPID(pid); err == nil && ppid == postmaster {
			total += cpuTime(pid)
		}
	}
	return total
}

// statFields returns the fields of /proc/<pid>/stat after the command name,
// the first being the state (field 3).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return nil, errors.New("short /proc stat")
	}
	return f, nil
}

func parentPID(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// childCPUTime is the user+system time of a process's waited-for children.
func childCPUTime(pid int) time.Duration {
	f, err := statFields(pid)
	if err != nil {
		return 0
	}
	cut, _ := strconv.ParseInt(f[13], 10, 64)
	cst, _ := strconv.ParseInt(f[14], 10, 64)
	return time.Duration(cut+cst) * time.Second / clkTck
}
