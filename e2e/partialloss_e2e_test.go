package e2e

// End-to-end tests of the canaries and the witness of answered keys (issue
// #35, items 2 and 3) with the real binary: a store that lost some keys,
// not all (Redis evicting under an LRU policy, a replica promoted without
// the last writes, PostgreSQL restored from an older dump), keeps its
// epoch marker, yet is caught: nothing is charged twice, retries are
// refused with 503 store-lost-keys, /readyz and the metrics say so, one
// ERROR line. And a key released on purpose (an operator on any replica,
// a route's policy, its TTL) is no alarm.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// keysLostLine is the start of the ERROR line of a replica that saw the
// store lose some keys (epoch.Watcher.MarkLost).
const keysLostLine = "the store lost keys:"

// keysLostLines returns p's ERROR lines of a partial loss.
func keysLostLines(p *proc) []string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"level":"ERROR"`) && strings.Contains(sc.Text(), keysLostLine) {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// writeLossConfig writes a configuration whose store section is st (lines
// under "store:", indented by two) and returns its path.
func writeLossConfig(t *testing.T, upstream, st, routes string) string {
	t.Helper()
	return writeLossConfigEvery(t, upstream, epochInterval, st, routes)
}

// writeLossConfigEvery is writeLossConfig with the store checked every
// interval (the epoch marker, and Redis' settings and evictions).
func writeLossConfigEvery(t *testing.T, upstream, interval, st, routes string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	y := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: %s\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  epoch_check_interval: %s\n%sroutes:\n%s",
		upstream, interval, st, routes)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// redisStore is the store section of a single Redis at addr, with canaries
// every canary.
func redisStore(addr, canary string) string {
	return fmt.Sprintf("  canary_interval: %s\n  redis:\n    addrs: [%s]\n    key_prefix: %q\n    op_timeout: 500ms\n    wait_replicas: 0\n",
		canary, addr, e2eKeyPrefix)
}

// chargeAll charges every order through p and fails unless each is a
// forwarded 201.
func chargeAll(t *testing.T, p *proc, orders []string) {
	t.Helper()
	for _, o := range orders {
		if r := charge(p, o); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s = %d %s, want a forwarded 201", o, r.status, r.body)
		}
	}
}

// orderNames returns n order IDs beginning with prefix.
func orderNames(prefix string, n int) []string {
	o := make([]string, n)
	for i := range o {
		o[i] = prefix + strconv.Itoa(i)
	}
	return o
}

// retryAll retries every order through p, and fails when one is charged
// twice or answered otherwise than replayed or 503 store-lost-keys. It
// returns how many were refused.
func retryAll(t *testing.T, p *proc, stubURL string, orders []string) (refused int) {
	t.Helper()
	for _, o := range orders {
		r := charge(p, o)
		switch {
		case r.status == 201 && r.header.Get("Idempotent-Replayed") == "true":
		case r.status == 503 && problemType(r) == "store-lost-keys":
			refused++
		default:
			t.Errorf("retry of %s = %d %s, want its replay or 503 store-lost-keys", o, r.status, r.body)
		}
	}
	for _, o := range orders {
		if got := chargeCount(t, stubURL, o); got != 1 {
			t.Errorf("%s charged %d times, want 1", o, got)
		}
	}
	return refused
}

// wantPartialLoss checks what an operator sees of a store marked lost for
// a partial loss: /readyz 503 naming what was seen (want), the gauge, one
// ERROR line.
func wantPartialLoss(t *testing.T, name string, p *proc, want string) {
	t.Helper()
	eventually(t, name+": /readyz 503 naming "+want, func() bool {
		rz := do("GET", p.adminURL("/readyz"), "")
		return rz.status == 503 && strings.Contains(rz.body, "store-lost-keys") && strings.Contains(rz.body, want)
	})
	if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 1 {
		t.Errorf("%s: idemproxy_store_keys_lost = %v, want 1", name, got)
	}
	eventually(t, name+": the ERROR line written", func() bool { return len(keysLostLines(p)) > 0 })
	if l := keysLostLines(p); len(l) != 1 || !strings.Contains(l[0], want) {
		t.Errorf("%s: ERROR lines %q, want one naming %q", name, l, want)
	}
}

// canariesWritten waits until p wrote two more canaries.
func canariesWritten(t *testing.T, p *proc) {
	t.Helper()
	n := metricSum(t, p, "idemproxy_store_canary_writes_total", `result="ok"`)
	eventually(t, "two canaries written", func() bool {
		return metricSum(t, p, "idemproxy_store_canary_writes_total", `result="ok"`) >= n+2
	})
}

// fillUntilEvicted writes filler keys to the Redis at addr (with a TTL
// when ttl) until it evicted at least n keys.
func fillUntilEvicted(t *testing.T, addr string, n int, ttl bool) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	val := strings.Repeat("x", 8<<10)
	for i := 0; ; i++ {
		pipe := c.Pipeline()
		for j := range 50 {
			k := "filler:" + strconv.Itoa(i*50+j)
			if ttl {
				pipe.Set(ctx, k, val, time.Hour)
			} else {
				pipe.Set(ctx, k, val, 0)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("fill: %v", err)
		}
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if ev, _ := strconv.Atoi(infoValue(info, "evicted_keys")); ev >= n {
			return
		}
		if i > 2000 {
			t.Fatalf("no %d keys evicted after %d filler keys", n, i*50)
		}
	}
}

// infoValue is the value of field in an INFO reply.
func infoValue(info, field string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v
		}
	}
	return ""
}

// TestRedisEvictionWitnessed: Redis given a small maxmemory and an LRU
// policy at run time evicts answered keys (under volatile-lru every key,
// which has a TTL, but never the epoch marker, which has none). The retry
// of an evicted key is refused with 503 store-lost-keys (never forwarded:
// nothing is charged twice) and every later retry is refused or replayed.
// Under volatile-lru, where the marker stays, the witness is what sees it:
// the store is marked lost, /readyz names the lost key's route, one ERROR
// line.
func TestRedisEvictionWitnessed(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "del"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			rd := redistest.Start(t)
			up := startStub(t)
			// Canaries once a minute, and the eviction policy opted in
			// to (without the opt-in the policy set at run time is
			// refused within a check interval:
			// TestRedisEvictionPolicySetAtRunTimeRefuses): the witness
			// or the check of Redis' evicted_keys sees the eviction,
			// whichever comes first; keys deleted behind the proxy's
			// back ("del") only the witness can see.
			st := strings.Replace(redisStore(rd.Addr(), "1m"), "    wait_replicas: 0\n", "    wait_replicas: 0\n    allow_eviction: true\n", 1)
			cfg := writeLossConfig(t, up.URL, st, chargesRoute)
			p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
			orders := orderNames("ORD-EV-", 200)
			chargeAll(t, p, orders)
			if policy == "del" {
				for _, o := range orders[:100] {
					if _, err := rd.Do("DEL", e2eKeyPrefix+"charges/-/"+o); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				used, err := rd.Do("INFO", "memory")
				if err != nil {
					t.Fatal(err)
				}
				mem, _ := strconv.Atoi(infoValue(used, "used_memory"))
				for _, kv := range [][2]string{{"maxmemory-policy", policy}, {"maxmemory", strconv.Itoa(mem + 2<<20)}} {
					if _, err := rd.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
						t.Fatal(err)
					}
				}
				fillUntilEvicted(t, rd.Addr(), 2000, policy == "volatile-lru")
			}
			refused := retryAll(t, p, up.URL, orders)
			if refused == 0 {
				t.Fatalf("no retry refused after evictions: the eviction was not seen")
			}
			if policy == "allkeys-lru" {
				// The LRU may have evicted the marker too (it is read
				// at every check, but so is much else): then the
				// marker's watch sees the loss first. Either way,
				// nothing was charged twice and the store is lost.
				eventually(t, "/readyz 503 store-lost-keys", func() bool {
					rz := do("GET", p.adminURL("/readyz"), "")
					return rz.status == 503 && strings.Contains(rz.body, "store-lost-keys")
				})
				return
			}
			if v, _ := rd.Do("HGET", e2eKeyPrefix+"epoch", "eid"); v == "" {
				t.Errorf("the epoch marker, which has no TTL, was evicted under %s", policy)
			}
			hits := metricSum(t, p, "idemproxy_witness_hits_total", `verdict="lost"`)
			if policy == "del" {
				if hits != 1 {
					t.Errorf("idemproxy_witness_hits_total{verdict=lost} = %v, want 1 (the first retry of a deleted key)", hits)
				}
				wantPartialLoss(t, policy, p, "route charges")
			} else {
				// The witness (the first retry of an evicted key) or
				// the next check of evicted_keys: one of them.
				if hits > 1 {
					t.Errorf("idemproxy_witness_hits_total{verdict=lost} = %v, want at most 1", hits)
				}
				wantPartialLoss(t, policy, p, "")
			}

			// Accepted: a retry of a key answered before the loss is
			// forwarded again, on purpose, and is no new alarm.
			if _, err := rd.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
				t.Fatal(err)
			}
			ra := do("POST", p.adminURL("/v1/store/accept-loss?reason=evicted"), "",
				"Authorization", "Bearer "+adminToken, "X-Operator", "bob")
			if ra.status != 200 {
				t.Fatalf("accept-loss = %d %s, want 200", ra.status, ra.body)
			}
			eventually(t, "serving again", func() bool { return metricSum(t, p, "idemproxy_store_keys_lost") == 0 })
			var evicted string
			for _, o := range orders {
				if v, _ := rd.Do("EXISTS", e2eKeyPrefix+"charges/-/"+o); v == "0" {
					evicted = o
					break
				}
			}
			if r := charge(p, evicted); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("evicted %s after the acceptance = %d %s, want a forwarded 201", evicted, r.status, r.body)
			}
			if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 0 || len(keysLostLines(p)) != 1 {
				t.Errorf("after the acceptance: idemproxy_store_keys_lost = %v, %d ERROR lines; want 0 and still 1: %q", got, len(keysLostLines(p)), keysLostLines(p))
			}
		})
	}
}

// relay is a TCP relay to a target that can be switched (clients pointed
// at a promoted replica, as a DNS name or a virtual IP would) or cut (a
// replication link broken).
type relay struct {
	ln     net.Listener
	mu     sync.Mutex
	target string // "": cut
	conns  map[net.Conn]bool
}

// startRelay relays connections on a loopback port to target until the
// test ends.
func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); r.switchTo("") })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) port() string { return strconv.Itoa(r.ln.Addr().(*net.TCPAddr).Port) }

func (r *relay) serve(c net.Conn) {
	r.mu.Lock()
	target := r.target
	r.mu.Unlock()
	if target == "" {
		c.Close()
		return
	}
	u, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.target != target {
		r.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	r.conns[c], r.conns[u] = true, true
	r.mu.Unlock()
	go func() { io.Copy(u, c); u.Close(); c.Close() }()
	io.Copy(c, u)
	c.Close()
	u.Close()
}

// switchTo closes every relayed connection and relays the next ones to
// target ("": none).
func (r *relay) switchTo(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = target
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// startLaggingReplica starts a master and a replica whose replication link
// goes through a relay, in sync, and returns them with the relay (cut it
// to leave the replica behind).
func startLaggingReplica(t *testing.T) (master, replica *redistest.Server, link *relay) {
	t.Helper()
	master = redistest.Start(t)
	link = startRelay(t, master.Addr())
	replica = redistest.Start(t, "--replicaof", "127.0.0.1", link.port())
	waitReplicated(t, master, replica)
	return master, replica, link
}

// waitReplicated waits until replica's link is up and it has everything
// master wrote.
func waitReplicated(t *testing.T, master, replica *redistest.Server) {
	t.Helper()
	eventually(t, "the replica in sync", func() bool {
		r, err1 := replica.Do("INFO", "replication")
		m, err2 := master.Do("INFO", "replication")
		return err1 == nil && err2 == nil && infoValue(r, "master_link_status") == "up" &&
			infoValue(r, "slave_repl_offset") == infoValue(m, "master_repl_offset")
	})
}

// TestRedisReplicaPromotedWithoutTheLastWrites: with wait_replicas 0, a
// replica cut off from its master misses the last answered keys; the
// master dies and the replica is promoted, with the epoch marker (it was
// replicated long before). Single node (the clients pointed at the
// promoted replica by a relay, as a DNS name would) and Sentinel (a
// failover): the canaries written while the replica was cut off are
// missing, and the store is marked lost before any retry comes; the
// retries are refused, nothing is charged twice.
func TestRedisReplicaPromotedWithoutTheLastWrites(t *testing.T) {
	t.Parallel()
	for _, topo := range []string{"single", "sentinel"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			master, replica, link := startLaggingReplica(t)
			up := startStub(t)
			var st string
			var clients *relay
			var sen *redistest.Server
			switch topo {
			case "single":
				clients = startRelay(t, master.Addr())
				st = redisStore(clients.addr(), "200ms")
			case "sentinel":
				sen = redistest.StartSentinel(t, master, "mymaster")
				st = fmt.Sprintf("  canary_interval: 200ms\n  redis:\n    addrs: [%s]\n    master_name: mymaster\n    key_prefix: %q\n    op_timeout: 500ms\n    wait_replicas: 0\n",
					sen.Addr(), e2eKeyPrefix)
				eventually(t, "the Sentinel knows the replica", func() bool {
					v, _ := sen.Do("SENTINEL", "REPLICAS", "mymaster")
					return strings.Contains(v, strconv.Itoa(replica.Port()))
				})
			}
			p := startProxy(t, writeLossConfig(t, up.URL, st, chargesRoute))
			before := orderNames("ORD-LA-", 20)
			chargeAll(t, p, before)
			waitReplicated(t, master, replica)

			link.switchTo("") // the replica falls behind
			lagged := orderNames("ORD-LB-", 20)
			chargeAll(t, p, lagged)
			canariesWritten(t, p) // to the master alone

			switch topo {
			case "single":
				master.Stop()
				if _, err := replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
					t.Fatal(err)
				}
				clients.switchTo(replica.Addr())
			case "sentinel":
				if v, err := sen.Do("SENTINEL", "FAILOVER", "mymaster"); err != nil {
					t.Fatalf("SENTINEL FAILOVER = %q, %v", v, err)
				}
			}
			// Caught by the canaries, before any retry.
			wantPartialLoss(t, topo, p, "canary")
			if got := metricSum(t, p, "idemproxy_store_canary_checks_total", `result="missing"`); got < 1 {
				t.Errorf("idemproxy_store_canary_checks_total{result=missing} = %v, want at least 1", got)
			}
			if refused := retryAll(t, p, up.URL, lagged); refused != len(lagged) {
				t.Errorf("%d of %d retries of the lost orders refused, want all", refused, len(lagged))
			}
		})
	}
}

// TestPostgresRestoredFromAnOlderDump: the key table restored from a
// snapshot taken before some orders were charged, in one transaction (the
// rows replaced) or as a new table swapped in by renames: the marker is
// the same, but the canaries written since the snapshot are missing, and
// the store is marked lost; the retries of the orders charged after the
// snapshot are refused, never charged twice.
func TestPostgresRestoredFromAnOlderDump(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"in-place", "swapped"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pg := pgtest.Start(t)
			up := startStub(t)
			cfg := writePostgresConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, chargesRoute,
				"  epoch_check_interval: "+epochInterval+"\n  canary_interval: 200ms\n")
			p := startPostgresProxy(t, cfg, pg)
			before := orderNames("ORD-PB-", 10)
			chargeAll(t, p, before)
			pg.MustExec("CREATE TABLE dump AS SELECT * FROM public.idemproxy_keys")
			after := orderNames("ORD-PA-", 10)
			chargeAll(t, p, after)
			canariesWritten(t, p) // after the dump
			switch how {
			case "in-place":
				pg.MustExec("BEGIN; DELETE FROM public.idemproxy_keys; INSERT INTO public.idemproxy_keys SELECT * FROM dump; COMMIT")
			case "swapped":
				pg.MustExec("CREATE TABLE restored (LIKE public.idemproxy_keys INCLUDING ALL); INSERT INTO restored SELECT * FROM dump")
				pg.MustExec("BEGIN; ALTER TABLE public.idemproxy_keys RENAME TO replaced; ALTER TABLE restored RENAME TO idemproxy_keys; COMMIT")
			}
			wantPartialLoss(t, how, p, "canary")
			if refused := retryAll(t, p, up.URL, after); refused != len(after) {
				t.Errorf("%d of %d retries of the orders charged after the dump refused, want all", refused, len(after))
			}
		})
	}
}

// shortRoute is the charges route releasing on a 5xx, with a TTL shorter
// than the witness window.
const shortRoute = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    policy: release-on-5xx
    upstream_timeout: 1s
    lease: 2s
    ttl: 4s
`

