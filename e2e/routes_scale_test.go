//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// manyRoutes returns n routes with distinct match patterns, named as a
// multi-tenant deployment would name them.
func manyRoutes(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - name: tenant-%05d-charges\n    match: POST /v1/tenants/%05d/charges\n    key: {json: orderId}\n", i, i)
	}
	return b.String()
}

// procMemory returns a process's resident set and its peak (VmRSS, VmHWM)
// in bytes, read from /proc.
func procMemory(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Logf("no /proc: %v", err)
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// TestTenRoutesKeepEverySeries: with ten routes (under the default
// metrics.route_histograms), every route has from the start exactly the
// series it had before the limit existed: a counter and a latency
// histogram for every outcome, its in-flight gauge and its two
// answers-not-stored counters, 201 series; nothing is counted under
// route="(other)".
func TestTenRoutesKeepEverySeries(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", manyRoutes(10)))
	r := do("GET", p.adminURL("/metrics"), "")
	if r.status != 200 {
		t.Fatalf("/metrics = %d", r.status)
	}
	rss, _ := procMemory(t, p.cmd.Process.Pid)
	t.Logf("ten routes: /metrics %d bytes, %d lines; RSS %d MiB", len(r.body), strings.Count(r.body, "\n"), rss>>20)
	perRoute := map[string]map[string]int{}
	for _, se := range scrapedSeries(t, r.body) {
		route, ok := se.labels["route"]
		if !ok {
			continue
		}
		if perRoute[route] == nil {
			perRoute[route] = map[string]int{}
		}
		perRoute[route][se.name]++
	}
	// 11 outcomes (every one but passthrough), 14 buckets and +Inf.
	want := map[string]int{
		"idemproxy_requests_total":                  11,
		"idemproxy_request_duration_seconds_bucket": 11 * 15,
		"idemproxy_request_duration_seconds_sum":    11,
		"idemproxy_request_duration_seconds_count":  11,
		"idemproxy_requests_in_flight":              1,
		"idemproxy_answers_not_stored_total":        2,
	}
	for i := range 10 {
		route := fmt.Sprintf("tenant-%05d-charges", i)
		for name, n := range want {
			if got := perRoute[route][name]; got != n {
				t.Errorf("route %s: %d series of %s at start, want %d", route, got, name, n)
			}
		}
	}
	if got := perRoute["(other)"]; len(got) > 0 {
		t.Errorf("series under route=\"(other)\" with ten routes: %v, want none", got)
	}
}
