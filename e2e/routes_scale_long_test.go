//go:build linux && long

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// scrape fetches /metrics in the text format and returns its size, its
// line count, its body and how long it took.
func scrape(t *testing.T, p *proc) (size, lines int, body string, took time.Duration) {
	t.Helper()
	cpu := procCPU(p.cmd.Process.Pid)
	defer func() { t.Logf("scrape: %v of the proxy's CPU", procCPU(p.cmd.Process.Pid)-cpu) }()
	start := time.Now()
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Get(p.adminURL("/metrics"))
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took = time.Since(start)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	return len(b), strings.Count(string(b), "\n"), string(b), took
}

// onEveryRoute sends one request to each of the n routes of manyRoutes, 16
// at a time, with body (formatted with the route's index), and fails the
// test unless each is answered status.
func onEveryRoute(t *testing.T, p *proc, n int, body string, status int) {
	t.Helper()
	var wg sync.WaitGroup
	var next, failed atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second}
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				resp, err := c.Post(p.url(fmt.Sprintf("/v1/tenants/%05d/charges", i)), "application/json",
					strings.NewReader(fmt.Sprintf(body, i)))
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != status {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%s: %d of %d requests failed or were not answered %d", body, f, n, status)
	}
}

// maxScrapeBytes is the bound on /metrics (text format) that holds with
// 10,000 routes.
const maxScrapeBytes = 10 << 20

// TestTenThousandRoutesScrapeStaysSmall: a configuration of 10,000 routes
// (a multi-tenant gateway) gives a /metrics of at most 10 MB in the text
// format, at start and after every route has served a charge and every
// outcome a client can cause (replayed, bad_request, mismatch, released),
// and the series the alert rules select exist for every route from the
// start. Start-up
// time, scrape time and memory are measured and logged, not asserted (the
// machine is shared).
func TestTenThousandRoutesScrapeStaysSmall(t *testing.T) {
	const n = 10000
	var served atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), `"amount":0`) {
			w.WriteHeader(422)
			io.WriteString(w, `{"error":"amount must be positive"}`)
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"status":"charged"}`)
	}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", manyRoutes(n))

	start := time.Now()
	p := startProxy(t, cfg)
	startup := time.Since(start)
	rss0, _ := procMemory(t, p.cmd.Process.Pid)

	size, lines, body, took := scrape(t, p)
	rss1, hwm1 := procMemory(t, p.cmd.Process.Pid)
	t.Logf("10,000 routes: listening after %v, RSS %d MiB; first scrape %d bytes, %d lines in %v; RSS after %d MiB (peak %d MiB)",
		startup.Round(time.Millisecond), rss0>>20, size, lines, took.Round(time.Millisecond), rss1>>20, hwm1>>20)
	if size > maxScrapeBytes {
		t.Errorf("/metrics at start = %d bytes, want at most %d", size, maxScrapeBytes)
	}
	// The series the shipped alert rules select exist for every route, the
	// last one included, before any request.
	byRoute := map[string][]struct {
		name   string
		labels map[string]string
	}{}
	for _, se := range scrapedSeries(t, body) {
		if r, ok := se.labels["route"]; ok {
			byRoute[r] = append(byRoute[r], se)
		}
	}
	sels := alertSelectors(t, "idemproxy_requests_total")
	for i := range n {
		route := fmt.Sprintf("tenant-%05d-charges", i)
		for _, sel := range sels {
			found := false
			for _, se := range byRoute[route] {
				found = found || sel.matches(se.name, se.labels)
			}
			if !found {
				t.Errorf("route %s: no series for the alert's %s at start", route, sel.text)
			}
		}
		if !t.Failed() && len(byRoute[route]) == 0 {
			t.Errorf("route %s has no series at start", route)
		}
		if t.Failed() {
			break
		}
	}
	if len(sels) < 4 {
		t.Errorf("found %d selectors of idemproxy_requests_total in the alert rules, want at least 4", len(sels))
	}

	// One charge on every route, then the outcomes a client can cause on
	// every route: a replay, a request without its key, another request
	// under a known key, and one the upstream refuses (released).
	phases := []struct {
		name   string
		body   string // with the route's index
		status int
	}{
		{"charge", `{"orderId":"ORD-%d","amount":1}`, 201},
		{"replay", `{"orderId":"ORD-%d","amount":1}`, 201},
		{"no key", `{"amount":1,"n":%d}`, 400},
		{"mismatch", `{"orderId":"ORD-%d","amount":2}`, 422},
		{"refused upstream", `{"orderId":"REF-%d","amount":0}`, 422},
	}
	for k, ph := range phases {
		start := time.Now()
		onEveryRoute(t, p, n, ph.body, ph.status)
		size, lines, body, took = scrape(t, p)
		rss, hwm := procMemory(t, p.cmd.Process.Pid)
		t.Logf("after %q on each route (%v): scrape %d bytes, %d lines in %v; RSS %d MiB (peak %d MiB)",
			ph.name, time.Since(start).Round(time.Millisecond), size, lines, took.Round(time.Millisecond), rss>>20, hwm>>20)
		if size > maxScrapeBytes {
			t.Errorf("/metrics after %q on each route = %d bytes, want at most %d", ph.name, size, maxScrapeBytes)
		}
		if k == 0 {
			last := fmt.Sprintf(`idemproxy_requests_total{outcome="committed",route="tenant-%05d-charges"}`, n-1)
			if v, _ := metricValue(body, last); v != "1" {
				t.Errorf("%s = %q, want 1", last, v)
			}
		}
	}
	if got := served.Load(); got != 2*n {
		t.Errorf("the upstream served %d requests, want %d (a charge and a refusal on each route)", got, 2*n)
	}
	// A second scrape, for its time once everything exists.
	_, _, _, took = scrape(t, p)
	t.Logf("second scrape in %v", took.Round(time.Millisecond))
}

// alertSelectors returns the selectors of metric name in the shipped alert
// rules.
func alertSelectors(t *testing.T, name string) []selector {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	b, err := os.ReadFile("deploy/prometheus/idemproxy-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	var out []selector
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, s := range selectors(r.Expr) {
				if s.name == name {
					out = append(out, s)
				}
			}
		}
	}
	return out
}
