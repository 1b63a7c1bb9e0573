package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// unsafeLine starts the ERROR line of a replica that saw Redis turn to a
// setting that loses keys; safeLine the line when it turned back.
const (
	unsafeLine = "redis runs with a setting that may lose idempotency keys: protected routes answer 503 store-unsafe-settings until it is fixed"
	safeLine   = "redis no longer runs with a setting that may lose idempotency keys: protected requests are served again"
)

// withRedisSettings adds lines to the store.redis section of the
// configuration at path (writeEpochRedisConfig's).
func withRedisSettings(t *testing.T, path, lines string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(b), "    op_timeout: 500ms\n", "    op_timeout: 500ms\n"+lines, 1)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRedisEvictionPolicySetAtRunTimeRefuses: an eviction policy set on a
// running Redis (CONFIG SET) turns protected requests into 503
// store-unsafe-settings within a few seconds, forwarding nothing, and
// /readyz, the metric and one ERROR line say so; noeviction set back
// serves again, with one line.
func TestRedisEvictionPolicySetAtRunTimeRefuses(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	p := startProxy(t, writeEpochRedisConfig(t, up.URL, rd.Addr()))
	eventually(t, "the proxy serves", func() bool { return charge(p, "ORD-RS1").status == 201 })
	if got := metricSum(t, p, "idemproxy_store_config_risk", `risk="eviction"`); got != 0 {
		t.Fatalf("idemproxy_store_config_risk{risk=eviction} with noeviction = %v, want 0", got)
	}

	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if _, err := rd.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "/readyz 503 naming maxmemory-policy", func() bool {
		rz := do("GET", p.adminURL("/readyz"), "")
		return rz.status == 503 && strings.Contains(rz.body, "store-unsafe-settings") && strings.Contains(rz.body, "maxmemory-policy is allkeys-lru")
	})
	for i := range 3 {
		order := fmt.Sprintf("ORD-RS2-%d", i)
		r := charge(p, order)
		if r.status != 503 || problemType(r) != "store-unsafe-settings" || !strings.Contains(r.body, `"setting":"maxmemory-policy"`) ||
			!strings.Contains(r.body, "noeviction") || r.header.Get("Retry-After") == "" {
			t.Errorf("%s = %d %s (Retry-After %q); want 503 store-unsafe-settings naming maxmemory-policy and noeviction, with Retry-After",
				order, r.status, r.body, r.header.Get("Retry-After"))
		}
		if n := chargeCount(t, up.URL, order); n != 0 {
			t.Errorf("%s reached the upstream %d times, want 0", order, n)
		}
	}
	// A retry of an answered order is refused too: its record may be the
	// next one evicted.
	if r := charge(p, "ORD-RS1"); r.status != 503 || problemType(r) != "store-unsafe-settings" {
		t.Errorf("retry of ORD-RS1 = %d %s, want 503 store-unsafe-settings", r.status, r.body)
	}
	if got := metricSum(t, p, "idemproxy_store_config_risk", `risk="eviction"`); got != 1 {
		t.Errorf("idemproxy_store_config_risk{risk=eviction} = %v, want 1", got)
	}
	if got := metricSum(t, p, "idemproxy_store_config_risk_allowed", `risk="eviction"`); got != 0 {
		t.Errorf("idemproxy_store_config_risk_allowed{risk=eviction} = %v, want 0", got)
	}

	if _, err := rd.Do("CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/readyz 200 again", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if r := charge(p, "ORD-RS3"); r.status != 201 {
		t.Errorf("ORD-RS3 after noeviction = %d %s, want 201", r.status, r.body)
	}
	if r := charge(p, "ORD-RS1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry of ORD-RS1 after noeviction = %d %s, want the replay", r.status, r.body)
	}
	if got := metricSum(t, p, "idemproxy_store_config_risk", `risk="eviction"`); got != 0 {
		t.Errorf("idemproxy_store_config_risk{risk=eviction} after noeviction = %v, want 0", got)
	}
	eventually(t, "the line of the fix written", func() bool { return len(p.log.logLines(safeLine)) > 0 })
	if bad, good := p.log.logLines(unsafeLine), p.log.logLines(safeLine); len(bad) != 1 || bad[0]["level"] != "ERROR" ||
		bad[0]["setting"] != "maxmemory-policy" || len(good) != 1 || good[0]["level"] != "WARN" {
		t.Errorf("log lines: %v when it turned bad, %v when it turned good; want one ERROR naming maxmemory-policy, one WARN", bad, good)
	}
	if got := chargeCount(t, up.URL, "ORD-RS1"); got != 1 {
		t.Errorf("ORD-RS1 charged %d times, want 1", got)
	}
}

