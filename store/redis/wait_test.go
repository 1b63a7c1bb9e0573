package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// testWaitTimeout is the wait_timeout of the tests of waiting for
// replicas: long enough that a loaded machine's replica acknowledges
// within it, short enough that a stopped replica fails a write quickly.
const testWaitTimeout = 2 * time.Second

// startReplicated starts a primary and a replica of it (--replicaof) and
// waits until the replica is in sync.
func startReplicated(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Start(t)
	replica = redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	waitInSync(t, primary, replica)
	return primary, replica
}

// waitInSync waits until replica's link to primary is up and primary
// counts it online (what WaitAuto waits for).
func waitInSync(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err1 := replica.Do("INFO", "replication")
		p, err2 := primary.Do("INFO", "replication")
		if err1 == nil && err2 == nil && infoField(r, "master_link_status") == "up" && infoField(p, "connected_slaves") == "1" && onlineReplicas(p) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync after 30s: replica %q (%v), primary %q (%v)", r, err1, p, err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rawState returns the state of the record at the full key k as client
// reads it (the packed layout), "" when there is none.
func rawState(ctx context.Context, client goredis.UniversalClient, k string) string {
	p, _ := decodePacked(client.Get(ctx, k).Val())
	return p.st
}

// waitTopologies are the deployments wait_replicas works with: a single
// node with a replica, and the same behind a Sentinel.
var waitTopologies = []struct {
	name string
	opts func(t *testing.T, primary *redistest.Server) Options
}{
	{"single", func(t *testing.T, primary *redistest.Server) Options {
		return Options{Addrs: []string{primary.Addr()}}
	}},
	{"sentinel", func(t *testing.T, primary *redistest.Server) Options {
		sen := redistest.StartSentinel(t, primary, "mymaster")
		return Options{Addrs: []string{sen.Addr()}, MasterName: "mymaster"}
	}},
}

// TestWaitReplicasWritesReachTheReplica: with wait_replicas 1 and the
// replica up, a reservation, a commit and a release succeed, and each is
// on the replica when the call returns: the state a promoted replica
// would serve.
func TestWaitReplicasWritesReachTheReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range waitTopologies {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, replica := startReplicated(t)
			opts := tc.opts(t, primary)
			opts.WaitReplicas, opts.WaitTimeout = 1, testWaitTimeout
			s := newStore(t, opts)
			rep := rawClient(t, replica.Addr())
			c := ctx(t)
			res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			if rec, err := s.Reserve(c, "r/-/k1", res); err != nil || rec != nil {
				t.Fatalf("Reserve = %v, %v; want reserved", rec, err)
			}
			if got := rawState(c, rep, s.prefix+"r/-/k1"); got != string(store.StateInFlight) {
				t.Errorf("replica's state of the reservation = %q, want %q", got, store.StateInFlight)
			}
			if err := s.Commit(c, "r/-/k1", "tok", store.Response{Status: 201}, time.Hour); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if got := rawState(c, rep, s.prefix+"r/-/k1"); got != string(store.StateCompleted) {
				t.Errorf("replica's state after the commit = %q, want %q", got, store.StateCompleted)
			}
			if rec, err := s.Reserve(c, "r/-/k2", res); err != nil || rec != nil {
				t.Fatalf("Reserve k2 = %v, %v; want reserved", rec, err)
			}
			if err := s.Release(c, "r/-/k2", "tok"); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if n := rep.Exists(c, s.prefix+"r/-/k2").Val(); n != 0 {
				t.Errorf("the released key is still on the replica")
			}
			if n := s.replicaWaitFailures(); n != 0 {
				t.Errorf("ReplicaWaitFailures = %d, want 0", n)
			}
		})
	}
}

