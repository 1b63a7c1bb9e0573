package proxy_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/redis"
)

// TestRedisStall: Redis freezes (SIGSTOP) while one charge is at the
// upstream and another arrives. The second is a 503 store-unavailable and
// must leave no reservation behind once Redis resumes; the first is
// answered 201, its commit times out, and it must be retried within the
// lease so that the key ends completed, not in doubt for its TTL.
func TestRedisStall(t *testing.T) {
	e, srv, st, g, reg := stallEnv(t)
	state := func(key string) store.State { return stallState(t, st, key) }

	proxytest.WantStatus(t, "warm-up", e.Charge(`"ORD-W"`, 1), 201, "")
	first := make(chan proxytest.Answer, 1)
	go func() { first <- e.Charge(`"ORD-R1"`, 1, "X-Hold", "1") }()
	<-g.arrived
	srv.Pause()
	proxytest.WantStatus(t, "during the stall", e.Charge(`"ORD-R2"`, 1), 503, "store-unavailable")
	close(g.open)
	proxytest.WantStatus(t, "answered during the stall", <-first, 201, "")
	proxytest.Eventually(t, "the commit fails while Redis is frozen", func() bool { return settleErrors(t, reg, "commit") })
	srv.Resume()

	proxytest.Eventually(t, "the commit is retried and ORD-R1 completed", func() bool { return state("ORD-R1") == store.StateCompleted })
	if got := state("ORD-R2"); got != "" {
		t.Errorf("the request answered 503 left its key %q", got)
	}
	a := e.Charge(`"ORD-R1"`, 1)
	if a.Status != 201 || !a.Replayed() {
		t.Errorf("retry of ORD-R1: %s, want the 201 replayed", a)
	}
	proxytest.WantStatus(t, "ORD-R2 after the stall", e.Charge(`"ORD-R2"`, 1), 201, "")
	for _, o := range []string{"ORD-R1", "ORD-R2"} {
		if got := e.Charges(o); got != 1 {
			t.Errorf("%s charged %d times, want 1", o, got)
		}
	}
}

// TestRedisStallRelease: an answer in the release set (429: refused before
// any work) whose release times out while Redis is frozen is released on
// retry within the lease, so the client's retry goes through instead of
// getting 409 for the lease and then the key's whole TTL in doubt.
func TestRedisStallRelease(t *testing.T) {
	e, srv, st, g, reg := stallEnv(t)
	proxytest.WantStatus(t, "warm-up", e.Charge(`"ORD-W"`, 1), 201, "")
	first := make(chan proxytest.Answer, 1)
	go func() { first <- e.Charge(`"ORD-L1"`, 1, "X-Hold", "1", "X-Stub-Fault", "reject-429") }()
	<-g.arrived
	srv.Pause()
	close(g.open)
	proxytest.WantStatus(t, "refused during the stall", <-first, 429, "")
	proxytest.Eventually(t, "the release fails while Redis is frozen", func() bool { return settleErrors(t, reg, "release") })
	srv.Resume()

	proxytest.Eventually(t, "the release is retried and ORD-L1 has no record", func() bool { return stallState(t, st, "ORD-L1") == "" })
	proxytest.WantStatus(t, "the client's retry of ORD-L1", e.Charge(`"ORD-L1"`, 1), 201, "")
	if got := e.Charges("ORD-L1"); got != 1 {
		t.Errorf("ORD-L1 charged %d times, want 1", got)
	}
}

// settleErrors reports whether the Redis store has failed op at least once.
func settleErrors(t *testing.T, reg *prometheus.Registry, op string) bool {
	return proxytest.CounterValue(t, reg, "idemproxy_store_errors_total", map[string]string{"store": "redis", "operation": op}) > 0
}

func stallState(t *testing.T, st *redis.Store, key string) store.State {
	t.Helper()
	rec, err := st.Get(context.Background(), store.Key("charges", "", key))
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if rec == nil {
		return ""
	}
	return rec.State
}

// stallEnv is a proxy on a real Redis with a short op timeout, in front of
// the stub behind a gate that holds requests sent with X-Hold. The tests on
// it are not parallel: every store call but the frozen ones must fit the
// 200 ms, and under a CPU hog beside other tests a read after the resume
// did not.
func stallEnv(t *testing.T) (*proxytest.Env, *redistest.Server, *redis.Store, *holdGate, *prometheus.Registry) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "idemproxy:", DialTimeout: time.Second, OpTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	g, up := newHoldGate(t)
	cfg := proxytest.ParseConfig(t, up.URL, chargesByOrder+"    upstream_timeout: 5s\n    lease: 15s\n")
	reg := prometheus.NewRegistry()
	p, err := proxy.New(cfg, proxy.Options{Store: st, StoreName: "redis", Metrics: proxy.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	e := &proxytest.Env{T: t, Stub: up, Proxy: p, Registry: reg}
	e.Server = httptest.NewServer(p)
	t.Cleanup(e.Server.Close)
	return e, srv, st, g, reg
}
