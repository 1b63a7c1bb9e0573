// Package pgtest starts real PostgreSQL servers for tests. It never fakes
// PostgreSQL: the PostgreSQL tests are required, so a machine without the
// server binaries fails them with a clear message instead of skipping.
//
// Each Server is its own cluster: a copy of a freshly initialised one (the
// template, below) in a fresh directory, then the
// postgres process as a child of the test binary on a free loopback port,
// with trust authentication for the "postgres" role over 127.0.0.1 and its
// Unix socket in the same directory. fsync is off unless the caller turns it
// on, which keeps the data across Stop, Kill and Start (the operating system
// keeps the written pages) but not across a machine crash.
//
// initdb and postgres refuse to run as root. When the tests run as root the
// harness runs them as the "postgres" user (created by Debian's postgresql
// package) in a directory it owns; otherwise they run as the current user.
//
// initdb costs a second or two of CPU, paid once: the first Start on a
// machine initialises a template cluster in the temporary directory
// (testrun.CacheDir: outside a test run's own directory, which is removed
// when the run ends), named for the server binaries and their version, its owner and
// initdb's arguments (pgtest-template-...), and every Start copies it
// (cp -a). The template
// is never started; it is kept, as a build cache is, for the next test
// process, and made again if removed.
//
// The harness drives the server with the PostgreSQL binaries only (psql for
// readiness and Exec), so that it does not depend on the client library
// under test.
package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/freeport"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

const (
	// startAttempts bounds the retries when a chosen port is taken between
	// probing it and postgres binding it.
	startAttempts = 8
	// readyTimeout bounds the wait for a started server to answer a query.
	readyTimeout = 30 * time.Second
	// stopTimeout bounds a fast shutdown before Stop resorts to SIGKILL.
	stopTimeout = 30 * time.Second
	// User is the superuser role of every test cluster; it needs no password
	// over loopback.
	User = "postgres"
)

const notFound = "PostgreSQL server binaries (initdb, postgres, psql) not found: install them " +
	"(apt-get install postgresql); the PostgreSQL tests are required"

// Server is one PostgreSQL cluster whose postmaster is a child of the test
// binary, listening on a loopback port.
type Server struct {
	tb       testing.TB
	bin      string // directory holding initdb, postgres and psql
	dir      string // root of the server's files, removed at cleanup
	port     int
	settings []string
	cred     *runAs // nil: run as the current user

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start creates a new cluster and starts it on a free loopback port, waiting
// until it answers a query from the data directory it was started on (so a
// foreign server that holds the port is never mistaken for it). Settings are
// "name=value" server parameters passed as -c after the harness' defaults
// (fsync=off, full_page_writes=off, a small shared_buffers), so they override
// them: "fsync=on" asks for durable writes. The server is killed and its
// files removed when the test ends.
func Start(tb testing.TB, settings ...string) *Server {
	tb.Helper()
	s := newServer(tb, settings)
	s.initdb()
	s.launch()
	return s
}

// StartStandby starts a streaming-replication standby of primary: a base
// backup of it (pg_basebackup -R) started on a free loopback port, read-only
// and in recovery, following the primary asynchronously unless the primary
// lists it in synchronous_standby_names (its application_name is
// ApplicationName, "standby" by default; settings may change it, as
// "primary_conninfo=..."). Promote turns it into a primary. Settings are as
// for Start.
func StartStandby(tb testing.TB, primary *Server, settings ...string) *Server {
	tb.Helper()
	s := newServer(tb, settings)
	cmd := exec.Command(filepath.Join(s.bin, "pg_basebackup"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port()), "-U", User,
		"-D", s.Dir(), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
		"-d", fmt.Sprintf("application_name=%s", ApplicationName))
	cmd.Dir = s.dir
	s.asServerUser(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: pg_basebackup of the primary on port %d: %v\n%s", primary.Port(), err, out)
	}
	s.launch()
	return s
}

// ApplicationName is the name a standby started by StartStandby reports to
// its primary, for synchronous_standby_names.
const ApplicationName = "standby"

// Promote promotes a standby to a primary (pg_promote) and waits until it
// takes writes.
func (s *Server) Promote() {
	s.tb.Helper()
	if _, err := s.psql(readyTimeout, "SELECT pg_promote(true, 30)"); err != nil {
		s.tb.Fatalf("pgtest: promote: %v", err)
	}
}

// newServer prepares a Server with its own directory, removed (and the
// server killed) when the test ends.
func newServer(tb testing.TB, settings []string) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: binDir(tb), settings: settings}
	s.cred = credential(tb)
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		tb.Fatalf("pgtest: create directory: %v", err)
	}
	s.dir = dir
	tb.Cleanup(s.cleanup)
	// The directory must belong to the server's user, and no one else may
	// read it (postgres refuses a data directory with group or other access).
	if err := os.Chmod(dir, 0o700); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			tb.Fatalf("pgtest: give %s to the postgres user: %v", dir, err)
		}
	}
	return s
}

