// Package e2e holds the process-level tests: they build the idemproxy
// binary once (TestMain) and run it for real, against real upstreams and
// stores, where a crash, a signal, a disk or a connection limit is the
// point, and they keep the docs in step with what the binary does. Unit
// tests live beside their code; while working, run them without this
// package (CONTRIBUTING.md says how).
//
// A test that uses only its own resources (free ports, its t.TempDir, its
// own stub, Redis, PostgreSQL, mounts and proxy processes) and measures
// nothing calls t.Parallel: TestMain runs up to six of them at once. A
// test that asserts on latency, load, timeouts under load, CPU, memory,
// socket counts or limits, or that changes the test process (its rlimits,
// environment or working directory), stays serial: Go runs the serial
// tests first, one at a time, and the parallel ones only after them, so
// each serial test waits for events (a counter, a log line), not for a
// fixed time, and keeps its load short.
//
// The soaks run only in the long run, built with -tags long (.ci/run runs
// it): TestTenThousandRoutesScrapeStaysSmall (routes_scale_long_test.go),
// and TestDiskFillsInOneBurst's full count of fills (20 on each file
// system; 4 without the tag). Everything they assert is asserted the same
// way there; a plain go test leaves out only their length.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// bin is the idemproxy binary built once for the tests that need a real
// process (crash, signals, the exit status).
var bin string

