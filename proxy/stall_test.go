package proxy_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/redistest"
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

	wantStatus(t, "warm-up", e.charge(`"ORD-W"`, 1), 201, "")
	first := make(chan answer, 1)
	go func() { first <- e.charge(`"ORD-R1"`, 1, "X-Hold", "1") }()
	<-g.arrived
	srv.Pause()
	wantStatus(t, "during the stall", e.charge(`"ORD-R2"`, 1), 503, "store-unavailable")
	close(g.open)
	wantStatus(t, "answered during the stall", <-first, 201, "")
	eventually(t, "the commit fails while Redis is frozen", func() bool { return settleErrors(t, reg, "commit") })
	srv.Resume()

	eventually(t, "the commit is retried and ORD-R1 completed", func() bool { return state("ORD-R1") == store.StateCompleted })
	if got := state("ORD-R2"); got != "" {
		t.Errorf("the request answered 503 left its key %q", got)
	}
	a := e.charge(`"ORD-R1"`, 1)
	if a.status != 201 || !a.replayed() {
		t.Errorf("retry of ORD-R1: %s, want the 201 replayed", a)
	}
	wantStatus(t, "ORD-R2 after the stall", e.charge(`"ORD-R2"`, 1), 201, "")
	for _, o := range []string{"ORD-R1", "ORD-R2"} {
		if got := e.charges(o); got != 1 {
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
	wantStatus(t, "warm-up", e.charge(`"ORD-W"`, 1), 201, "")
	first := make(chan answer, 1)
	go func() { first <- e.charge(`"ORD-L1"`, 1, "X-Hold", "1", "X-Stub-Fault", "reject-429") }()
	<-g.arrived
	srv.Pause()
	close(g.open)
	wantStatus(t, "refused during the stall", <-first, 429, "")
	eventually(t, "the release fails while Redis is frozen", func() bool { return settleErrors(t, reg, "release") })
	srv.Resume()

	eventually(t, "the release is retried and ORD-L1 has no record", func() bool { return stallState(t, st, "ORD-L1") == "" })
	wantStatus(t, "the client's retry of ORD-L1", e.charge(`"ORD-L1"`, 1), 201, "")
	if got := e.charges("ORD-L1"); got != 1 {
		t.Errorf("ORD-L1 charged %d times, want 1", got)
	}
}

// settleErrors reports whether the Redis store has failed op at least once.
func settleErrors(t *testing.T, reg *prometheus.Registry, op string) bool {
	return counterValue(t, reg, "idemproxy_store_errors_total", map[string]string{"store": "redis", "operation": op}) > 0
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
// the stub behind a gate that holds requests sent with X-Hold.
func stallEnv(t *testing.T) (*env, *redistest.Server, *redis.Store, *holdGate, *prometheus.Registry) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "idemproxy:", DialTimeout: time.Second, OpTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	g, up := newHoldGate(t)
	cfg := parseConfig(t, up.URL, chargesByOrder+"    upstream_timeout: 5s\n    lease: 15s\n")
	reg := prometheus.NewRegistry()
	p, err := proxy.New(cfg, proxy.Options{Store: st, StoreName: "redis", Metrics: proxy.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, stub: up, p: p, reg: reg}
	e.srv = httptest.NewServer(p)
	t.Cleanup(e.srv.Close)
	return e, srv, st, g, reg
}
