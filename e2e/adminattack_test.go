//go:build linux

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// adminFloodLimit is the open files limit the flooded proxies run with:
// room for server.max_connections (100) twice, the admin bound (64) and
// the reserve, so that the test needs a few thousand connections, not the
// 21,000 of the issue.
const adminFloodLimit = 600

// startLimitedProxy runs the binary on cfg with an open files limit of
// nofile (soft and hard), as prlimit sets it.
func startLimitedProxy(t *testing.T, cfg string, nofile int, env ...string) *proc {
	t.Helper()
	lim := fmt.Sprintf("--nofile=%d:%d", nofile, nofile)
	return startCmd(t, exec.Command("prlimit", lim, "--", bin, "-config", cfg), env...)
}

// adminFlood is an attack on the admin port: conns connections from the
// addresses from(i), each sending the start of a request header and, with
// trickle, one more byte every two seconds, never the header's end.
type adminFlood struct {
	name    string
	from    func(i int) string
	conns   int
	trickle bool
	// churn keeps dialing new connections until the flood stops, each of
	// 16 dialers keeping its last 100 open.
	churn bool
}

// run opens the flood's connections and keeps them until stop is closed;
// it returns when every connection is open (or refused).
func (f adminFlood) run(t *testing.T, addr string, stop <-chan struct{}, done *sync.WaitGroup) {
	t.Helper()
	var mu sync.Mutex
	var open []net.Conn
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= f.conns {
					return
				}
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(f.from(i))}, Timeout: 5 * time.Second}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					continue // the backlog is full: the kernel refused it
				}
				c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: admin\r\nX-Slow: "))
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if f.churn {
		for w := range 16 {
			done.Add(1)
			go func() {
				defer done.Done()
				var ring []net.Conn
				defer func() {
					for _, c := range ring {
						c.Close()
					}
				}()
				for i := w; ; i += 16 {
					select {
					case <-stop:
						return
					default:
					}
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(f.from(i))}, Timeout: 5 * time.Second}
					c, err := d.Dial("tcp", addr)
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: admin\r\nX-Slow: "))
					if ring = append(ring, c); len(ring) > 100 {
						ring[0].Close()
						ring = ring[1:]
					}
				}
			}()
		}
	}
	done.Add(1)
	go func() {
		defer done.Done()
		defer func() {
			for _, c := range open {
				c.Close()
			}
		}()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			if f.trickle {
				for _, c := range open {
					c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
					c.Write([]byte("a"))
				}
			}
		}
	}()
}

// TestAdminFloodDoesNotStarveCharges is the attack, scaled down:
// thousands of connections to the admin port that never finish a request
// (from one address, or trickling a byte every two seconds from many),
// against a proxy whose open files limit holds its connection bounds. The
// admin port holds at most admin.max_connections of them; charges through
// the main port are served (no "too many open files", no 502); /readyz and
// /metrics are answered to a client of another address, promptly enough
// for a Kubernetes probe.
func TestAdminFloodDoesNotStarveCharges(t *testing.T) {
	for _, f := range []adminFlood{
		{name: "slowloris from one address", from: func(int) string { return "127.0.0.1" }, conns: 3000},
		{name: "a byte every 2s from 200 addresses", from: func(i int) string { return fmt.Sprintf("127.0.1.%d", 1+i%200) },
			conns: 2000, trickle: true},
		{name: "reconnecting all the time from 200 addresses", from: func(i int) string { return fmt.Sprintf("127.0.2.%d", 1+i%200) },
			conns: 1000, churn: true},
	} {
		t.Run(f.name, func(t *testing.T) {
			up := startStub(t)
			dir := t.TempDir()
			cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
				serverLimits(100), chargesRoute)
			p := startLimitedProxy(t, cfg, adminFloodLimit, "IDEMPROXY_ADMIN_TOKEN=s3cret")
			pid := p.cmd.Process.Pid
			if r := charge(p, "ORD-FLOOD-0"); r.status != 201 {
				t.Fatalf("charge before the flood = %d %s %v", r.status, r.body, r.err)
			}

			stop := make(chan struct{})
			var done sync.WaitGroup
			t.Cleanup(func() { close(stop); done.Wait() })
			f.run(t, p.admin, stop, &done)
			if n := socketsOf(pid); n >= adminFloodLimit-100 {
				t.Errorf("the proxy holds %d sockets with %d admin connections attempted, want far below its limit %d",
					n, f.conns, adminFloodLimit)
			}
			var slowest time.Duration
			defer func() {
				t.Logf("slowest probe answer during the flood: %v; proxy sockets: %d", slowest, socketsOf(pid))
			}()
			for i := range 5 {
				// The trickles (a byte every 2 s) and the churn go on
				// meanwhile: the last probes come after a trickle.
				time.Sleep(500 * time.Millisecond)
				if r := charge(p, "ORD-FLOOD-"+strconv.Itoa(i+1)); r.status != 201 {
					t.Errorf("charge %d during the flood = %d %s %v, want 201", i+1, r.status, r.body, r.err)
				}
				for _, path := range []string{"/readyz", "/metrics"} {
					from := fmt.Sprintf("127.0.0.%d", 2+i)
					start := time.Now()
					st, _, err := h2attack.GetFrom(t, from, p.admin, path)
					// A Kubernetes probe waits timeoutSeconds (default 1,
					// 2 in deploy/kubernetes): generous for a loaded machine.
					took := time.Since(start)
					slowest = max(slowest, took)
					if err != nil || st != 200 || took > 10*time.Second {
						t.Errorf("%s from %s during the flood = %d %v after %v, want 200 at once", path, from, st, err, took)
					}
				}
			}
			if n := socketsOf(pid); n >= adminFloodLimit-100 {
				t.Errorf("the proxy holds %d sockets, want far below its limit %d", n, adminFloodLimit)
			}
			for _, l := range strings.Split(p.log.String(), "\n") {
				if strings.Contains(l, "too many open files") {
					t.Errorf("the proxy ran out of descriptors: %s", l)
					break
				}
			}
			// Scraped from an address of its own: the flood's take the place
			// of each other.
			_, scrape, err := h2attack.GetFrom(t, "127.0.0.9", p.admin, "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			value := func(series string) float64 {
				v, _ := metricValue(scrape, series)
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s = %q: %v", series, v, err)
				}
				return f
			}
			if got := value("idemproxy_admin_connections_open"); got > 64 {
				t.Errorf("idemproxy_admin_connections_open = %v, want at most admin.max_connections (64)", got)
			}
			if got := value("idemproxy_admin_connections_refused_total") + value("idemproxy_admin_connections_shed_total"); got < float64(f.conns/2) {
				t.Errorf("admin connections refused + shed = %v, want most of the %d of the flood", got, f.conns)
			}
		})
	}
}

