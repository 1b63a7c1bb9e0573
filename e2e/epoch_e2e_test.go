package e2e

// End-to-end tests of the store's epoch marker (issue #25) with the real
// binary: a shared store that forgot its keys (Redis restarted empty or
// flushed, a PostgreSQL table truncated, a Badger directory replaced) is
// detected, nothing protected is forwarded (503 store-lost-keys) until an
// operator accepts the loss, and a store that kept its keys (Redis
// restarted from its append-only file, a normal restart) raises no alarm.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// epochInterval is the store.epoch_check_interval of these tests: a new
// shared store's marker waits three of them.
const epochInterval = "300ms"

// lostLine is the start of the ERROR line of a replica that saw the
// store's epoch gone.
const lostLine = "the store lost its keys"

// lostMsg is the whole message of that line.
const lostMsg = "the store lost its keys: protected routes answer 503 store-lost-keys until an operator accepts the loss " +
	"(idemproxy store accept-loss); retries of keys answered before would be charged again"

// adminToken is the admin token of the proxies started here.
const adminToken = "s3cret"

// writeEpochRedisConfig writes a configuration on the Redis at addr.
func writeEpochRedisConfig(t *testing.T, upstream, addr string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  epoch_check_interval: %s
  redis:
    addrs: [%s]
    key_prefix: %q
    op_timeout: 500ms
routes:
%s`, upstream, epochInterval, addr, e2eKeyPrefix, chargesRoute)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// lostLines counts p's ERROR log lines saying the store lost its keys.
func lostLines(p *proc) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"level":"ERROR"`) && strings.Contains(sc.Text(), lostLine) {
			n++
		}
	}
	return n
}

// wantOneLostLine checks that p logged the loss once (the log is
// written behind the process's work: waited for).
func wantOneLostLine(t *testing.T, name string, p *proc) {
	t.Helper()
	eventually(t, name+": the ERROR line written", func() bool { return lostLines(p) > 0 })
	if n := lostLines(p); n != 1 {
		t.Errorf("%s: %d ERROR lines %q, want 1", name, n, lostLine)
	}
}

// wantLost checks that p refuses a retry of order with 503
// store-lost-keys, says so on /readyz and in its metrics.
func wantLost(t *testing.T, name string, p *proc, order string) {
	t.Helper()
	eventually(t, name+" refuses with store-lost-keys", func() bool {
		r := charge(p, order)
		return r.status == 503 && problemType(r) == "store-lost-keys"
	})
	r := charge(p, order)
	if r.status != 503 || problemType(r) != "store-lost-keys" || r.header.Get("Retry-After") == "" {
		t.Errorf("%s: retry of %s = %d %s (Retry-After %q), want 503 store-lost-keys with Retry-After",
			name, order, r.status, r.body, r.header.Get("Retry-After"))
	}
	// /readyz and the gauge follow the watcher, within a check interval
	// of the refusals (which the reservations' own checks start).
	eventually(t, name+": /readyz 503 naming store-lost-keys", func() bool {
		rz := do("GET", p.adminURL("/readyz"), "")
		return rz.status == 503 && strings.Contains(rz.body, "store-lost-keys")
	})
	if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 1 {
		t.Errorf("%s: idemproxy_store_keys_lost = %v, want 1", name, got)
	}
}

// wantServing waits until p serves a new order again, after an
// acceptance.
func wantServing(t *testing.T, name string, p *proc, order string) {
	t.Helper()
	eventually(t, name+" serves again", func() bool {
		return do("GET", p.adminURL("/readyz"), "").status == 200
	})
	if r := charge(p, order); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("%s: new order %s after the acceptance = %d %s, want a forwarded 201", name, order, r.status, r.body)
	}
	if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 0 {
		t.Errorf("%s: idemproxy_store_keys_lost = %v after the acceptance, want 0", name, got)
	}
}

// acceptLossCLI runs idemproxy store accept-loss on cfg and returns the
// new epoch's ID it prints.
func acceptLossCLI(t *testing.T, cfg string, env ...string) string {
	t.Helper()
	cmd := exec.Command(bin, "store", "accept-loss", "-config", cfg, "-operator", "e2e", "-reason", "the store was restarted empty")
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("idemproxy store accept-loss: %v\n%s", err, stderr.String())
	}
	id := strings.TrimSpace(string(out))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("accept-loss printed %q, want the new epoch's ID alone", out)
	}
	if !strings.Contains(stderr.String(), "store loss accepted by an operator") || !strings.Contains(stderr.String(), `"operator":"e2e"`) {
		t.Errorf("accept-loss wrote no audit line naming the operator:\n%s", stderr.String())
	}
	return id
}

