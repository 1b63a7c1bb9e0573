package e2e

// The Redis store's wait for replicas (store.redis.wait_replicas) with the
// real binary: a charge whose reservation no replica acknowledged is
// answered 503 and never reaches the upstream, so a failover cannot lose a
// reservation the proxy acted on.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// inSync waits until replica's link to primary is up and primary counts
// it.
func inSync(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	eventually(t, "the replica is in sync", func() bool {
		r, err1 := replica.Do("INFO", "replication")
		p, err2 := primary.Do("INFO", "replication")
		return err1 == nil && err2 == nil &&
			strings.Contains(r, "master_link_status:up") && strings.Contains(p, "connected_slaves:1")
	})
}

// TestRedisWaitReplicasFailsClosed: with wait_replicas 1, a charge is
// forwarded once its reservation is on the replica; with the replica
// gone, a charge (and its retry) answers 503 store-unavailable, is not
// charged, and counts in idemproxy_store_replica_wait_failures_total; once
// the replica is back the same order is charged, once.
func TestRedisWaitReplicasFailsClosed(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	inSync(t, primary, replica)
	up := startStub(t)
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  redis:
    addrs: [%s]
    key_prefix: %q
    op_timeout: 500ms
    wait_replicas: 1
    wait_timeout: 1s
routes:
%s`, up.URL, primary.Addr(), e2eKeyPrefix, chargesRoute)
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg)

	if r := charge(p, "ORD-W1"); r.status != 201 {
		t.Fatalf("ORD-W1 with the replica up = %d %s %v, want 201", r.status, r.body, r.err)
	}
	if keys, err := replica.Do("KEYS", "*ORD-W1"); err != nil || keys == "" {
		t.Errorf("the replica holds no record of ORD-W1 (%q, %v): the reservation was forwarded unreplicated", keys, err)
	}

	replica.Stop()
	for _, order := range []string{"ORD-W2", "ORD-W2"} {
		r := charge(p, order)
		if r.status != 503 || problemType(r) != "store-unavailable" {
			t.Errorf("%s with the replica down = %d %s %v, want 503 store-unavailable", order, r.status, r.body, r.err)
		}
	}
	if got := chargeCount(t, up.URL, "ORD-W2"); got != 0 {
		t.Errorf("ORD-W2 charges with the replica down = %d, want 0: an unreplicated reservation was forwarded", got)
	}
	if n := metricSum(t, p, "idemproxy_store_replica_wait_failures_total"); n < 2 {
		t.Errorf("idemproxy_store_replica_wait_failures_total = %v, want >= 2", n)
	}

	replica.Restart()
	inSync(t, primary, replica)
	var again result
	deadline := time.Now().Add(30 * time.Second)
	for {
		again = charge(p, "ORD-W2")
		if again.status != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("ORD-W2 with the replica back = %d %s (replayed %q), want a forwarded 201",
			again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	replayed(t, p, "ORD-W2")
	if got := chargeCount(t, up.URL, "ORD-W2"); got != 1 {
		t.Errorf("ORD-W2 charges = %d, want 1", got)
	}
}
