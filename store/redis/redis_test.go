package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

var prefixes atomic.Int64

// newStore returns a Store on addrs with a key prefix of its own, closed
// when the test ends. The fields New requires that opts leaves unset are
// the test's own choices.
func newStore(t *testing.T, opts Options) *Store {
	t.Helper()
	if opts.DialTimeout == 0 {
		opts.DialTimeout = time.Second
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = fmt.Sprintf("test%d:", prefixes.Add(1))
	}
	if opts.OpTimeout == 0 {
		// Generous: the suite runs its cases in parallel, under the race
		// detector, with 1 MiB bodies, on machines busy with other tests.
		// The tests of the timeout itself set their own.
		opts.OpTimeout = 10 * time.Second
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// rawClient is a plain go-redis client for looking at what the store wrote.
func rawClient(t *testing.T, addrs ...string) goredis.UniversalClient {
	t.Helper()
	c := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var res = store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: time.Minute, TTL: time.Hour}

// TestConformance runs the suite on a single node, for the default
// layout (packed) and for the hash layout (layoutHash).
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	t.Run("hash layout", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layoutHash})
		})
	})
}

func TestReconcileConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	t.Run("hash layout", func(t *testing.T) {
		storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
			return newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layoutHash})
		})
	})
	c := redistest.StartCluster(t, 3)
	t.Run("cluster", func(t *testing.T) {
		storetest.RunReconcile(t, func(t *testing.T) storetest.ReconcileStore {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	s := newStore(t, Options{Addrs: c.Addrs()})
	if _, ok := s.client.(*goredis.ClusterClient); !ok {
		t.Fatalf("client for %d addresses is %T, want a cluster client", len(c.Addrs()), s.client)
	}
	// In a group of its own, so that the parallel cases are done before the
	// nodes are counted.
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
	// One seed address with ClusterMode, as behind an AWS ElastiCache
	// configuration endpoint.
	t.Run("one endpoint", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return newStore(t, Options{Addrs: c.Addrs()[:1], ClusterMode: true})
		})
	})

	// The suite's keys are random, so they spread over the cluster; check
	// that every node got some.
	for _, n := range c.Nodes {
		got, err := n.Do("DBSIZE")
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", n.Addr(), err)
		}
		if got == "0" {
			t.Errorf("node %s holds no keys; want the records spread over all nodes", n.Addr())
		}
	}
}

