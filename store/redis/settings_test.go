package redis

import (
	"bytes"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// lockedBuffer is a log destination safe for the store's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns the lines holding s.
func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// wantRefused checks that a reservation is refused for setting, writing
// nothing.
func wantRefused(t *testing.T, s *Store, srv *redistest.Server, key, setting string, sentinel error) {
	t.Helper()
	rec, err := s.Reserve(ctx(t), key, res)
	var se *store.SettingError
	if rec != nil || !errors.As(err, &se) || se.Setting != setting || !errors.Is(err, sentinel) || !errors.Is(err, store.ErrUnsafeSettings) {
		t.Fatalf("Reserve(%s) = %+v, %v; want a *store.SettingError for %s", key, rec, err, setting)
	}
	if n, _ := srv.Do("EXISTS", s.prefix+key); n != "0" {
		t.Errorf("EXISTS %s after the refused reservation = %s, want 0", key, n)
	}
}

// TestSettingsChangedAtRunTime: the settings are checked again at every
// check: an eviction policy, then no persistence, set on a running Redis
// refuse reservations, and the fix serves again; each change is one line.
func TestSettingsChangedAtRunTime(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes")
	var logs lockedBuffer
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c := ctx(t)
	check := func() {
		t.Helper()
		for range 2 { // a second check of the same settings logs nothing
			if err := s.CheckSettings(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	check()
	if rec, err := s.Reserve(c, "k/1", res); rec != nil || err != nil {
		t.Fatalf("Reserve = %+v, %v; want nil, nil", rec, err)
	}
	for _, step := range []struct {
		name    string
		config  [][2]string
		setting string // "": served
		err     error
	}{
		{"allkeys-lru", [][2]string{{"maxmemory", "50mb"}, {"maxmemory-policy", "allkeys-lru"}}, "maxmemory-policy", errEvictionPolicy},
		{"noeviction", [][2]string{{"maxmemory-policy", "noeviction"}}, "", nil},
		{"no persistence", [][2]string{{"appendonly", "no"}, {"save", ""}}, "appendonly", errNoPersistence},
		{"snapshots", [][2]string{{"save", "3600 1"}}, "", nil},
	} {
		for _, kv := range step.config {
			if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		check()
		key := "k/" + step.name
		if step.setting != "" {
			wantRefused(t, s, srv, key, step.setting, step.err)
			if err := s.Ping(c); !errors.Is(err, step.err) {
				t.Errorf("%s: Ping = %v, want %v", step.name, err, step.err)
			}
			continue
		}
		if rec, err := s.Reserve(c, key, res); rec != nil || err != nil {
			t.Errorf("%s: Reserve = %+v, %v; want nil, nil", step.name, rec, err)
		}
		if err := s.Ping(c); err != nil {
			t.Errorf("%s: Ping = %v, want nil", step.name, err)
		}
	}
	for _, want := range []struct {
		line string
		n    int
	}{
		{"level=ERROR msg=\"redis runs with a setting that may lose idempotency keys", 2},
		{"level=WARN msg=\"redis no longer runs with a setting", 2},
	} {
		if got := logs.count(want.line); got != want.n {
			t.Errorf("%d lines %q, want %d; log:\n%s", got, want.line, want.n, logs.b.String())
		}
	}

	// The opt-in serves, and says what it sees.
	allow := newStore(t, Options{Addrs: []string{srv.Addr()}, AllowNoPersistence: true})
	if _, err := srv.Do("CONFIG", "SET", "save", ""); err != nil {
		t.Fatal(err)
	}
	if err := allow.Ping(c); err != nil {
		t.Fatalf("Ping with AllowNoPersistence = %v, want nil", err)
	}
	if rec, err := allow.Reserve(c, "k/allowed", res); rec != nil || err != nil {
		t.Errorf("Reserve with AllowNoPersistence = %+v, %v; want nil, nil", rec, err)
	}
	if got := allow.Risks()[riskNoPersistence]; got == "" {
		t.Errorf("Risks() with AllowNoPersistence = %v, want no_persistence seen", allow.Risks())
	}
}

// TestSettingsSeenOnANewConnection: a new connection checks the settings
// before it is used, so a policy set between two checks refuses the
// reservations that follow a reconnection, without waiting for the next
// check.
func TestSettingsSeenOnANewConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	c := ctx(t)
	if rec, err := s.Reserve(c, "k/1", res); rec != nil || err != nil {
		t.Fatalf("Reserve = %+v, %v; want nil, nil", rec, err)
	}
	for _, kv := range [][2]string{{"maxmemory", "50mb"}, {"maxmemory-policy", "volatile-lru"}} {
		if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
		t.Fatal(err)
	}
	// The next command reconnects (the first may fail on the killed
	// connection); the one after that is refused.
	s.Get(c, "k/1")
	s.Get(c, "k/1")
	wantRefused(t, s, srv, "k/2", "maxmemory-policy", errEvictionPolicy)
}

// evictionsSeen returns a store of srv that allows eviction, and the
// reasons its KeysEvicted was called with so far.
func evictionsSeen(t *testing.T, srv *redistest.Server) (*Store, func() []string) {
	t.Helper()
	var (
		mu      sync.Mutex
		reasons []string
	)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, AllowEviction: true, KeysEvicted: func(r string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, r)
	}})
	return s, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), reasons...)
	}
}