// TestRedisRestartedEmptyUnderLoad: two replicas on one Redis without
// persistence, retries of answered orders and new orders going on while
// Redis restarts empty. No order is charged twice; from the restart on,
// nothing is forwarded (503 store-lost-keys, or store-unavailable while
// Redis is down) until an operator accepts the loss; /readyz and the
// metrics say so; each replica logs one ERROR line. After the acceptance
// both serve again, and a retry of an order answered before the loss is
// forwarded again: that is what accepting means.
func TestRedisRestartedEmptyUnderLoad(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	cfg := writeEpochRedisConfig(t, up.URL, rd.Addr())
	procs := []*proc{startProxy(t, cfg), startProxy(t, cfg)}

	const answered = 40
	order := func(i int) string { return fmt.Sprintf("ORD-E%d", i) }
	for i := range answered {
		if r := charge(procs[i%2], order(i)); r.status != 201 {
			t.Fatalf("%s = %d %s, want 201", order(i), r.status, r.body)
		}
	}

	// Retries of the answered orders and new orders, from four clients,
	// across the restart.
	var (
		stop      atomic.Bool
		restarted atomic.Int64 // unix ns when the empty Redis answered
		wg        sync.WaitGroup
		mu        sync.Mutex
		afterOK   []string // answers after the restart that were not refusals
		refusals  = map[string]int{}
		newOrders []string
	)
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				o := order((c*7 + n) % answered)
				if n%3 == 0 {
					o = fmt.Sprintf("ORD-EN%d-%d", c, n)
					mu.Lock()
					newOrders = append(newOrders, o)
					mu.Unlock()
				}
				sentAt := time.Now().UnixNano()
				r := charge(procs[n%2], o)
				if at := restarted.Load(); at == 0 || sentAt < at {
					continue
				}
				mu.Lock()
				switch pt := problemType(r); {
				case r.status == 503 && (pt == "store-lost-keys" || pt == "store-unavailable"):
					refusals[pt]++
				default:
					afterOK = append(afterOK, fmt.Sprintf("%s via %d: %d %s", o, n%2, r.status, r.body))
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	rd.Restart() // no persistence: empty
	restarted.Store(time.Now().UnixNano())
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()

	t.Logf("after the restart: %v refusals", refusals)
	for _, a := range afterOK {
		t.Errorf("after the restart, an answer that is not a refusal: %s", a)
	}
	if refusals["store-lost-keys"] == 0 {
		t.Error("no request after the restart was refused with store-lost-keys")
	}
	for i := range answered {
		if got := chargeCount(t, up.URL, order(i)); got != 1 {
			t.Errorf("%s charged %d times, want 1", order(i), got)
		}
	}
	for _, o := range newOrders {
		if got := chargeCount(t, up.URL, o); got > 1 {
			t.Errorf("%s charged %d times, want at most 1", o, got)
		}
	}
	for i, p := range procs {
		name := fmt.Sprintf("replica %d", i)
		wantLost(t, name, p, order(0))
		if got := metricSum(t, p, "idemproxy_store_epoch_changes_total"); got != 1 {
			t.Errorf("%s: idemproxy_store_epoch_changes_total = %v, want 1", name, got)
		}
		wantOneLostLine(t, name, p)
		// The line says what was seen: the epoch trusted, the marker
		// found, the Redis instance (run_id).
		for _, l := range p.log.logLines(lostMsg) {
			if l["trusted_epoch"] == "" || l["seen_epoch"] == nil || l["store_instance"] == "" || l["seen"] == "" {
				t.Errorf("%s: the ERROR line lacks what was seen: %v", name, l)
			}
			t.Logf("%s: %v", name, l)
		}
	}
	if got := chargeCount(t, up.URL, order(0)); got != 1 {
		t.Fatalf("%s charged %d times while the store was lost, want 1", order(0), got)
	}

	acceptLossCLI(t, cfg)
	for i, p := range procs {
		wantServing(t, fmt.Sprintf("replica %d", i), p, fmt.Sprintf("ORD-EA%d", i))
	}
	// Accepted: the answered order's retry reaches the upstream again.
	if r := charge(procs[0], order(1)); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry of %s after the acceptance = %d %s, want it forwarded", order(1), r.status, r.body)
	}
	if got := chargeCount(t, up.URL, order(1)); got != 2 {
		t.Errorf("%s charged %d times after the acceptance, want 2 (the loss was accepted)", order(1), got)
	}
}