// TestWitnessNoFalseAlarm: two replicas sharing a Redis. Keys answered and
// then let go on purpose are reserved again without an alarm: released by
// an operator through the admin API of the replica that answered them or
// of the other one (a release mark in the store tells the witness), by a
// route's policy (a 429 refused, a 5xx under release-on-5xx: never
// answered, never witnessed), or expired by a route's TTL shorter than the
// window (a third replica, whose route says so). The store stays trusted,
// nothing is refused.
func TestWitnessNoFalseAlarm(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	cfg := writeLossConfig(t, up.URL, redisStore(rd.Addr(), "200ms"), chargesRoute)
	a := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	b := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN="+adminToken)
	// c, on the same store, keys its route for a short TTL and releases
	// it on a 5xx.
	c := startProxy(t, writeLossConfig(t, up.URL, redisStore(rd.Addr(), "200ms"), shortRoute))
	forwarded := func(what string, r result) {
		t.Helper()
		if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s = %d %s, want a forwarded 201", what, r.status, r.body)
		}
	}
	release := func(p *proc, order string) {
		t.Helper()
		r := do("DELETE", p.adminURL("/v1/keys/charges/"+order+"?reason=refund+reissued"), "",
			"Authorization", "Bearer "+adminToken, "X-Operator", "alice")
		if r.status != 200 {
			t.Fatalf("release of %s = %d %s, want 200", order, r.status, r.body)
		}
	}
	// An operator's release, on the replica that answered and on the other.
	for _, tc := range []struct {
		order    string
		releaser *proc
	}{{"ORD-NA-1", a}, {"ORD-NA-2", b}} {
		forwarded(tc.order, charge(a, tc.order))
		release(tc.releaser, tc.order)
		forwarded(tc.order+" after its release", charge(a, tc.order))
	}
	// A route's policy: a 429 is released, a 500 under release-on-5xx too.
	if r := charge(a, "ORD-NA-3", "X-Stub-Fault", "reject-429"); r.status != 429 {
		t.Fatalf("ORD-NA-3 with the 429 fault = %d %s, want 429", r.status, r.body)
	}
	forwarded("ORD-NA-3 after its 429", charge(a, "ORD-NA-3"))
	if r := charge(c, "ORD-NA-4", "X-Stub-Fault", "fail-before-charge"); r.status != 500 {
		t.Fatalf("ORD-NA-4 with the 500 fault = %d %s, want 500", r.status, r.body)
	}
	forwarded("ORD-NA-4 after its 500", charge(c, "ORD-NA-4"))
	// A TTL (4s) shorter than the window (5m).
	forwarded("ORD-NA-5", charge(c, "ORD-NA-5"))
	time.Sleep(4500 * time.Millisecond)
	forwarded("ORD-NA-5 after its TTL", charge(c, "ORD-NA-5"))

	time.Sleep(time.Second) // canaries read back meanwhile
	for name, p := range map[string]*proc{"a": a, "b": b, "c": c} {
		if got := metricSum(t, p, "idemproxy_store_keys_lost"); got != 0 {
			t.Errorf("replica %s: idemproxy_store_keys_lost = %v, want 0", name, got)
		}
		if l := keysLostLines(p); len(l) != 0 {
			t.Errorf("replica %s: ERROR lines %q, want none", name, l)
		}
	}
	if got := metricSum(t, a, "idemproxy_witness_hits_total", `verdict="released"`); got != 2 {
		t.Errorf("idemproxy_witness_hits_total{verdict=released} = %v, want 2 (the operator's releases)", got)
	}
	if got := metricSum(t, a, "idemproxy_witness_hits_total", `verdict="lost"`); got != 0 {
		t.Errorf("idemproxy_witness_hits_total{verdict=lost} = %v, want 0", got)
	}
	if got := metricSum(t, a, "idemproxy_store_canary_checks_total", `result="ok"`); got < 1 {
		t.Errorf("idemproxy_store_canary_checks_total{result=ok} = %v, want canaries read back", got)
	}
	if r := charge(b, "ORD-NA-6"); r.status != 201 {
		t.Errorf("a new order on b = %d %s, want 201", r.status, r.body)
	}
}