// TestEvictionsCallKeysEvicted: evicted_keys rising is reported (with
// AllowEviction, which serves meanwhile), once per rise; a restart, which
// resets the counter, is not an eviction.
func TestEvictionsCallKeysEvicted(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "volatile-lru")
	s, got := evictionsSeen(t, srv)
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	// Records, which all have a TTL, and a maxmemory below what they
	// take.
	reserveMany(t, s, 0)
	limitBelowUsed(t, srv)
	srv.Do("SET", "trigger", "x") // evicts before it runs
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if r := got(); len(r) != 1 || !strings.Contains(r[0], "evicted") || !strings.Contains(r[0], srv.Addr()) || !strings.Contains(r[0], "volatile-lru") {
		t.Fatalf("KeysEvicted called with %q; want once, naming the node, the evictions and the policy", r)
	}
	if rec, err := s.Reserve(c, "k/after", res); err != nil {
		t.Errorf("Reserve with AllowEviction after the evictions = %+v, %v; want it served", rec, err)
	}
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if r := got(); len(r) != 1 {
		t.Errorf("KeysEvicted called %d times after a check with no new eviction, want 1", len(r))
	}
	srv.Restart() // evicted_keys back to 0, a new run_id
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.CheckSettings(c) != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if r := got(); len(r) != 1 {
		t.Errorf("KeysEvicted called %d times after a restart, want 1 (the counter starts again)", len(r))
	}
}

// TestClusterSettingsOnEveryMaster: one master of a Cluster with an
// eviction policy refuses every reservation, whichever master holds the
// key, until it is fixed.
func TestClusterSettingsOnEveryMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	s := newStore(t, Options{Addrs: cl.Addrs()})
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	bad := cl.Nodes[2]
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lfu"}} {
		if _, err := bad.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		key := "route/scope/key-" + strconv.Itoa(i)
		rec, err := s.Reserve(c, key, res)
		var se *store.SettingError
		if rec != nil || !errors.As(err, &se) || se.Node != bad.Addr() {
			t.Fatalf("Reserve(%s) = %+v, %v; want a *store.SettingError naming %s", key, rec, err, bad.Addr())
		}
	}
	if _, err := bad.Do("CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Reserve(c, "route/scope/fixed", res); rec != nil || err != nil {
		t.Fatalf("Reserve after noeviction = %+v, %v; want nil, nil", rec, err)
	}
}

// evict reserves n records of prefix (AllowEviction) and sets maxmemory
// margin bytes below what Redis uses, then writes once, so that Redis
// evicts; it returns INFO stats evicted_keys after.
func evict(t *testing.T, s *Store, srv *redistest.Server, prefix string, n int, margin int64) int64 {
	t.Helper()
	c := ctx(t)
	for i := range n {
		if rec, err := s.Reserve(c, prefix+strconv.Itoa(i), store.Reservation{Token: "t", Fingerprint: strings.Repeat("f", 500), Lease: time.Minute, TTL: time.Hour}); rec != nil || err != nil {
			t.Fatalf("Reserve = %+v, %v", rec, err)
		}
	}
	info := func(section, field string) int64 {
		t.Helper()
		text, err := srv.Do("INFO", section)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseInt(infoField(text, field), 10, 64)
		return v
	}
	start := info("stats", "evicted_keys")
	evicted := start
	// used_memory may count a buffer freed since (the AOF's at start):
	// a larger margin until Redis evicts.
	for ; evicted == start && margin < 1<<30; margin *= 2 {
		if _, err := srv.Do("CONFIG", "SET", "maxmemory", strconv.FormatInt(info("memory", "used_memory")-margin, 10)); err != nil {
			t.Fatal(err)
		}
		srv.Do("SET", "trigger", "x") // evicts before it runs
		evicted = info("stats", "evicted_keys")
	}
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	return evicted
}