func TestMain(m *testing.M) {
	// Under testrun's supervisor: no proxy, server, browser or mount of
	// these tests outlives the test binary, even when it is killed.
	testrun.Isolate()
	dir, err := os.MkdirTemp("", "idemproxy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	flag.Parse()
	raiseParallel(6)
	// The tests build the command at the repository's root and read its
	// docs, deploy files and example configuration by their paths there.
	if err := os.Chdir(".."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Mkdir(filepath.Join(dir, "static"), 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	waitStatic := startStaticBuild(filepath.Join(dir, "static"))
	bin = filepath.Join(dir, "idemproxy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	waitStatic()
	os.RemoveAll(dir)
	os.Exit(code)
}

// raiseParallel sets -test.parallel to n unless the command line set it.
// The parallel tests here mostly wait (on the processes they started, on
// timeouts and sleeps) and use little CPU, so the default, GOMAXPROCS (2
// on a small machine), would leave the machine idle while they run one
// or two at a time. The tests that measure latency, CPU, sockets or
// limits do not call t.Parallel: they run first, alone, and never
// overlap these. A -parallel given to go test still wins.
func raiseParallel(n int) {
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	set := false
	flag.Visit(func(v *flag.Flag) { set = set || v.Name == f.Name })
	if !set {
		if err := f.Value.Set(strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logLines returns the JSON log lines whose msg is msg.
func (b *syncBuffer) logLines(msg string) []map[string]any {
	return logLinesOf(b.String(), msg)
}

// fileLog is a process's standard error written straight into a file: a
// line the process wrote before it answered a request is there when the
// test reads the answer, which a pipe copied by a goroutine does not
// promise.
type fileLog struct{ f *os.File }

// newFileLog creates the file in the test's temporary directory.
func newFileLog(t *testing.T) *fileLog {
	f, err := os.CreateTemp(t.TempDir(), "stderr-*.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &fileLog{f}
}

// String returns what the process wrote so far.
func (l *fileLog) String() string {
	b, err := os.ReadFile(l.f.Name())
	if err != nil {
		return fmt.Sprintf("(the log could not be read: %v)", err)
	}
	return string(b)
}

// logLines returns the JSON log lines whose msg is msg.
func (l *fileLog) logLines(msg string) []map[string]any {
	return logLinesOf(l.String(), msg)
}

// logLinesOf returns the JSON lines of text whose msg is msg.
func logLinesOf(text, msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// proc is a running idemproxy binary.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	log     *fileLog
	addr    string // proxy address
	admin   string // admin address
	exited  chan struct{}
	exitErr error
}

// startProxy runs the binary on the configuration file cfgPath, with env
// added to its environment, and waits until it listens.
func startProxy(t *testing.T, cfgPath string, env ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(bin, "-config", cfgPath), env...)
}

// startCmd runs cmd, which runs the binary, with env added to its
// environment, and waits until it listens.
func startCmd(t *testing.T, cmd *exec.Cmd, env ...string) *proc {
	t.Helper()
	p := &proc{t: t, log: newFileLog(t), exited: make(chan struct{}), cmd: cmd}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.log.f
	// It dies with the test binary, and its process group (prlimit's, or
	// anything it starts) with the test.
	testrun.SetProcAttr(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		testrun.KillGroup(p.cmd)
		<-p.exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if l := p.log.logLines("idemproxy listening"); len(l) > 0 {
			p.addr = l[0]["addr"].(string)
			if a := p.log.logLines("admin listening"); len(a) > 0 {
				p.admin = a[0]["addr"].(string)
			}
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("idemproxy exited before listening: %v\n%s", p.exitErr, p.log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("idemproxy did not listen within 20s:\n%s", p.log)
		}
	}
}

// signal sends sig and returns a channel closed when the process exits.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("idemproxy did not exit within 30s:\n%s", p.log)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) url(path string) string      { return "http://" + p.addr + path }
func (p *proc) adminURL(path string) string { return "http://" + p.admin + path }

// startStub serves the real upstream stub in-process.
func startStub(t *testing.T) *httptest.Server {
	s := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(s.Close)
	return s
}

// writeConfig writes a configuration for upstream and the Badger dir, with
// the given routes and extra top-level YAML, and returns its path.
func writeConfig(t *testing.T, path, upstream, dir, extra, routes string) string {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  badger:
    dir: %s
%s
routes:
%s`, upstream, dir, extra, routes)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func do(method, url, body string, hdr ...string) result {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return result{err: err}
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// doWith sends one request with c, as h2attack.Do does, and returns its
// answer as a result, and the protocol's major version.
func doWith(c *http.Client, method, url, body string, hdr ...string) (result, int) {
	r, proto := h2attack.Do(c, method, url, body, hdr...)
	return result{status: r.Status, header: r.Header, body: r.Body, err: r.Err}, proto
}

// chargeCount returns how many times the stub charged order.
func chargeCount(t *testing.T, stubURL, order string) int {
	t.Helper()
	r := do("GET", stubURL+"/orders/"+order+"/charges", "")
	var st struct{ Charges int }
	if err := json.Unmarshal([]byte(r.body), &st); err != nil {
		t.Fatalf("statement: %v %s", r.err, r.body)
	}
	return st.Charges
}

// eventually waits, at most 30 s, for cond (h2attack.Eventually).
var eventually = h2attack.Eventually

// scrapeValue reads one series of the proxy's /metrics as a number.
func scrapeValue(t *testing.T, p *proc, series string) float64 {
	t.Helper()
	v, ok := metricValue(do("GET", p.adminURL("/metrics"), "").body, series)
	if !ok {
		t.Fatalf("/metrics has no %s", series)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s = %q: %v", series, v, err)
	}
	return f
}

// serverLimits is a server: section of a configuration with
// max_connections max (none when 0) and the further fields more, each a
// "name: value" line.
func serverLimits(max int, more ...string) string {
	s := "server:\n"
	if max > 0 {
		s += fmt.Sprintf("  max_connections: %d\n", max)
	}
	for _, m := range more {
		s += "  " + m + "\n"
	}
	return s
}

// holdingUpstream answers GET /hold once release is closed, counting the
// requests it holds; anything else at once, echoing what it saw of the
// Upgrade headers.
type holdingUpstream struct {
	*httptest.Server
	held    atomic.Int32
	release chan struct{}
	mu      sync.Mutex
	seen    []http.Header
}

// startHoldingUpstream starts one; it releases what it holds and closes
// when the test ends.
func startHoldingUpstream(t *testing.T) *holdingUpstream {
	u := &holdingUpstream{release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Header.Clone())
		u.mu.Unlock()
		if r.URL.Path == "/hold" {
			u.held.Add(1)
			<-u.release
		}
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
		u.Close()
	})
	return u
}

// procCPU returns the CPU time a process has used (user and system), read
// from /proc; zero where there is none (on systems other than Linux).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