// TestWitnessReleaseMarkOutlivesEveryWindow: replicas sharing a store may
// remember their answers for different windows (store.witness_window is
// changed by a rolling restart, or differs between two fleets). A key that
// the replica with the long window answered, released by an operator
// through the replica with the short one and charged again is forwarded:
// the release mark outlives every replica's window, so that the store is
// not marked lost. The mark's lifetime is read from Redis (its TTL longer
// than the long window) rather than waited for: a mark kept for the short
// window and its margin (1 min) would be gone within the long one.
func TestWitnessReleaseMarkOutlivesEveryWindow(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t)
	up := startStub(t)
	a := startProxy(t, writeLossConfig(t, up.URL, "  witness_window: 10m\n"+redisStore(rd.Addr(), "200ms"), chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN="+adminToken)
	b := startProxy(t, writeLossConfig(t, up.URL, "  witness_window: 1s\n"+redisStore(rd.Addr(), "200ms"), chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN="+adminToken)
	if r := charge(a, "ORD-MW-1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("ORD-MW-1 = %d %s, want a forwarded 201", r.status, r.body)
	}
	r := do("DELETE", b.adminURL("/v1/keys/charges/ORD-MW-1?reason=refund+reissued"), "",
		"Authorization", "Bearer "+adminToken, "X-Operator", "alice")
	if r.status != 200 {
		t.Fatalf("release of ORD-MW-1 on b = %d %s, want 200", r.status, r.body)
	}
	// The mark lasts past a's window (10 min), not b's window (1 s) and
	// the mark's margin (1 min).
	marks, err := rd.Do("KEYS", "*released/*")
	if err != nil || marks == "" {
		t.Fatalf("release marks in Redis: %q %v, want the mark of ORD-MW-1", marks, err)
	}
	for _, k := range strings.Split(marks, "\n") {
		ms, err := rd.Do("PTTL", k)
		if ttl, perr := strconv.ParseInt(ms, 10, 64); err != nil || perr != nil || time.Duration(ttl)*time.Millisecond <= 10*time.Minute {
			t.Errorf("release mark %s: PTTL %q %v, want longer than the longest window (10m)", k, ms, err)
		}
	}
	time.Sleep(time.Second + 100*time.Millisecond) // b's window over
	if r := charge(a, "ORD-MW-1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("ORD-MW-1 after its release = %d %s, want a forwarded 201", r.status, r.body)
	}
	if got := metricSum(t, a, "idemproxy_witness_hits_total", `verdict="released"`); got != 1 {
		t.Errorf("idemproxy_witness_hits_total{verdict=released} on a = %v, want 1 (the mark read)", got)
	}
	if got := metricSum(t, a, "idemproxy_store_keys_lost"); got != 0 {
		t.Errorf("idemproxy_store_keys_lost = %v, want 0", got)
	}
	if l := keysLostLines(a); len(l) != 0 {
		t.Errorf("ERROR lines %q, want none", l)
	}
}