// TestOpenFilesLimitBelowTheBounds: a limit of open files that the
// connection bounds do not fit in is a warning at start, naming what to
// change.
func TestOpenFilesLimitBelowTheBounds(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	for _, tt := range []struct {
		nofile int
		warn   bool
	}{{adminFloodLimit, false}, {400, true}} {
		cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"+strconv.Itoa(tt.nofile)),
			serverLimits(100), chargesRoute)
		p := startLimitedProxy(t, cfg, tt.nofile)
		lines := p.log.logLines("the open files limit is below what the connection limits may take: lower server.max_connections " +
			"(each client connection may hold an upstream connection too) or raise the limit (ulimit -n, the container's nofile)")
		if got := len(lines) == 1; got != tt.warn {
			t.Errorf("limit %d: warned %v, want %v\n%s", tt.nofile, got, tt.warn, p.log)
		}
		if tt.warn && len(lines) == 1 {
			if lines[0]["needed"] != float64(2*100+1+256+64+1) || lines[0]["limit"] != float64(tt.nofile) {
				t.Errorf("warning = %v, want limit %d, needed %d", lines[0], tt.nofile, 2*100+1+256+64+1)
			}
		}
	}
}

// clientFrom is an HTTP client whose connections come from the loopback
// address from.
func clientFrom(from string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestAdminTokenGuessing: the burst of wrong admin tokens, against
// the real binary. After a few 401s the guessing address gets 429
// too-many-auth-failures with Retry-After, its correct token too; another
// address's correct token is served; the failures are counted and logged
// at a bounded rate.
func TestAdminTokenGuessing(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN=s3cret-token")
	guesser := clientFrom("127.0.0.1")
	statuses := map[int]int{}
	var last result
	for i := range 500 {
		r, _ := doWith(guesser, "GET", p.adminURL("/v1/keys/charges/ORD-1"), "", "Authorization", "Bearer guess-"+strconv.Itoa(i))
		if r.err != nil {
			t.Fatalf("guess %d: %v", i, r.err)
		}
		statuses[r.status]++
		last = r
	}
	if statuses[401] < 3 || statuses[401] > 10 || statuses[429] != 500-statuses[401] {
		t.Errorf("500 wrong tokens answered %v, want a few 401 and the rest 429", statuses)
	}
	if last.status != 429 || problemType(last) != "too-many-auth-failures" {
		t.Errorf("the last guess = %d %s, want 429 too-many-auth-failures", last.status, last.body)
	}
	if ra, err := strconv.Atoi(last.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Errorf("Retry-After = %q, want 1 to 60 seconds", last.header.Get("Retry-After"))
	}
	if r, _ := doWith(guesser, "GET", p.adminURL("/v1/keys/charges/ORD-1"), "", "Authorization", "Bearer s3cret-token"); r.status != 429 {
		t.Errorf("the correct token from the guessing address = %d %s, want 429 (no oracle)", r.status, r.body)
	}
	if r, _ := doWith(clientFrom("127.0.0.2"), "GET", p.adminURL("/v1/keys/charges/ORD-1"), "", "Authorization", "Bearer s3cret-token"); r.status != 404 || problemType(r) != "no-record" {
		t.Errorf("the correct token from another address = %d %s, want 404 no-record", r.status, r.body)
	}
	_, scrape, err := h2attack.GetFrom(t, "127.0.0.3", p.admin, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := metricValue(scrape, "idemproxy_admin_auth_failures_total"); v != strconv.Itoa(statuses[401]) {
		t.Errorf("idemproxy_admin_auth_failures_total = %q, want %d", v, statuses[401])
	}
	if v, _ := metricValue(scrape, "idemproxy_admin_auth_throttled_total"); v != strconv.Itoa(statuses[429]+1) {
		t.Errorf("idemproxy_admin_auth_throttled_total = %q, want %d", v, statuses[429]+1)
	}
	if n := len(p.log.logLines("admin authentication failed")); n < 1 || n > statuses[401] {
		t.Errorf("%d log lines of failed authentications, want 1 to %d", n, statuses[401])
	}
	if strings.Contains(p.log.String(), "guess-") {
		t.Errorf("the log holds a guessed token")
	}
}
