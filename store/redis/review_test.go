package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestWaitReplicasRetriedCommitStillWaits pins what wait_replicas rests
// on: a commit whose WAIT failed (the replica alive but not acknowledging:
// paused) is retried by the proxy's settler, here after the store's
// connections were cut (a network blip, which is when retries happen). The
// retry finds the record committed by its first try and writes nothing;
// its WAIT, on a new connection, must still cover the first write. It does
// on Redis 7.0, which sets a connection's WAIT offset after every command,
// writing or not; a Redis that set it only after writes would report the
// retry replicated.
func TestWaitReplicasRetriedCommitStillWaits(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	s := newStore(t, Options{Addrs: []string{primary.Addr()}, WaitReplicas: 1, WaitTimeout: testWaitTimeout})
	c := ctx(t)
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if rec, err := s.Reserve(c, "r/-/k", res); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v; want reserved", rec, err)
	}
	replica.Pause()
	t.Cleanup(replica.Resume)
	if err := s.Commit(c, "r/-/k", "tok", store.Response{Status: 201}, time.Hour); !errors.Is(err, errNotReplicated) {
		t.Fatalf("Commit with the replica paused: %v; want ErrNotReplicated", err)
	}
	if _, err := primary.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(c, "r/-/k", "tok", store.Response{Status: 201}, time.Hour); !errors.Is(err, errNotReplicated) {
		t.Errorf("retried Commit with the replica still paused = %v; want ErrNotReplicated (the replica never acknowledged the commit)", err)
	}
}

// TestWaitReplicasReadsDoNotWaitBehindWrites: with wait_replicas set and
// the replica not acknowledging, a Get made while writes wait for it
// answers within op_timeout, as pipeline.go promises ("a read ... never
// fails for it").
func TestWaitReplicasReadsDoNotWaitBehindWrites(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	s := newStore(t, Options{Addrs: []string{primary.Addr()}, OpTimeout: time.Second, WaitReplicas: 1, WaitTimeout: 3 * time.Second})
	c := ctx(t)
	replica.Pause()
	t.Cleanup(replica.Resume)
	res := store.Reservation{Token: "tok", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for _, k := range []string{"r/-/w1", "r/-/w2"} {
		go s.Reserve(c, k, res)
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	rec, err := s.Get(c, "r/-/absent")
	if err != nil || rec != nil {
		t.Errorf("Get while writes wait for the replica = %v, %v after %v; want no record, no error", rec, err, time.Since(start))
	}
}