// TestWaitReplicasFailsWithoutReplica: with wait_replicas 1 and the
// replica gone, a reservation is not reported reserved: it fails with
// errNotReplicated once the wait ran out, alone or in a pipelined batch,
// and so does a commit or an in-doubt mark; reads still answer, and every
// failed write is counted. Once the replica is back, writes succeed again.
// Without wait_replicas the same reservation succeeds (the control).
func TestWaitReplicasFailsWithoutReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range waitTopologies {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, replica := startReplicated(t)
			opts := tc.opts(t, primary)
			control := newStore(t, opts)
			opts.WaitReplicas, opts.WaitTimeout = 1, testWaitTimeout
			s := newStore(t, opts)
			c := ctx(t)
			res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			if rec, err := s.Reserve(c, "r/-/held", res); err != nil || rec != nil {
				t.Fatalf("Reserve with the replica up = %v, %v; want reserved", rec, err)
			}

			replica.Stop()
			start := time.Now()
			rec, err := s.Reserve(c, "r/-/alone", res)
			if !errors.Is(err, errNotReplicated) || rec != nil {
				t.Fatalf("Reserve with the replica down = %v, %v; want an error wrapping ErrNotReplicated", rec, err)
			}
			if took := time.Since(start); took < testWaitTimeout {
				t.Errorf("Reserve failed after %v, before the wait timeout %v: it did not wait", took, testWaitTimeout)
			}
			// Many at once: they share pipelines, each with one WAIT.
			var wg sync.WaitGroup
			errs := make([]error, 16)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rec, err := s.Reserve(c, fmt.Sprintf("r/-/many%d", i), res)
					if err == nil {
						err = fmt.Errorf("reserved (record %v)", rec)
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if !errors.Is(err, errNotReplicated) {
					t.Errorf("concurrent Reserve %d with the replica down: %v; want ErrNotReplicated", i, err)
				}
			}
			if err := s.Commit(c, "r/-/held", "tok", store.Response{Status: 201}, time.Hour); !errors.Is(err, errNotReplicated) {
				t.Errorf("Commit with the replica down: %v; want ErrNotReplicated", err)
			}
			if err := s.MarkInDoubt(c, "r/-/held", "tok", time.Hour); !errors.Is(err, errNotReplicated) {
				t.Errorf("MarkInDoubt with the replica down: %v; want ErrNotReplicated", err)
			}
			if _, err := s.Get(c, "r/-/held"); err != nil {
				t.Errorf("Get with the replica down: %v; reads do not wait", err)
			}
			if got, want := s.replicaWaitFailures(), uint64(1+len(errs)+2); got != want {
				t.Errorf("ReplicaWaitFailures = %d, want %d", got, want)
			}
			if rec, err := control.Reserve(c, "r/-/control", res); err != nil || rec != nil {
				t.Errorf("Reserve without wait_replicas, replica down = %v, %v; want reserved", rec, err)
			}

			replica.Restart()
			waitInSync(t, primary, replica)
			if rec, err := s.Reserve(c, "r/-/after", res); err != nil || rec != nil {
				t.Errorf("Reserve with the replica back = %v, %v; want reserved", rec, err)
			}
		})
	}
}

// TestWaitReplicasOptions: New refuses waiting on a Redis Cluster (a
// pipeline spans nodes, WAIT covers one connection), a negative count,
// and a wait without a timeout.
func TestWaitReplicasOptions(t *testing.T) {
	t.Parallel()
	base := Options{Addrs: []string{"127.0.0.1:1"}, KeyPrefix: "p:", DialTimeout: time.Second, OpTimeout: time.Second}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"cluster mode", func(o *Options) { o.ClusterMode, o.WaitReplicas, o.WaitTimeout = true, 1, time.Second }, "Cluster"},
		{"cluster seeds", func(o *Options) {
			o.Addrs, o.WaitReplicas, o.WaitTimeout = []string{"127.0.0.1:1", "127.0.0.1:2"}, 1, time.Second
		}, "Cluster"},
		{"negative", func(o *Options) { o.WaitReplicas = -1 }, "negative"},
		{"no timeout", func(o *Options) { o.WaitReplicas = 1 }, "wait timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			s, err := New(o)
			if err == nil {
				s.Close()
				t.Fatalf("New(%+v) succeeded; want an error naming %q", o, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v; want it to name %q", err, tc.want)
			}
		})
	}
}