// TestReserveLostReply replays the reserve script exactly as a go-redis retry
// would after the first reply was lost: the second run must recognise the
// caller's own reservation.
func TestReserveLostReply(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	c := ctx(t)
	k := []string{s.prefix + "route/scope/lost"}
	args := []any{res.Token, res.Fingerprint, millis(res.Lease), millis(res.TTL)}
	for i := range 2 {
		v, err := reserveScript.Run(c, s.client, k, args...).Slice()
		if err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if rec, err := decodeRecord(v); rec != nil || err != nil {
			t.Fatalf("run %d = %+v, %v; want nil, nil (reserved)", i+1, rec, err)
		}
	}
	other := append([]any{"tok-b"}, args[1:]...)
	v, err := reserveScript.Run(c, s.client, k, other...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := decodeRecord(v)
	if err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != res.Token {
		t.Fatalf("reserve with another token = %+v, %v; want the in-flight record of %s", rec, err, res.Token)
	}

	// A retried commit whose first reply was lost succeeds and keeps the
	// first answer.
	first := store.Response{Status: 201, Body: []byte("first"), BodyStored: true}
	for i, resp := range []store.Response{first, {Status: 500, BodyStored: true}} {
		if err := s.Commit(c, "route/scope/lost", res.Token, resp, time.Hour); err != nil {
			t.Fatalf("commit %d: %v", i+1, err)
		}
	}
	got, err := s.Get(c, "route/scope/lost")
	if err != nil || got == nil || got.Response == nil || got.Response.Status != 201 || string(got.Response.Body) != "first" {
		t.Fatalf("Get after a repeated commit = %+v, %v; want the first answer", got, err)
	}
}

// TestRedisDown kills Redis under a live Store: every operation fails within
// the op timeout, and the same Store works again once Redis is back.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const opTimeout = 300 * time.Millisecond
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, OpTimeout: opTimeout, DialTimeout: 200 * time.Millisecond})
	c := ctx(t)
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if rec, err := s.Reserve(c, "k/before", res); rec != nil || err != nil {
		t.Fatalf("Reserve = %+v, %v", rec, err)
	}

	srv.Stop()

	ops := []struct {
		name string
		call func() error
	}{
		{"Ping", func() error { return s.Ping(c) }},
		{"Reserve", func() error { _, err := s.Reserve(c, "k/down", res); return err }},
		{"Commit", func() error { return s.Commit(c, "k/before", res.Token, store.Response{Status: 200}, time.Hour) }},
		{"Release", func() error { return s.Release(c, "k/before", res.Token) }},
		{"MarkInDoubt", func() error { return s.MarkInDoubt(c, "k/before", res.Token, time.Hour) }},
		{"Get", func() error { _, err := s.Get(c, "k/before"); return err }},
	}
	// Twice: the first round meets dead pooled connections, the second
	// has to dial.
	for round := 1; round <= 2; round++ {
		for _, op := range ops {
			start := time.Now()
			err := op.call()
			elapsed := time.Since(start)
			t.Logf("round %d: %s with Redis down: %v after %v", round, op.name, err, elapsed.Round(time.Millisecond))
			if err == nil {
				t.Errorf("round %d: %s with Redis down succeeded; want an error", round, op.name)
			} else if errors.Is(err, store.ErrNotOwner) {
				t.Errorf("round %d: %s with Redis down = ErrNotOwner; want a store error", round, op.name)
			}
			// Generous: the point is "bounded", not "fast".
			if limit := opTimeout + 3*time.Second; elapsed > limit {
				t.Errorf("round %d: %s with Redis down took %v; want it bounded by the op timeout %v", round, op.name, elapsed, opTimeout)
			}
		}
	}

	srv.Restart()

	back := time.Now()
	deadline := back.Add(15 * time.Second)
	for {
		err := s.Ping(c)
		if err == nil {
			t.Logf("store recovered %v after Redis came back", time.Since(back).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ping still failing 15s after Redis came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Redis came back empty (no persistence): the store works from scratch.
	if rec, err := s.Reserve(c, "k/before", res); rec != nil || err != nil {
		t.Fatalf("Reserve after restart = %+v, %v; want nil, nil", rec, err)
	}
	if err := s.Commit(c, "k/before", res.Token, store.Response{Status: 200, BodyStored: true}, time.Hour); err != nil {
		t.Fatalf("Commit after restart: %v", err)
	}
	if rec, err := s.Get(c, "k/before"); err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Fatalf("Get after restart = %+v, %v; want a completed record", rec, err)
	}
}

// TestRedisUnresponsive freezes Redis (connections open, no answers, as in a
// partition): operations must give up within the op timeout instead of
// hanging, and work again once Redis answers.
func TestRedisUnresponsive(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const opTimeout = 300 * time.Millisecond
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, OpTimeout: opTimeout})
	c := ctx(t)
	if err := s.Ping(c); err != nil {
		t.Fatalf("Ping: %v", err)
	}

	srv.Pause()
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"Ping", func() error { return s.Ping(c) }},
		{"Reserve", func() error { _, err := s.Reserve(c, "k/frozen", res); return err }},
		{"Get", func() error { _, err := s.Get(c, "k/frozen"); return err }},
		{"Commit", func() error { return s.Commit(c, "k/frozen", res.Token, store.Response{Status: 200}, time.Hour) }},
	} {
		start := time.Now()
		err := op.call()
		elapsed := time.Since(start)
		t.Logf("%s with Redis frozen: %v after %v", op.name, err, elapsed.Round(time.Millisecond))
		if err == nil || errors.Is(err, store.ErrNotOwner) {
			t.Errorf("%s with Redis frozen = %v; want a store error", op.name, err)
		}
		if limit := opTimeout + 3*time.Second; elapsed > limit {
			t.Errorf("%s with Redis frozen took %v; want it bounded by the op timeout %v", op.name, elapsed, opTimeout)
		}
	}
	// The caller's own deadline, when shorter, wins.
	short, cancel := context.WithTimeout(c, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Get(short, "k/frozen"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get with an expired caller deadline = %v; want context.DeadlineExceeded", err)
	}
	srv.Resume()

	deadline := time.Now().Add(15 * time.Second)
	for s.Ping(c) != nil {
		if time.Now().After(deadline) {
			t.Fatal("Ping still failing 15s after Redis resumed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := s.Get(c, "k/frozen"); err != nil {
		t.Fatalf("Get after resume: %v", err)
	}
}

// TestRecordsHaveTTL checks that no record lives without an expiry, in any
// state, and that ExpiresAt reports it.
func TestRecordsHaveTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)

	for _, key := range []string{"a/in_flight", "a/completed", "a/in_doubt", "a/lapsed"} {
		r := res
		if key == "a/lapsed" {
			r.Lease = time.Millisecond
		}
		if rec, err := s.Reserve(c, key, r); rec != nil || err != nil {
			t.Fatalf("Reserve(%s) = %+v, %v", key, rec, err)
		}
	}
	if err := s.Commit(c, "a/completed", res.Token, store.Response{Status: 200, BodyStored: true}, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkInDoubt(c, "a/in_doubt", res.Token, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let a/lapsed's 1ms lease pass

	want := map[string]time.Duration{"a/in_flight": time.Hour, "a/completed": 2 * time.Hour, "a/in_doubt": 3 * time.Hour, "a/lapsed": time.Hour}
	for key, ttl := range want {
		pttl, err := raw.PTTL(c, s.prefix+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl <= ttl-time.Minute || pttl > ttl {
			t.Errorf("PTTL of %s = %v, want about %v", key, pttl, ttl)
		}
		rec, err := s.Get(c, key)
		if err != nil || rec == nil {
			t.Fatalf("Get(%s) = %+v, %v", key, rec, err)
		}
		if until := time.Until(rec.ExpiresAt); until <= ttl-time.Minute || until > ttl+time.Minute {
			t.Errorf("Get(%s).ExpiresAt is %v from now, want about %v", key, until, ttl)
		}
	}

	// Nothing the store wrote lives forever.
	keys, err := raw.Keys(c, s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(want) {
		t.Errorf("store wrote keys %v, want %d", keys, len(want))
	}
	for _, k := range keys {
		if pttl, err := raw.PTTL(c, k).Result(); err != nil || pttl <= 0 {
			t.Errorf("PTTL(%s) = %v, %v; want a positive TTL", k, pttl, err)
		}
	}
}

func TestKeyPrefixAndLayout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	c := ctx(t)

	for _, tc := range []struct {
		prefix, want string
	}{
		{"idemproxy:", "idemproxy:"},
		{"custom/", "custom/"},
	} {
		s, err := New(Options{Addrs: []string{srv.Addr()}, KeyPrefix: tc.prefix, DialTimeout: time.Second, OpTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		key := "route/scope/" + tc.want
		if rec, err := s.Reserve(c, key, res); rec != nil || err != nil {
			t.Fatalf("Reserve = %+v, %v", rec, err)
		}
		v, err := raw.Get(c, tc.want+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if p, err := decodePacked(v); err != nil || p.st != "in_flight" || p.tok != res.Token || p.fp != res.Fingerprint || p.cr == 0 || p.le <= p.cr {
			t.Errorf("prefix %q: record at %q = %+v, %v; want an in-flight record", tc.prefix, tc.want+key, p, err)
		}
		if n, _ := raw.Exists(c, key).Result(); n != 0 {
			t.Errorf("prefix %q: a key without the prefix exists", tc.prefix)
		}
	}
}

func TestCorruptRecordIsAnError(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	for _, layout := range []RecordLayout{layoutPacked, layoutHash} {
		s := newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layout})
		raw.HSet(c, s.prefix+"bad/state", "st", "bogus", "tok", "t", "cr", "1")
		raw.Set(c, s.prefix+"bad/type", "a string", time.Hour)
		for _, key := range []string{"bad/state", "bad/type"} {
			if rec, err := s.Get(c, key); err == nil {
				t.Errorf("%s: Get(%s) = %+v, nil; want an error", layout, key, rec)
			}
			if rec, err := s.Reserve(c, key, res); err == nil {
				t.Errorf("%s: Reserve(%s) = %+v, nil; want an error", layout, key, rec)
			}
			// Neither is the caller's: a commit or mark changes nothing.
			if err := s.Commit(c, key, res.Token, store.Response{Status: 201}, time.Hour); err == nil {
				t.Errorf("%s: Commit(%s) succeeded; want an error", layout, key)
			}
			if err := s.MarkInDoubt(c, key, res.Token, time.Hour); err == nil {
				t.Errorf("%s: MarkInDoubt(%s) succeeded; want an error", layout, key)
			}
		}
		if v := raw.Get(c, s.prefix+"bad/type").Val(); v != "a string" {
			t.Errorf("%s: the corrupt string became %q", layout, v)
		}
	}
}

// TestRecordWithoutTrailers: an answer committed before answers kept their
// trailers (JSON without "trailer") is read as before, with no trailers.
func TestRecordWithoutTrailers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	old := `{"status":201,"header":{"Content-Type":["application/json"]},"body":"eyJpZCI6NDJ9","body_stored":true}`
	raw.HSet(c, s.prefix+"old/answer", "st", "completed", "tok", "t", "fp", "f", "cr", "1", "resp", old)
	raw.PExpire(c, s.prefix+"old/answer", time.Hour)
	rec, err := s.Get(c, "old/answer")
	if err != nil {
		t.Fatal(err)
	}
	want := &store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42}`), BodyStored: true}
	if rec == nil || !reflect.DeepEqual(rec.Response, want) {
		t.Errorf("Get = %+v, want the response %+v", rec, want)
	}
}

// closedPort is Options for a port nothing listens on, with every field
// New requires.
var closedPort = Options{Addrs: []string{"127.0.0.1:1"}, KeyPrefix: "idemproxy:", DialTimeout: time.Second, OpTimeout: 500 * time.Millisecond}

// TestNewOptions: New applies no defaults (package config does): an
// Options without a field it requires is refused, naming the field.
func TestNewOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		change  func(*Options)
		wantErr string
	}{
		{"no address", func(o *Options) { o.Addrs = nil }, "no address"},
		{"no key prefix", func(o *Options) { o.KeyPrefix = "" }, "no key prefix"},
		{"no dial timeout", func(o *Options) { o.DialTimeout = 0 }, "dial timeout 0s is not positive"},
		{"no op timeout", func(o *Options) { o.OpTimeout = 0 }, "op timeout 0s is not positive"},
		{"negative op timeout", func(o *Options) { o.OpTimeout = -1 }, "op timeout -1ns is not positive"},
		{"unknown record layout", func(o *Options) { o.RecordLayout = "json" }, `record layout "json" is not packed or hash`},
		{"record layout in capitals", func(o *Options) { o.RecordLayout = "HASH" }, `record layout "HASH" is not packed or hash`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := closedPort
			tc.change(&opts)
			s, err := New(opts)
			if err == nil {
				s.Close()
				t.Fatalf("New(%+v) succeeded, want an error containing %q", opts, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("New(%+v) = %v, want an error containing %q", opts, err, tc.wantErr)
			}
		})
	}

	s, err := New(closedPort)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.prefix != closedPort.KeyPrefix || s.opTimeout != closedPort.OpTimeout {
		t.Errorf("prefix %q, op timeout %v; want %q, %v", s.prefix, s.opTimeout, closedPort.KeyPrefix, closedPort.OpTimeout)
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Error("Ping of a closed port succeeded, want an error")
	}
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	s, err := New(closedPort)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := context.Background()
	checks := map[string]error{
		"empty key":         func() error { _, err := s.Reserve(c, "", res); return err }(),
		"empty token":       func() error { _, err := s.Reserve(c, "k", store.Reservation{Lease: 1, TTL: 1}); return err }(),
		"zero lease":        func() error { _, err := s.Reserve(c, "k", store.Reservation{Token: "t", TTL: 1}); return err }(),
		"zero commit ttl":   s.Commit(c, "k", "t", store.Response{}, 0),
		"empty release tok": s.Release(c, "k", ""),
	}
	for name, err := range checks {
		if err == nil || errors.Is(err, store.ErrNotOwner) {
			t.Errorf("%s: err = %v, want an argument error", name, err)
		}
	}
	if got := millis(time.Nanosecond); got != 1 {
		t.Errorf("millis(1ns) = %d, want 1 (never 0)", got)
	}
}

// TestLargestTTLKeepsTheReservation: the configuration accepts a ttl up
// to the largest duration ("2562047h47m16.854775807s"). Its conversion to
// milliseconds overflowed to a negative PEXPIRE, which deleted the
// reservation as it was made: the next request with the key was forwarded
// too, and charged twice.
func TestLargestTTLKeepsTheReservation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	huge := store.Reservation{Token: "tok-a", Fingerprint: "fp-a", Lease: time.Minute, TTL: math.MaxInt64}
	if rec, err := s.Reserve(ctx(t), "r/-/k", huge); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v; want nil, nil", rec, err)
	}
	rec, err := s.Reserve(ctx(t), "r/-/k", store.Reservation{Token: "tok-b", Fingerprint: "fp-a", Lease: time.Minute, TTL: time.Hour})
	if err != nil || rec == nil || rec.State != store.StateInFlight {
		t.Fatalf("second Reserve = %+v, %v; want the first reservation, in flight", rec, err)
	}
	for _, d := range []time.Duration{1, time.Millisecond, time.Millisecond + 1, math.MaxInt64} {
		if got := millis(d); got <= 0 || time.Duration(got) < d/time.Millisecond {
			t.Errorf("millis(%d) = %d", d, got)
		}
	}
}

// TestCommitWhenRedisIsFull fills a Redis run with maxmemory and
// maxmemory-policy noeviction after a request was reserved and forwarded:
// new reservations are refused (a 503, nothing forwarded), but the commit
// of the answered request must still be stored. Refused, it left the key
// in flight and then in doubt for its whole TTL: every retry got 409
// instead of the answer the upstream had given.
//
// It runs for both layouts; with the hash layout, a packed record (of a
// replica with the packed layout) is committed too: its rewrite as a hash
// starts with a DEL, so a full Redis lets it finish.
func TestCommitWhenRedisIsFull(t *testing.T) {
	t.Parallel()
	for _, layout := range []RecordLayout{layoutPacked, layoutHash} {
		t.Run(string(layout), func(t *testing.T) { commitWhenRedisIsFull(t, layout) })
	}
}

func commitWhenRedisIsFull(t *testing.T, layout RecordLayout) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layout})
	c := ctx(t)
	if rec, err := s.Reserve(c, "r/-/answered", res); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v; want nil, nil", rec, err)
	}
	committed := []string{"r/-/answered", "r/-/doubt"}
	if layout == layoutHash {
		packed := newStore(t, Options{Addrs: []string{srv.Addr()}, KeyPrefix: s.prefix})
		if rec, err := packed.Reserve(c, "r/-/packed", res); err != nil || rec != nil {
			t.Fatalf("Reserve (packed) = %+v, %v; want nil, nil", rec, err)
		}
		committed = append(committed, "r/-/packed")
	}
	// A record marked in doubt has no lease field left to delete.
	if rec, err := s.Reserve(c, "r/-/doubt", res); err != nil || rec != nil {
		t.Fatalf("Reserve = %+v, %v; want nil, nil", rec, err)
	}
	if err := s.MarkInDoubt(c, "r/-/doubt", res.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Set the limit just above what Redis uses now, then fill with small
	// keys until even a small write is refused (a large one that fails
	// frees its buffers, which may bring Redis back under the limit).
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer admin.Close()
	info, err := admin.Info(c, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used, err := strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(c, "maxmemory", fmt.Sprint(used+64<<10)).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		err := admin.Set(c, fmt.Sprint("fill", i), "x", 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
		if err != nil || i > 1e6 {
			t.Fatalf("filling Redis: %d keys, %v", i, err)
		}
	}
	other := res
	other.Token = "tok-other"
	if rec, err := s.Reserve(c, "r/-/new", other); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Reserve on a full Redis = %+v, %v; want an OOM error", rec, err)
	}
	answer := store.Response{Status: 201, Body: []byte(strings.Repeat("a", 2000)), BodyStored: true}
	for _, key := range committed {
		if err := s.Commit(c, key, res.Token, answer, time.Hour); err != nil {
			t.Fatalf("Commit %s on a full Redis: %v; want the answer stored", key, err)
		}
		got, err := s.Get(c, key)
		if err != nil || got == nil || got.State != store.StateCompleted || got.Response == nil || got.Response.Status != 201 {
			t.Fatalf("Get %s after the commit = %+v, %v; want the committed answer", key, got, err)
		}
	}
}