// launch starts s on a free port, trying another one when the chosen port
// was taken in the meantime.
func (s *Server) launch() {
	s.tb.Helper()
	var errs []error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			s.tb.Fatalf("pgtest: %v", err)
		}
		s.port = port
		if err = s.start(); err == nil {
			return
		}
		errs = append(errs, err)
	}
	s.tb.Fatalf("pgtest: could not start postgres after %d attempts: %v", startAttempts, errors.Join(errs...))
}

// DSN returns a connection string for the superuser on the server's
// "postgres" database over TCP, without TLS.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", User, s.port)
}

// DSNAs returns a connection string like DSN for role on database db, with
// password pw when not empty (trust authentication accepts any).
func (s *Server) DSNAs(role, pw, db string) string {
	auth := role
	if pw != "" {
		auth += ":" + pw
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", auth, s.port, db)
}

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's data directory.
func (s *Server) Dir() string { return filepath.Join(s.dir, "data") }

// PID returns the process id of the running postmaster, or 0 when the server
// is stopped. Its backends are its children.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop shuts the server down cleanly (fast shutdown: open sessions are
// ended) and waits for it to exit; if it has not exited after 30s it is
// killed. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	s.continueLocked() // a paused server must run to shut down
	select {
	case <-s.done:
		s.cmd, s.done = nil, nil
	case <-time.After(stopTimeout):
		s.killLocked()
	}
}