// TestRedisAllowEvictionServesAndEvictionsMarkLost: with
// allow_eviction, a Redis that may evict serves (one WARN at start
// saying so); once it evicts (volatile-lru, which never evicts the epoch
// marker: it has no TTL, while every record has one), the store is marked
// lost on the evidence of evicted_keys, and every retry is refused.
func TestRedisAllowEvictionServesAndEvictionsMarkLost(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t, "--maxmemory-policy", "volatile-lru", "--maxmemory", "100mb")
	up := startStub(t)
	cfg := writeEpochRedisConfig(t, up.URL, rd.Addr())
	withRedisSettings(t, cfg, "    allow_eviction: true\n")
	p := startProxy(t, cfg)
	eventually(t, "the proxy serves", func() bool { return charge(p, "ORD-AE1").status == 201 })
	optIn := p.log.logLines("redis settings that may lose idempotency keys are allowed by the configuration")
	if len(optIn) != 1 || optIn[0]["level"] != "WARN" || optIn[0]["field"] != "store.redis.allow_eviction" {
		t.Errorf("opt-in lines at start = %v, want one WARN naming store.redis.allow_eviction", optIn)
	}
	if got := metricSum(t, p, "idemproxy_store_config_risk_allowed", `risk="eviction"`); got != 1 {
		t.Errorf("idemproxy_store_config_risk_allowed{risk=eviction} = %v, want 1", got)
	}
	eventually(t, "the eviction risk seen", func() bool {
		return metricSum(t, p, "idemproxy_store_config_risk", `risk="eviction"`) == 1
	})
	if r := charge(p, "ORD-AE1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of ORD-AE1 = %d %s, want the replay", r.status, r.body)
	}

	// Keys with a TTL, as records have, and a maxmemory below what they
	// take: Redis evicts.
	if _, err := rd.Do("EVAL", "for i=1,20000 do redis.call('SET','other:'..i,string.rep('x',100),'EX',3600) end", "0"); err != nil {
		t.Fatal(err)
	}
	info, err := rd.Do("INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	used := infoInt(t, info, "used_memory")
	if _, err := rd.Do("CONFIG", "SET", "maxmemory", strconv.FormatInt(used-1<<20, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Do("SET", "other:trigger", "x", "EX", "3600"); err != nil {
		t.Fatal(err)
	}
	stats, err := rd.Do("INFO", "stats")
	if err != nil || infoInt(t, stats, "evicted_keys") == 0 {
		t.Fatalf("evicted_keys after the fill = %q, %v; want some", stats, err)
	}
	if m, err := rd.Do("HGET", e2eKeyPrefix+"epoch", "eid"); err != nil || m == "" {
		t.Fatalf("the epoch marker after the evictions = %q, %v; want it kept (volatile-lru)", m, err)
	}
	// Seen within a check interval, without any request: a retry before
	// that would be let through (the record may be evicted already), the
	// window allow_eviction accepts.
	eventually(t, "the store marked lost", func() bool { return metricSum(t, p, "idemproxy_store_keys_lost") == 1 })
	wantLost(t, "the replica", p, "ORD-AE1")
	eventually(t, "/readyz names the evictions", func() bool {
		return strings.Contains(do("GET", p.adminURL("/readyz"), "").body, "evicted")
	})
	if got := chargeCount(t, up.URL, "ORD-AE1"); got != 1 {
		t.Errorf("ORD-AE1 charged %d times, want 1", got)
	}
}

// infoInt returns the integer field of INFO text.
func infoInt(t *testing.T, info, field string) int64 {
	t.Helper()
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %q", field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s: %q", field, info)
	return 0
}
