//go:build linux && long

package main

// The bench's whole runs: each starts every target it names (servers,
// stubs, proxies, load) for a second of load and reads the report, which
// takes minutes on two cores. They test the bench tool, not the proxy,
// and run with the long tag (go test -tags long ./bench/), as .ci/run
// does.

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSharedStoreRowsShowDatabaseCPU: in a real run, every shared-store
// row, the Cluster's, the replicated Redis' and the prefilled twins included, shows the database's
// CPU per request; only the rows without a database server show "-". Every
// row, the bare proxy's included, shows the budget: allocations, bytes and
// syscalls per request.
func TestSharedStoreRowsShowDatabaseCPU(t *testing.T) {
	tmp := sharedTempDir(t)
	c := bench(t, tmp, "-targets", "bare,redis,redis-replica,redis-cluster,postgres-nosync", "-prefill", "100",
		"-duration", "1s", "-single=false", "-driver", "go", "-log-level", "error")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	want := map[string]bool{ // target: has a database server
		"bare": false, "redis": true, "redis@100": true, "redis-replica": true, "redis-replica@100": true,
		"redis-cluster": true, "redis-cluster@100": true,
		"postgres-nosync": true, "postgres-nosync@100": true,
	}
	db := -1         // the DB CPU/req column
	var budget []int // the allocs/req, B/req and syscalls/req columns
	number := regexp.MustCompile(`^\d+(\.\d+)?$`)
	seen := map[string]bool{}
	// tabwriter pads cells with at least two spaces; "0.42 ms" is one cell.
	sep := regexp.MustCompile(`\s{2,}`)
	perReq := regexp.MustCompile(`^\d+ µs$`)
	for line := range strings.Lines(string(out)) {
		f := sep.Split(strings.TrimSpace(line), -1)
		if f[0] == "target" {
			db = slices.Index(f, "DB CPU/req")
			budget = []int{slices.Index(f, "allocs/req"), slices.Index(f, "B/req"), slices.Index(f, "syscalls/req")}
			continue
		}
		hasDB, ok := want[f[0]]
		if db < 0 || len(f) <= db || !ok {
			continue
		}
		seen[f[0]] = true
		got := f[db]
		if hasDB && !perReq.MatchString(got) {
			t.Errorf("%s: DB CPU/req %q, want the database's CPU per request:\n%s", f[0], got, line)
		}
		if !hasDB && got != "-" {
			t.Errorf("%s: DB CPU/req %q, want - (no database server)", f[0], got)
		}
		for _, i := range budget {
			if i < 0 || len(f) <= i || !number.MatchString(f[i]) || f[i] == "0" {
				t.Errorf("%s: the budget's columns %v (allocs/req, B/req, syscalls/req) hold no count:\n%s", f[0], budget, line)
				break
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no row for %s in:\n%s", name, out)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("temporary directories left after the run: %v", left)
	}
}

// sharedTempDir is a new directory that the postgres user, which the
// bench runs PostgreSQL as when run as root, may enter (t.TempDir's parent
// is root's alone), removed when the test ends.
func sharedTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bench-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTracingTargetsExport: in a real run, each tracing target's spans
// reach its OTLP receiver: always_on traces every request it was sent (a
// server span each, with its children), the 1 % ratio sampler a few.
func TestTracingTargetsExport(t *testing.T) {
	tmp := t.TempDir()
	c := bench(t, tmp, "-targets", "badger-sync-trace,badger-sync-trace1",
		"-duration", "1s", "-single=false", "-driver", "go", "-log-level", "error")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`(?m)^  (\S+) \(OTEL_TRACES_SAMPLER=[^)]*\): (\d+) requests sent, (\d+) traced \([0-9.]+ a request\), (\d+) spans in (\d+) exports, [0-9.]+ MiB$`)
	type got struct{ sent, traced, spans, exports int64 }
	rows := map[string]got{}
	for _, m := range line.FindAllStringSubmatch(string(out), -1) {
		var n [4]int64
		for i := range n {
			n[i], _ = strconv.ParseInt(m[i+2], 10, 64)
		}
		rows[m[1]] = got{sent: n[0], traced: n[1], spans: n[2], exports: n[3]}
	}
	tests := []struct {
		target string
		// every: the sampler keeps every trace (at least half of the
		// requests' server spans arrive; all of them unless the proxy's
		// span queue overflowed); else it keeps few (under a fifth).
		every bool
	}{
		{"badger-sync-trace", true},
		{"badger-sync-trace1", false},
	}
	for _, tt := range tests {
		r, ok := rows[tt.target]
		if !ok {
			t.Errorf("no traces line for %s in:\n%s", tt.target, out)
			continue
		}
		if r.sent == 0 || r.traced > r.sent || r.spans < r.traced {
			t.Errorf("%s: %d requests sent, %d traced, %d spans: want traced at most sent and spans at least traced", tt.target, r.sent, r.traced, r.spans)
		}
		if tt.every && (r.traced < r.sent/2 || r.exports == 0) {
			t.Errorf("%s: got %d of %d requests traced in %d exports, want (nearly) all of them exported", tt.target, r.traced, r.sent, r.exports)
		}
		if !tt.every && r.traced >= r.sent/5 {
			t.Errorf("%s: got %d of %d requests traced, want about 1 %%", tt.target, r.traced, r.sent)
		}
	}
	if strings.Contains(string(out), "refused") {
		t.Errorf("a receiver refused exports:\n%s", out)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("temporary directories left after the run: %v", left)
	}
}