// TestWaitAuto: with WaitAuto, a write waits for one replica while the
// master reports one connected: a stopped replica makes it fail after the
// wait timeout, and a promotion of the replica keeps every reservation
// acknowledged; a master that reports none (never had one, or lost it)
// is not waited on.
func TestWaitAuto(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		primary, replica := startReplicated(t)
		opts := waitTopologies[1].opts(t, primary)
		opts.WaitAuto, opts.WaitTimeout = true, testWaitTimeout
		s := newStore(t, opts)
		c := ctx(t)
		if err := s.CheckSettings(c); err != nil {
			t.Fatal(err)
		}
		replica.Pause()
		if rec, err := s.Reserve(c, "r/-/paused", store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); !errors.Is(err, errNotReplicated) || rec != nil {
			t.Errorf("Reserve through the Sentinel with the replica stopped = %v, %v; want an error wrapping ErrNotReplicated", rec, err)
		}
		replica.Resume()
		// The settings are the master's, named by the Sentinel's name.
		for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "volatile-lru"}} {
			if _, err := primary.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CheckSettings(c); err != nil {
			t.Fatal(err)
		}
		var se *store.SettingError
		if _, err := s.Reserve(c, "r/-/evicting", store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); !errors.As(err, &se) || se.Node != "the Sentinel master mymaster" {
			t.Errorf("Reserve through the Sentinel on a master that may evict = %v; want a *store.SettingError naming the Sentinel master", err)
		}
	})
	primary, replica := startReplicated(t)
	s := newStore(t, Options{Addrs: []string{primary.Addr()}, WaitAuto: true, WaitTimeout: testWaitTimeout})
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}

	replica.Pause()
	start := time.Now()
	rec, err := s.Reserve(c, "r/-/paused", res)
	took := time.Since(start)
	replica.Resume()
	if !errors.Is(err, errNotReplicated) || rec != nil {
		t.Fatalf("Reserve with the replica stopped = %v, %v; want an error wrapping ErrNotReplicated", rec, err)
	}
	if took < testWaitTimeout {
		t.Errorf("Reserve failed after %v, before the wait timeout %v: it did not wait", took, testWaitTimeout)
	}

	// Every reservation acknowledged is on the replica, which a promotion
	// then serves.
	var acked []string
	for i := range 50 {
		k := fmt.Sprintf("r/-/acked%d", i)
		if rec, err := s.Reserve(c, k, res); err == nil && rec == nil {
			acked = append(acked, k)
		}
	}
	if len(acked) == 0 {
		t.Fatal("no reservation acknowledged with the replica back")
	}
	primary.Stop()
	if _, err := replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	promoted := newStore(t, Options{Addrs: []string{replica.Addr()}, KeyPrefix: s.prefix})
	for _, k := range acked {
		if rec, err := promoted.Get(c, k); err != nil || rec == nil || rec.State != store.StateInFlight {
			t.Errorf("%s on the promoted replica = %+v, %v; want the acknowledged reservation", k, rec, err)
		}
	}

	// No replica: no WAIT at all.
	lone := redistest.Start(t)
	s = newStore(t, Options{Addrs: []string{lone.Addr()}, WaitAuto: true, WaitTimeout: testWaitTimeout})
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Reserve(c, "r/-/lone", res); err != nil || rec != nil {
		t.Fatalf("Reserve without a replica = %v, %v; want reserved", rec, err)
	}
	if stats, err := lone.Do("INFO", "commandstats"); err != nil || strings.Contains(stats, "cmdstat_wait:") {
		t.Errorf("INFO commandstats = %q, %v; want no WAIT sent to a master without replicas", stats, err)
	}
}

// TestWaitAutoSkipsAReplicaInItsFirstSync: a replica that is connected
// but still in its first full sync (state wait_bgsave, send_bulk: a new
// replica, or one that lost its link and resyncs, for as long as a large
// data set takes to copy) acknowledges nothing, and holds nothing a
// promotion would keep: with WaitAuto, writes do not wait for it (every
// one would fail after the wait timeout, 503 for the whole sync); once it
// is online they do.
func TestWaitAutoSkipsAReplicaInItsFirstSync(t *testing.T) {
	t.Parallel()
	// The master holds the sync back (waiting for more replicas to join
	// a diskless transfer) until the delay is lifted.
	primary := redistest.Start(t, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "600")
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	waitFor := func(what string, f func(info string) bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			info, err := primary.Do("INFO", "replication")
			if err == nil && f(info) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: INFO replication %q, %v", what, info, err)
			}
		}
	}
	waitFor("the replica connected, waiting for its sync", func(info string) bool {
		return infoField(info, "connected_slaves") == "1" && strings.Contains(info, "state=wait_bgsave")
	})
	s := newStore(t, Options{Addrs: []string{primary.Addr()}, WaitAuto: true, WaitTimeout: testWaitTimeout})
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if rec, err := s.Reserve(c, "r/-/syncing", res); err != nil || rec != nil {
		t.Fatalf("Reserve while the only replica waits for its first sync = %v, %v; want reserved", rec, err)
	}

	if _, err := primary.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
		t.Fatal(err)
	}
	waitInSync(t, primary, replica)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	replica.Pause()
	rec, err := s.Reserve(c, "r/-/online", res)
	replica.Resume()
	if !errors.Is(err, errNotReplicated) || rec != nil {
		t.Fatalf("Reserve with the online replica stopped = %v, %v; want an error wrapping ErrNotReplicated", rec, err)
	}
}