// TestRedisFlushallAndANewReplica: a FLUSHALL keeps the connections open,
// so no reconnection tells; the reservation's own check of the marker
// does, at the first retry, on both replicas. A replica started after the
// loss refuses at once, and the acceptance through its admin API (audited,
// behind the token) puts every replica back in service.
func TestRedisFlushallAndANewReplica(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	cfg := writeEpochRedisConfig(t, up.URL, rd.Addr())
	a := startProxy(t, cfg)
	b := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	if r := charge(a, "ORD-F1"); r.status != 201 {
		t.Fatalf("ORD-F1 = %d %s, want 201", r.status, r.body)
	}
	if _, err := rd.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// At once: the first retry, on either replica, is refused.
	for name, p := range map[string]*proc{"b": b, "a": a} {
		if r := charge(p, "ORD-F1"); r.status != 503 || problemType(r) != "store-lost-keys" {
			t.Errorf("replica %s: first retry after FLUSHALL = %d %s, want 503 store-lost-keys", name, r.status, r.body)
		}
	}
	if got := chargeCount(t, up.URL, "ORD-F1"); got != 1 {
		t.Fatalf("ORD-F1 charged %d times, want 1", got)
	}
	wantLost(t, "a", a, "ORD-F1")
	wantLost(t, "b", b, "ORD-F1")
	eventually(t, "the lost marker written", func() bool {
		v, _ := rd.Do("HGET", e2eKeyPrefix+"epoch", "est")
		return v == "lost"
	})

	c := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	if r := charge(c, "ORD-F2"); r.status != 503 || problemType(r) != "store-lost-keys" {
		t.Errorf("new replica: first charge = %d %s, want 503 store-lost-keys", r.status, r.body)
	}
	wantLost(t, "c", c, "ORD-F2")
	if got := chargeCount(t, up.URL, "ORD-F2"); got != 0 {
		t.Errorf("ORD-F2 charged %d times on a lost store, want 0", got)
	}

	if r := do("POST", c.adminURL("/v1/store/accept-loss"), ""); r.status != 401 {
		t.Errorf("accept-loss without the token = %d %s, want 401", r.status, r.body)
	}
	if r := do("POST", c.adminURL("/v1/store/accept-loss?reason=flushed+by+mistake"), "",
		"Authorization", "Bearer wrong"); r.status != 401 {
		t.Errorf("accept-loss with a wrong token = %d %s, want 401", r.status, r.body)
	}
	r := do("POST", c.adminURL("/v1/store/accept-loss?reason=flushed+by+mistake"), "",
		"Authorization", "Bearer "+adminToken, "X-Operator", "alice")
	if r.status != 200 || !strings.Contains(r.body, `"accepted": true`) || !strings.Contains(r.body, `"previous_state": "lost"`) {
		t.Fatalf("accept-loss = %d %s, want 200 accepted, previous state lost", r.status, r.body)
	}
	const auditMsg = "store loss accepted by an operator: retries of keys answered before the loss will be forwarded again"
	eventually(t, "the audit line written", func() bool { return len(c.log.logLines(auditMsg)) > 0 }) // the log is written behind
	audit := c.log.logLines(auditMsg)
	if len(audit) != 1 || audit[0]["operator"] != "alice" || audit[0]["reason"] != "flushed by mistake" || audit[0]["level"] != "WARN" {
		t.Errorf("audit lines = %v, want one WARN naming alice and the reason", audit)
	}
	for name, p := range map[string]*proc{"a": a, "b": b, "c": c} {
		wantServing(t, name, p, "ORD-F3-"+name)
	}
}

// TestRedisRestartedFromItsAppendOnlyFile: a Redis that kept its keys
// (append-only file) is no loss: its marker came back with them. The
// replicas replay the answered order and raise no alarm.
func TestRedisRestartedFromItsAppendOnlyFile(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	up := startStub(t)
	cfg := writeEpochRedisConfig(t, up.URL, rd.Addr())
	procs := []*proc{startProxy(t, cfg), startProxy(t, cfg)}
	if r := charge(procs[0], "ORD-A1"); r.status != 201 {
		t.Fatalf("ORD-A1 = %d %s, want 201", r.status, r.body)
	}
	before, err := rd.Do("HGET", e2eKeyPrefix+"epoch", "eid")
	if err != nil || before == "" {
		t.Fatalf("the epoch marker before the restart = %q, %v; want one", before, err)
	}
	rd.Restart()
	if after, err := rd.Do("HGET", e2eKeyPrefix+"epoch", "eid"); err != nil || after != before {
		t.Fatalf("the epoch marker after the restart = %q, %v; want %q, kept in the append-only file", after, err, before)
	}
	for i, p := range procs {
		eventually(t, fmt.Sprintf("replica %d replays after the restart", i), func() bool {
			r := charge(p, "ORD-A1")
			if problemType(r) == "store-lost-keys" {
				t.Fatalf("replica %d: false alarm: %d %s", i, r.status, r.body)
			}
			return r.status == 201 && r.header.Get("Idempotent-Replayed") == "true"
		})
	}
	time.Sleep(2 * time.Second) // several checks of the marker
	for i, p := range procs {
		name := fmt.Sprintf("replica %d", i)
		if got := metricSum(t, p, "idemproxy_store_epoch_changes_total"); got != 0 {
			t.Errorf("%s: idemproxy_store_epoch_changes_total = %v, want 0", name, got)
		}
		if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 0 {
			t.Errorf("%s: idemproxy_store_keys_lost = %v, want 0", name, got)
		}
		if n := lostLines(p); n != 0 {
			t.Errorf("%s: %d ERROR lines %q, want none", name, n, lostLine)
		}
		if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
			t.Errorf("%s: /readyz = %d %s, want 200", name, r.status, r.body)
		}
	}
	if got := chargeCount(t, up.URL, "ORD-A1"); got != 1 {
		t.Errorf("ORD-A1 charged %d times, want 1", got)
	}
}