// TestEvictionsAfterTheCounterStartsAgain: evictions made after
// evicted_keys starts again, and before the next check, are a loss: after
// CONFIG RESETSTAT (fewer evictions than the count before the reset), and
// after a restart of a Redis that keeps its records (AOF).
func TestEvictionsAfterTheCounterStartsAgain(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes", "--maxmemory-policy", "volatile-lru")
	s, got := evictionsSeen(t, srv)
	calls := func() int { return len(got()) }
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	before := evict(t, s, srv, "a/", 2000, 300_000)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if n := calls(); n != 1 {
		t.Fatalf("KeysEvicted called %d times after %d evictions, want 1", n, before)
	}

	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	if after := evict(t, s, srv, "b/", 200, 20_000); after == 0 || after >= before {
		t.Fatalf("%d evictions after the reset, want some, fewer than the %d before it", after, before)
	}
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if n := calls(); n != 2 {
		t.Fatalf("KeysEvicted called %d times after evictions that followed CONFIG RESETSTAT, want 2", n)
	}

	srv.Restart() // the records are kept (AOF); evicted_keys starts at 0
	if after := evict(t, s, srv, "c/", 200, 20_000); after == 0 {
		t.Fatal("no eviction after the restart")
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.CheckSettings(c) != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := calls(); n != 3 {
		t.Fatalf("KeysEvicted called %d times after evictions that followed a restart, want 3", n)
	}
}

// TestAcceptedEvictionsAreNoNewLoss: evictions made before an operator
// accepted a loss, and not yet seen by a check, are part of that loss
// (AcceptEvictions: the next check takes a new baseline); evictions made
// after it are a new loss.
func TestAcceptedEvictionsAreNoNewLoss(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "volatile-lru")
	s, got := evictionsSeen(t, srv)
	c := ctx(t)
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	evictions := func() int64 {
		t.Helper()
		info, err := srv.Do("INFO", "stats")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(infoField(info, "evicted_keys"), 10, 64)
		return n
	}
	reserveMany(t, s, 0)
	limitBelowUsed(t, srv)
	reserveMany(t, s, 2000) // evicts as it goes
	if evictions() == 0 {
		t.Fatal("no key evicted")
	}
	s.AcceptEvictions() // the loss accepted before any check saw these
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if r := got(); len(r) != 0 {
		t.Fatalf("KeysEvicted called with %q for evictions made before the acceptance; want none", r)
	}
	before := evictions()
	reserveMany(t, s, 4000)
	if evictions() == before {
		t.Fatal("no key evicted after the acceptance")
	}
	if err := s.CheckSettings(c); err != nil {
		t.Fatal(err)
	}
	if r := got(); len(r) != 1 {
		t.Errorf("KeysEvicted called %d times for evictions made after the acceptance, want 1", len(r))
	}
}

// reserveMany reserves 2,000 records with a TTL, of 500-byte fingerprints,
// from k/from on.
func reserveMany(t *testing.T, s *Store, from int) {
	t.Helper()
	c := ctx(t)
	for i := from; i < from+2000; i++ {
		if rec, err := s.Reserve(c, "k/"+strconv.Itoa(i), store.Reservation{Token: "t", Fingerprint: strings.Repeat("f", 500), Lease: time.Minute, TTL: time.Hour}); rec != nil || err != nil {
			t.Fatalf("Reserve = %+v, %v", rec, err)
		}
	}
}

// limitBelowUsed sets srv's maxmemory 300,000 bytes below the memory it
// uses: the next writes evict.
func limitBelowUsed(t *testing.T, srv *redistest.Server) {
	t.Helper()
	used, err := srv.Do("INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(infoField(used, "used_memory"), 10, 64)
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", strconv.FormatInt(n-300_000, 10)); err != nil {
		t.Fatal(err)
	}
}