// Kill kills the postmaster and all its backends with SIGKILL, as a crash of
// the database host would, and waits for the postmaster to exit. The next
// Start runs crash recovery. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Start starts a stopped or killed server again on the same port with the
// same data (so its rows are kept) and waits until it answers. A running
// server is stopped first. A foreign process that took the freed port fails
// the test.
func (s *Server) Start() {
	s.tb.Helper()
	s.Stop()
	var err error
	// The port and the old shared memory were ours a moment ago; retry
	// briefly in case the kernel is slow to release them.
	for range startAttempts {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	s.tb.Fatalf("pgtest: restart on port %d: %v", s.port, err)
}

// Exec runs sql (one or more statements) with psql as the superuser on the
// "postgres" database and returns its unaligned, tuples-only output without
// the trailing newline; rows are separated by newlines, columns by "|". An
// error of psql or of a statement is returned with psql's message.
func (s *Server) Exec(sql string) (string, error) {
	return s.psql(5*time.Second, sql)
}

// MustExec is Exec that fails the test on an error.
func (s *Server) MustExec(sql string) string {
	s.tb.Helper()
	out, err := s.Exec(sql)
	if err != nil {
		s.tb.Fatalf("pgtest: %s: %v", sql, err)
	}
	return out
}

func (s *Server) psql(timeout time.Duration, sql string) (string, error) {
	cmd := exec.Command(filepath.Join(s.bin, "psql"),
		"-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
		"-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", User, "-d", "postgres",
		"-c", sql)
	cmd.Env = append(os.Environ(),
		"PGCONNECT_TIMEOUT="+strconv.Itoa(max(int(timeout/time.Second), 2)),
		"PGOPTIONS=-c statement_timeout="+strconv.Itoa(int(timeout/time.Millisecond)),
		"PGSSLMODE=disable")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("psql: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSuffix(stdout.String(), "\n"), nil
}

// initdbArgs are initdb's arguments after -D: what every cluster the
// harness starts is made with.
var initdbArgs = []string{"-U", User, "--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C", "--no-instructions"}

// templates serialises the making of the template clusters in this
// process; other processes race on the final rename, which one wins.
// versions, under it, holds each server binary directory's
// `postgres --version`, asked once per process.
var (
	templates sync.Mutex
	versions  = map[string][]byte{}
)

// initdb makes s's data directory: a copy of the template cluster, made
// first if there is none.
func (s *Server) initdb() {
	s.tb.Helper()
	tpl, err := s.template()
	if err != nil {
		s.tb.Fatalf("pgtest: %v", err)
	}
	if out, err := exec.Command("cp", "-a", tpl, s.Dir()).CombinedOutput(); err != nil {
		s.tb.Fatalf("pgtest: copy the template cluster %s: %v\n%s", tpl, err, out)
	}
}

// template returns the directory of the template cluster for s's binaries
// and owner, initialising it (initdb into a directory of its own, then a
// rename, so that no process ever sees half a template) when there is
// none.
func (s *Server) template() (string, error) {
	templates.Lock()
	defer templates.Unlock()
	owner := os.Getuid()
	if s.cred != nil {
		owner = int(s.cred.Uid)
	}
	// The server's own version names the template too: binaries upgraded
	// in place get a template of their own.
	ver, ok := versions[s.bin]
	if !ok {
		out, err := exec.Command(filepath.Join(s.bin, "postgres"), "--version").Output()
		if err != nil {
			return "", fmt.Errorf("postgres --version: %w", err)
		}
		ver, versions[s.bin] = out, out
	}
	h := fnv.New32a()
	h.Write([]byte(s.bin + "\x00" + string(ver) + "\x00" + strings.Join(initdbArgs, "\x00")))
	name := fmt.Sprintf("pgtest-template-%d-%x", owner, h.Sum32())
	tpl := filepath.Join(testrun.CacheDir(), name)
	if _, err := os.Stat(filepath.Join(tpl, "PG_VERSION")); err == nil {
		return tpl, nil
	}
	work, err := os.MkdirTemp("", name+".new-")
	if err != nil {
		return "", fmt.Errorf("template cluster: %w", err)
	}
	defer os.RemoveAll(work) // what is left when the rename did not happen
	if s.cred != nil {
		if err := os.Chown(work, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return "", fmt.Errorf("give %s to the postgres user: %w", work, err)
		}
	}
	data := filepath.Join(work, "data")
	cmd := exec.Command(filepath.Join(s.bin, "initdb"), append([]string{"-D", data}, initdbArgs...)...)
	cmd.Dir = work
	s.asServerUser(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := os.Rename(data, tpl); err != nil {
		if _, statErr := os.Stat(filepath.Join(tpl, "PG_VERSION")); statErr == nil {
			return tpl, nil // another process made it first
		}
		return "", fmt.Errorf("template cluster: %w", err)
	}
	return tpl, nil
}

func (s *Server) start() error {
	sock := filepath.Join(s.dir, "sock")
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return err
	}
	if s.cred != nil {
		if err := os.Chown(sock, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	args := []string{
		"-D", s.Dir(),
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + sock,
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=16MB",
		"-c", "max_connections=100",
		"-c", "logging_collector=off",
	}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	s.asServerUser(cmd)
	// Its own process group, and killed by the kernel if the test binary
	// dies without running its cleanups (its backends then exit on their
	// own when they notice the postmaster is gone; under testrun the PID
	// namespace ends them too).
	testrun.SetProcAttr(cmd)
	err = cmd.Start()
	_ = log.Close()
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
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
			s.mu.Lock()
			s.cmd, s.done = nil, nil
			s.mu.Unlock()
			return fmt.Errorf("postgres on port %d exited: %s", s.port, s.logTail())
		default:
		}
		got, err := s.psql(2*time.Second, "SELECT current_setting('data_directory')")
		if err == nil {
			if got == s.Dir() {
				return nil
			}
			s.Kill()
			return fmt.Errorf("port %d is held by another postgres (data directory %q, ours is %q)", s.port, got, s.Dir())
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("postgres on port %d did not answer within %v (last: %v): %s",
				s.port, readyTimeout, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) asServerUser(cmd *exec.Cmd) {
	if s.cred == nil {
		return
	}
	setRunAs(cmd, s.cred)
	cmd.Env = append(os.Environ(), "HOME="+s.dir, "USER="+User, "LOGNAME="+User)
}

func (s *Server) cleanup() {
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	if s.tb.Failed() {
		s.tb.Logf("pgtest: log of postgres on port %d:\n%s", s.port, s.logTail())
	}
	if err := os.RemoveAll(s.dir); err != nil {
		s.tb.Errorf("pgtest: remove %s: %v", s.dir, err)
	}
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

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

// binDir finds the directory of the PostgreSQL server binaries: $PGTEST_BIN
// when set, else the newest /usr/lib/postgresql/<version>/bin (Debian's
// layout), else the directory of postgres on $PATH.
func binDir(tb testing.TB) string {
	tb.Helper()
	ok := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres", "psql"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("PGTEST_BIN"); dir != "" {
		if !ok(dir) {
			tb.Fatalf("pgtest: PGTEST_BIN=%s lacks initdb, postgres or psql", dir)
		}
		return dir
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if ok(dir) {
			return dir
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil && ok(filepath.Dir(p)) {
		return filepath.Dir(p)
	}
	tb.Fatal(notFound)
	return ""
}

// version returns the major version in /usr/lib/postgresql/<version>/bin.
func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// credential returns the postgres user's credential when the tests run as
// root (initdb and postgres refuse root), nil otherwise.
func credential(tb testing.TB) *runAs {
	tb.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(User)
	if err != nil {
		tb.Fatalf("pgtest: running as root, and initdb refuses root: the %q user is missing (%v); "+
			"install the postgresql package, which creates it", User, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		tb.Fatalf("pgtest: user %q has a non-numeric uid %q or gid %q", User, u.Uid, u.Gid)
	}
	return &runAs{Uid: uint32(uid), Gid: uint32(gid)}
}

// freePort returns a loopback TCP port that was free a moment ago, outside
// the ephemeral range so that Start after Stop finds it free again.
func freePort() (int, error) { return freeport.Pick(0) }
