package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// lostReplyStore applies reservations but loses the reply of the first
// lostReserves of them, and fails the first failedReleases releases, as a
// store behind a network that drops its answers for a while does.
type lostReplyStore struct {
	*badger.Store
	mu             sync.Mutex
	lostReserves   int
	failedReleases int
}

var errLostReply = errors.New("i/o timeout")

func (s *lostReplyStore) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	rec, err := s.Store.Reserve(ctx, key, res)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.lostReserves > 0 {
		s.lostReserves--
		return nil, errLostReply
	}
	return rec, err
}

func (s *lostReplyStore) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	if s.failedReleases > 0 {
		s.failedReleases--
		s.mu.Unlock()
		return errLostReply
	}
	s.mu.Unlock()
	return s.Store.Release(ctx, key, token)
}

// heal makes every release from now on reach the store.
func (s *lostReplyStore) heal() {
	s.mu.Lock()
	s.failedReleases = 0
	s.mu.Unlock()
}

// lostReplyEnv serves a proxy with the route charges (with the further
// fields of route, in YAML) over st, a lostReplyStore on a new Badger
// store.
func lostReplyEnv(t *testing.T, route string, st *lostReplyStore) *proxytest.Env {
	t.Helper()
	up := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(up.Close)
	cfg := proxytest.ParseConfig(t, up.URL, `  - name: charges
    match: POST /charges
    key: {json: orderId}
`+route)
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	st.Store = bs
	p, err := proxy.New(cfg, proxy.Options{Store: st, StoreName: "badger",
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(func() { srv.Close(); bs.Close() })
	return &proxytest.Env{T: t, Stub: up, Server: srv, Proxy: p, Store: bs}
}

// TestReserveWithLostReplyIsReleasedWhenTheStoreComesBack is what the chaos
// run found with seed 101 (a Redis blackhole): a reservation applied whose
// reply was lost is answered 503, and its release, tried once while the
// store was still unreachable, failed; the key stayed in flight, then in
// doubt for its whole TTL, for an order that was never sent. The release
// is retried while the reservation's lease holds.
func TestReserveWithLostReplyIsReleasedWhenTheStoreComesBack(t *testing.T) {
	t.Parallel()
	e := lostReplyEnv(t, `    lease: 30s
    upstream_timeout: 10s
`, &lostReplyStore{lostReserves: 1, failedReleases: 3})

	if a := e.Charge(`"ORD-LOST"`, 5); a.Status != 503 {
		t.Fatalf("charge with the reservation's reply lost = %v, want 503 store-unavailable", a)
	}
	freedThenCharged(e, "ORD-LOST", 20*time.Second)
}

// TestRefusedReservationNeverInDoubt pins issue 36 item 3: a request
// answered 503 because its reservation's reply was lost was never
// forwarded, so its key must never stay in doubt, even when the store
// comes back only after the reservation's lease ended. The release used
// to be retried until the lease only, then logged "it will be in doubt
// when its lease ends": the client that was refused got 409 for the
// key's whole TTL.
func TestRefusedReservationNeverInDoubt(t *testing.T) {
	t.Parallel()
	st := &lostReplyStore{lostReserves: 1, failedReleases: 1 << 30}
	e := lostReplyEnv(t, `    lease: 2s
    upstream_timeout: 1s
    ttl: 1h
`, st)

	if a := e.Charge(`"ORD-REFUSED"`, 5); a.Status != 503 {
		t.Fatalf("charge with the reservation's reply lost = %v, want 503 store-unavailable", a)
	}
	// The store stays failing past the lease: the key reads in doubt.
	waitInDoubt(e, "ORD-REFUSED")
	// Past the lease plus the settler's longest backoff, then the store heals.
	time.Sleep(1500 * time.Millisecond)
	st.heal()
	freedThenCharged(e, "ORD-REFUSED", 30*time.Second)
}

// waitInDoubt waits, at most 30 s, for the key of order, reserved and
// left in flight, to read in doubt once its lease has ended.
func waitInDoubt(e *proxytest.Env, order string) {
	t := e.T
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); e.State("charges", "", order) != store.StateInDoubt; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the key is %q, want it to read in doubt once its lease ended", e.State("charges", "", order))
		}
	}
}

// freedThenCharged waits, at most wait, for the key order of a charge
// answered 503 (never forwarded) to be free, then charges it again: the
// retry is forwarded, and the order charged once.
func freedThenCharged(e *proxytest.Env, order string, wait time.Duration) {
	t := e.T
	t.Helper()
	for deadline := time.Now().Add(wait); e.State("charges", "", order) != ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the key of a request answered 503 and never forwarded is still %q once the store answers again: "+
				"its retries get 409 until the key expires", e.State("charges", "", order))
		}
	}
	if a := e.Charge(`"`+order+`"`, 5); a.Status != 201 {
		t.Fatalf("retry = %v, want 201: forwarded, the first was never sent", a)
	}
	if n := e.Charges(order); n != 1 {
		t.Errorf("%s charged %d times, want 1", order, n)
	}
}

// TestRetryOnTheSameReplicaTakesBackItsUnforwardedReservation is what the
// chaos run found with seed 4001 (PostgreSQL stopped past the lease): a
// request answered 503 with its reservation's reply lost, never
// forwarded, was retried on the same replica once the store answered
// reads again but before the settler's next release: the retry read the
// reservation in doubt and was answered 409, "may have reached the
// upstream", for an order never sent. The replica knows the reservation
// is its own and unforwarded: the retry releases it in its own time, is
// answered 503 while the store refuses the release, and is charged once
// as soon as it takes it.
func TestRetryOnTheSameReplicaTakesBackItsUnforwardedReservation(t *testing.T) {
	st := &lostReplyStore{lostReserves: 1, failedReleases: 1 << 30}
	e := lostReplyEnv(t, `    lease: 1s
    upstream_timeout: 500ms
    ttl: 1h
`, st)
	if a := e.Charge(`"ORD-OWN"`, 5); a.Status != 503 {
		t.Fatalf("charge with the reservation's reply lost = %v, want 503 store-unavailable", a)
	}
	for _, when := range []string{"in its lease", "past its lease"} {
		if when == "past its lease" {
			waitInDoubt(e, "ORD-OWN")
		}
		if a := e.Charge(`"ORD-OWN"`, 5); a.Status != 503 {
			t.Errorf("retry %s while the release still fails = %v, want 503: the first request was never forwarded", when, a)
		}
	}
	st.heal()
	if a := e.Charge(`"ORD-OWN"`, 5); a.Status != 201 {
		t.Fatalf("retry once the store takes the release = %v, want 201: the first request was never forwarded", a)
	}
	if n := e.Charges("ORD-OWN"); n != 1 {
		t.Errorf("ORD-OWN charged %d times, want 1", n)
	}
}
