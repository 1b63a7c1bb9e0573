package e2e

// End-to-end tests of the shared Redis store (issue #5) with the real
// binary: replicas that share one Redis agree on who owns a key, replicas
// with their own Badger stores do not (the article's warning), a Redis that
// dies fails closed and the proxy recovers by itself, and a Redis Cluster
// spreads the keys over its nodes without changing the guarantee.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// e2eKeyPrefix is the key_prefix of every Redis configuration written here.
const e2eKeyPrefix = "idemproxy-e2e:"

// writeRedisConfig writes a configuration for upstream and the Redis at
// addrs (one address: a single node; several: a cluster) with the given
// routes, and returns its path.
func writeRedisConfig(t *testing.T, path, upstream string, addrs []string, routes string) string {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  redis:
    addrs: [%s]
    key_prefix: %q
    op_timeout: 500ms
routes:
%s`, upstream, strings.Join(addrs, ", "), e2eKeyPrefix, routes)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// delayed are the stub headers that hold the charge's answer back, so that
// the requests of a burst overlap with the one that was forwarded.
var delayed = []string{"X-Stub-Fault", "delay", "X-Stub-Delay", "300ms"}

// sent is one answer of a burst and the replica that gave it.
type sent struct {
	replica int
	result
}

// burst sends n charges for order at once, request i to procs[i%len(procs)],
// and returns the answers.
func burst(t *testing.T, procs []*proc, order string, n int) []sent {
	t.Helper()
	out := make([]sent, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = sent{i % len(procs), charge(procs[i%len(procs)], order, delayed...)}
		}()
	}
	close(start)
	wg.Wait()
	for _, s := range out {
		if s.err != nil {
			t.Fatalf("%s via replica %d: %v", order, s.replica, s.err)
		}
	}
	return out
}

// tally classifies a burst's answers: the forwarded 201s, and checks that
// every other answer is a replay of one of them or a 409 request-in-flight.
// It returns the forwarded answers and the number of replays and conflicts.
func tally(t *testing.T, order string, answers []sent) (forwarded []sent, replayed, inFlight int) {
	t.Helper()
	for _, a := range answers {
		if a.status == 201 && a.header.Get("Idempotent-Replayed") == "" {
			forwarded = append(forwarded, a)
		}
	}
	for _, a := range answers {
		switch {
		case a.status == 201 && a.header.Get("Idempotent-Replayed") == "":
		case a.status == 201 && a.header.Get("Idempotent-Replayed") == "true":
			replayed++
			if !replaysOneOf(a, forwarded) {
				t.Errorf("%s: replica %d replayed %q, which no forwarded answer gave", order, a.replica, a.body)
			}
		case a.status == 409 && problemType(a.result) == "request-in-flight":
			inFlight++
		default:
			t.Errorf("%s: replica %d answered %d %s; want 201, a replayed 201 or 409 request-in-flight",
				order, a.replica, a.status, a.body)
		}
	}
	return forwarded, replayed, inFlight
}

func replaysOneOf(a sent, forwarded []sent) bool {
	for _, f := range forwarded {
		if a.body == f.body {
			return true
		}
	}
	return false
}

// replayed sends order to p once more and requires the stored answer
// replayed. It is strict on purpose: the owner commits the answer before
// its handler returns, so a retry sent after the answer arrived must never
// find the key still in flight.
func replayed(t *testing.T, p *proc, order string) result {
	t.Helper()
	r := charge(p, order)
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%s = %d %s %v (replayed %q), want a replayed 201",
			order, r.status, r.body, r.err, r.header.Get("Idempotent-Replayed"))
	}
	return r
}

// metricSum fetches p's /metrics and returns the sum of the samples of
// metric whose labels contain every one of labels (written as
// `name="value"`).
func metricSum(t *testing.T, p *proc, metric string, labels ...string) float64 {
	t.Helper()
	r := do("GET", p.adminURL("/metrics"), "")
	if r.err != nil || r.status != 200 {
		t.Fatalf("/metrics = %d %v", r.status, r.err)
	}
	sum, err := sumSamples(r.body, metric, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// sumSamples returns the sum of the samples of metric in body, a
// /metrics page, whose labels contain every one of labels.
func sumSamples(body, metric string, labels ...string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// TestRedisReplicasChargeOnce: two replicas sharing one Redis, a burst for
// one order spread over both: exactly one charge, every other answer a
// replay of it or a 409; and an answer committed on one replica is
// replayed by the other.
func TestRedisReplicasChargeOnce(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeRedisConfig(t, filepath.Join(dir, "c.yaml"), up.URL, []string{rd.Addr()}, chargesRoute)
	procs := []*proc{startProxy(t, cfg), startProxy(t, cfg)}

	answers := burst(t, procs, "ORD-S1", 40)
	forwarded, nReplayed, nInFlight := tally(t, "ORD-S1", answers)
	t.Logf("burst: %d forwarded, %d replayed, %d request-in-flight", len(forwarded), nReplayed, nInFlight)
	if len(forwarded) != 1 {
		t.Errorf("forwarded answers = %d, want exactly 1", len(forwarded))
	}
	if got := chargeCount(t, up.URL, "ORD-S1"); got != 1 {
		t.Errorf("ORD-S1 charges = %d, want 1", got)
	}
	if len(forwarded) == 1 {
		// Whichever replica forwarded it, both replay it now.
		for i, p := range procs {
			if r := replayed(t, p, "ORD-S1"); r.body != forwarded[0].body {
				t.Errorf("replica %d replays %q, want the forwarded answer %q", i, r.body, forwarded[0].body)
			}
		}
	}

	// Committed on A, replayed by B.
	first := charge(procs[0], "ORD-S2")
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("ORD-S2 via A = %d %s %v, want a forwarded 201", first.status, first.body, first.err)
	}
	if r := replayed(t, procs[1], "ORD-S2"); r.body != first.body {
		t.Errorf("ORD-S2 via B replays %q, want A's answer %q", r.body, first.body)
	}
	for order, want := range map[string]int{"ORD-S1": 1, "ORD-S2": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
}

// TestBadgerReplicasEachChargeOnce pins the documented limitation of the
// embedded store, the article's warning: two replicas with their own Badger
// stores each accept the same order once, so the burst is charged twice.
// Replicas that can receive the same key must share Redis.
func TestBadgerReplicasEachChargeOnce(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	var procs []*proc
	for _, name := range []string{"a", "b"} {
		cfg := writeConfig(t, filepath.Join(dir, name+".yaml"), up.URL, filepath.Join(dir, "data-"+name), "", chargesRoute)
		procs = append(procs, startProxy(t, cfg))
	}

	answers := burst(t, procs, "ORD-B1", 40)
	forwarded, nReplayed, nInFlight := tally(t, "ORD-B1", answers)
	t.Logf("burst: %d forwarded, %d replayed, %d request-in-flight", len(forwarded), nReplayed, nInFlight)
	perReplica := map[int]int{}
	for _, f := range forwarded {
		perReplica[f.replica]++
	}
	if perReplica[0] != 1 || perReplica[1] != 1 {
		t.Errorf("forwarded answers per replica = %v, want exactly 1 on each", perReplica)
	}
	if got := chargeCount(t, up.URL, "ORD-B1"); got != 2 {
		t.Errorf("ORD-B1 charges = %d, want 2: one per replica, each with its own store", got)
	}
}

// redisDownRoutes: charges fails closed (the default), open-charges fails
// open.
const redisDownRoutes = chargesRoute + `
  - name: open-charges
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    on_store_error: forward
    upstream_timeout: 10s
    lease: 15s
`

// TestRedisDownFailsClosedAndRecovers: with Redis killed, a protected
// request gets 503 store-unavailable and is not forwarded, /readyz says so,
// the store errors are counted, and a route with on_store_error: forward
// forwards unprotected. When Redis comes back (with its append-only file)
// the same process recovers by itself and the answer committed before the
// crash is still replayed.
func TestRedisDownFailsClosedAndRecovers(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeRedisConfig(t, filepath.Join(dir, "c.yaml"), up.URL, []string{rd.Addr()}, redisDownRoutes))

	first := charge(p, "ORD-K1")
	if first.status != 201 {
		t.Fatalf("ORD-K1 = %d %s %v, want 201", first.status, first.body, first.err)
	}
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
		t.Fatalf("readyz with Redis up = %d %s", r.status, r.body)
	}
	replayed(t, p, "ORD-K1") // committed before the crash

	rd.Stop()
	for _, order := range []string{"ORD-K2", "ORD-K2", "ORD-K1"} {
		r := charge(p, order)
		if r.status != 503 || problemType(r) != "store-unavailable" {
			t.Errorf("%s with Redis down = %d %s %v, want 503 store-unavailable", order, r.status, r.body, r.err)
		}
		if !strings.Contains(r.body, `"type":"urn:idemproxy:problem:store-unavailable"`) {
			t.Errorf("%s with Redis down: body %s lacks the problem type URI", order, r.body)
		}
	}
	for order, want := range map[string]int{"ORD-K1": 1, "ORD-K2": 0} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges with Redis down = %d, want %d: nothing may be forwarded", order, got, want)
		}
	}
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 503 {
		t.Errorf("readyz with Redis down = %d %s, want 503", r.status, r.body)
	}
	if n := metricSum(t, p, "idemproxy_store_errors_total", `store="redis"`); n <= 0 {
		t.Errorf("idemproxy_store_errors_total = %v with Redis down, want > 0", n)
	}
	if n := metricSum(t, p, "idemproxy_requests_total", `route="charges"`, `outcome="store_error"`); n != 3 {
		t.Errorf(`idemproxy_requests_total{route="charges",outcome="store_error"} = %v, want 3`, n)
	}

	// Fail open where the route asks for it.
	open := do("POST", p.url("/orders/ORD-K3/charges"), `{"amount": 10}`)
	if open.status != 201 {
		t.Errorf("open-charges with Redis down = %d %s %v, want 201 (on_store_error: forward)", open.status, open.body, open.err)
	}
	if got := chargeCount(t, up.URL, "ORD-K3"); got != 1 {
		t.Errorf("ORD-K3 charges = %d, want 1", got)
	}
	if n := metricSum(t, p, "idemproxy_requests_total", `route="open-charges"`, `outcome="store_error"`); n < 1 {
		t.Errorf(`idemproxy_requests_total{route="open-charges",outcome="store_error"} = %v, want >= 1`, n)
	}

	// Redis returns: the same process recovers without a restart.
	rd.Restart()
	eventually(t, "readyz turns 200 again", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	var again result
	eventually(t, "ORD-K2 is charged after the recovery", func() bool {
		again = charge(p, "ORD-K2")
		return again.status != 503
	})
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("ORD-K2 after recovery = %d %s %v, want a forwarded 201", again.status, again.body, again.err)
	}
	if r := replayed(t, p, "ORD-K1"); r.body != first.body {
		t.Errorf("ORD-K1 after the Redis restart replays %q, want %q (appendfsync always kept it)", r.body, first.body)
	}
	for order, want := range map[string]int{"ORD-K1": 1, "ORD-K2": 1, "ORD-K3": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
}

// TestRedisRestartWithoutPersistenceFailsClosed pins what docs/redis.md
// warns about and what the epoch marker does about it: a Redis restarted
// without persistence has lost the committed answers, so a retry of an
// order charged before the restart would be charged again. The proxy sees
// the marker gone and refuses it (503 store-lost-keys) instead, and says
// so on /readyz, until an operator accepts the loss.
func TestRedisRestartWithoutPersistenceFailsClosed(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t) // --save "" --appendonly no
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeRedisConfig(t, filepath.Join(dir, "c.yaml"), up.URL, []string{rd.Addr()}, chargesRoute))

	if r := charge(p, "ORD-L1"); r.status != 201 {
		t.Fatalf("ORD-L1 = %d %s %v, want 201", r.status, r.body, r.err)
	}
	replayed(t, p, "ORD-L1")
	rd.Restart()
	var r result
	eventually(t, "ORD-L1 is refused as lost after the restart", func() bool {
		r = charge(p, "ORD-L1")
		return problemType(r) == "store-lost-keys"
	})
	if r.status != 503 {
		t.Errorf("ORD-L1 after a Redis restart without persistence = %d %s, want 503 store-lost-keys", r.status, r.body)
	}
	eventually(t, "readyz names the loss", func() bool {
		rz := do("GET", p.adminURL("/readyz"), "")
		return rz.status == 503 && strings.Contains(rz.body, "store-lost-keys")
	})
	if got := chargeCount(t, up.URL, "ORD-L1"); got != 1 {
		t.Errorf("ORD-L1 charges = %d, want 1: the restart lost the committed answer, and nothing may be charged again", got)
	}
}

// TestRedisClusterStorm: two replicas on a three-node Redis Cluster, a
// storm of duplicates over many orders: every order is charged once, and
// the keys really live on different nodes.
func TestRedisClusterStorm(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeRedisConfig(t, filepath.Join(dir, "c.yaml"), up.URL, cl.Addrs(), chargesRoute)
	procs := []*proc{startProxy(t, cfg), startProxy(t, cfg)}

	const orders, copies = 30, 4
	answers := make([][]sent, orders)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for o := range orders {
		answers[o] = make([]sent, copies)
		for c := range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				i := (o + c) % len(procs)
				answers[o][c] = sent{i, charge(procs[i], fmt.Sprintf("ORD-CL%02d", o), delayed...)}
			}()
		}
	}
	close(start)
	wg.Wait()

	var nReplayed, nInFlight int
	for o := range orders {
		order := fmt.Sprintf("ORD-CL%02d", o)
		for _, a := range answers[o] {
			if a.err != nil {
				t.Fatalf("%s via replica %d: %v", order, a.replica, a.err)
			}
		}
		forwarded, r, f := tally(t, order, answers[o])
		nReplayed, nInFlight = nReplayed+r, nInFlight+f
		if len(forwarded) != 1 {
			t.Errorf("%s: forwarded answers = %d, want 1", order, len(forwarded))
		}
		if got := chargeCount(t, up.URL, order); got != 1 {
			t.Errorf("%s charges = %d, want 1", order, got)
		}
	}
	t.Logf("storm: %d orders, %d replayed, %d request-in-flight", orders, nReplayed, nInFlight)

	// Each node holds only its own slots' keys.
	total, holders := 0, 0
	for _, node := range cl.Nodes {
		reply, err := node.Do("KEYS", e2eKeyPrefix+"*")
		if err != nil {
			t.Fatalf("KEYS on %s: %v", node.Addr(), err)
		}
		n := 0
		for _, k := range strings.Split(reply, "\n") {
			// The orders' records; beside them the epoch marker, the
			// registry of keyspaces, the canaries and, for a moment,
			// the write probe's key.
			if strings.HasPrefix(k, e2eKeyPrefix+"charges/") {
				n++
			}
		}
		t.Logf("node %s holds %d keys", node.Addr(), n)
		total += n
		if n > 0 {
			holders++
		}
	}
	if total != orders {
		t.Errorf("order records in the cluster = %d, want %d (one per order)", total, orders)
	}
	if holders < 2 {
		t.Errorf("keys live on %d node(s), want at least 2: the storm did not cross nodes", holders)
	}
}

// waitNotWritable waits until /readyz on p is 503 because the store takes
// no writes (while what), each answer coming at once, not after the
// store's own stall; it logs how long that took and checks the reason
// and idemproxy_store_writable.
func waitNotWritable(t *testing.T, p *proc, what string) {
	t.Helper()
	since := time.Now()
	var r result
	eventually(t, "/readyz 503 while "+what, func() bool {
		start := time.Now()
		r = do("GET", p.adminURL("/readyz"), "")
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("/readyz took %v while %s, want an answer at once", took, what)
		}
		return r.status == 503
	})
	t.Logf("/readyz 503 after %v: %s", time.Since(since).Round(time.Millisecond), r.body)
	if !strings.Contains(r.body, "store unavailable: writes") {
		t.Errorf("/readyz = %q while %s, want the reason (writes fail or stall)", r.body, what)
	}
	if n := metricSum(t, p, "idemproxy_store_writable"); n != 0 {
		t.Errorf("idemproxy_store_writable = %v while %s, want 0", n, what)
	}
}

// TestReadyzWhenRedisPausesWrites: Redis under CLIENT PAUSE WRITE answers
// pings but no write: every charge would fail, so /readyz turns 503 with
// the reason within a few seconds, without waiting on Redis itself, and
// ready again after CLIENT UNPAUSE.
func TestReadyzWhenRedisPausesWrites(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeRedisConfig(t, filepath.Join(dir, "c.yaml"), up.URL, []string{rd.Addr()}, chargesRoute))
	eventually(t, "ready", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })

	if _, err := rd.Do("CLIENT", "PAUSE", "30000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Do("CLIENT", "UNPAUSE") })
	waitNotWritable(t, p, "Redis pauses writes")
	if n := metricSum(t, p, "idemproxy_store_write_probe_failures_total"); n < 1 {
		t.Errorf("idemproxy_store_write_probe_failures_total = %v, want at least 1", n)
	}
	if _, err := rd.Do("CLIENT", "UNPAUSE"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready after CLIENT UNPAUSE", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if r := charge(p, "ORD-UNPAUSED"); r.status != 201 {
		t.Errorf("charge after CLIENT UNPAUSE = %d %s, want 201", r.status, r.body)
	}
	if n := metricSum(t, p, "idemproxy_store_writable"); n != 1 {
		t.Errorf("idemproxy_store_writable = %v once ready, want 1", n)
	}
}