// TestPostgresTableTruncated: the key table truncated under two replicas
// takes the marker with the keys: the next retry is refused on both (the
// reservation checks the marker in its statement), and the loss is
// accepted with the CLI.
func TestPostgresTableTruncated(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	cfg := writePostgresConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, chargesRoute,
		"  epoch_check_interval: "+epochInterval+"\n")
	procs := []*proc{startPostgresProxy(t, cfg, pg), startPostgresProxy(t, cfg, pg)}
	if r := charge(procs[0], "ORD-P1"); r.status != 201 {
		t.Fatalf("ORD-P1 = %d %s, want 201", r.status, r.body)
	}
	pg.MustExec("TRUNCATE public.idemproxy_keys")
	for i, p := range procs {
		if r := charge(p, "ORD-P1"); r.status != 503 || problemType(r) != "store-lost-keys" {
			t.Errorf("replica %d: first retry after TRUNCATE = %d %s, want 503 store-lost-keys", i, r.status, r.body)
		}
	}
	if got := chargeCount(t, up.URL, "ORD-P1"); got != 1 {
		t.Fatalf("ORD-P1 charged %d times, want 1", got)
	}
	for i, p := range procs {
		wantLost(t, fmt.Sprintf("replica %d", i), p, "ORD-P1")
	}
	acceptLossCLI(t, cfg, pgDSNEnv+"="+pg.DSN())
	for i, p := range procs {
		wantServing(t, fmt.Sprintf("replica %d", i), p, fmt.Sprintf("ORD-PA%d", i))
	}
}

// TestBadgerDirectoryReplaced: the data directory replaced by an empty
// one while the proxy runs is the same loss: the next retry is refused,
// and the admin API's acceptance (the CLI cannot open a directory a
// running proxy holds) puts it back in service. A first start on an empty
// directory and a normal restart raise no alarm.
func TestBadgerDirectoryReplaced(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := filepath.Join(t.TempDir(), "data")
	cfg := writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, dir,
		"  epoch_check_interval: "+epochInterval, chargesRoute)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	if r := charge(p, "ORD-B1"); r.status != 201 {
		t.Fatalf("first start: ORD-B1 = %d %s, want 201 at once", r.status, r.body)
	}
	p.signal(syscall.SIGTERM)
	p.wait()
	p = startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	if r := charge(p, "ORD-B1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after a restart: ORD-B1 = %d %s, want a replayed 201", r.status, r.body)
	}
	if n := lostLines(p); n != 0 || metricSum(t, p, "idemproxy_store_keys_lost") != 0 {
		t.Fatalf("a normal restart raised the alarm:\n%s", p.log)
	}

	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := charge(p, "ORD-B1")
	if r.status != 503 || problemType(r) != "store-lost-keys" {
		t.Errorf("first retry after the directory was replaced = %d %s, want 503 store-lost-keys", r.status, r.body)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", tail(p.log.String(), 30))
		}
	})
	wantLost(t, "badger", p, "ORD-B1")
	if got := chargeCount(t, up.URL, "ORD-B1"); got != 1 {
		t.Fatalf("ORD-B1 charged %d times, want 1", got)
	}
	wantOneLostLine(t, "badger", p)
	ra := do("POST", p.adminURL("/v1/store/accept-loss?reason=disk+replaced"), "",
		"Authorization", "Bearer "+adminToken, "X-Operator", "bob")
	if ra.status != 200 {
		t.Fatalf("accept-loss = %d %s, want 200", ra.status, ra.body)
	}
	wantServing(t, "badger", p, "ORD-B2")
	// A restart after the acceptance keeps the accepted epoch.
	p.signal(syscall.SIGTERM)
	p.wait()
	p = startProxy(t, cfg)
	if r := charge(p, "ORD-B2"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after a restart: ORD-B2 = %d %s, want a replayed 201", r.status, r.body)
	}
}
