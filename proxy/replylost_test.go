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

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/proxy/proxytest"
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

// TestReserveWithLostReplyIsReleasedWhenTheStoreComesBack is what the chaos
// run found with seed 101 (a Redis blackhole): a reservation applied whose
// reply was lost is answered 503, and its release, tried once while the
// store was still unreachable, failed; the key stayed in flight, then in
// doubt for its whole TTL, for an order that was never sent. The release
// is retried while the reservation's lease holds.
func TestReserveWithLostReplyIsReleasedWhenTheStoreComesBack(t *testing.T) {
	up := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	defer up.Close()
	cfg := proxytest.ParseConfig(t, up.URL, `  - name: charges
    match: POST /charges
    key: {json: orderId}
    lease: 30s
    upstream_timeout: 10s
`)
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	st := &lostReplyStore{Store: bs, lostReserves: 1, failedReleases: 3}
	p, err := proxy.New(cfg, proxy.Options{Store: st, StoreName: "badger",
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	e := &proxytest.Env{T: t, Stub: up, Server: srv, Proxy: p, Store: bs}

	if a := e.Charge(`"ORD-LOST"`, 5); a.Status != 503 {
		t.Fatalf("charge with the reservation's reply lost = %v, want 503 store-unavailable", a)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.State("charges", "", "ORD-LOST") != "" {
		if time.Now().After(deadline) {
			t.Fatalf("the key of a request answered 503 is still %q once the store answers again: "+
				"its retries get 409 until the key expires, for an order never sent", e.State("charges", "", "ORD-LOST"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a := e.Charge(`"ORD-LOST"`, 5); a.Status != 201 {
		t.Fatalf("retry = %v, want 201: forwarded, the first was never sent", a)
	}
	if n := e.Charges("ORD-LOST"); n != 1 {
		t.Errorf("ORD-LOST charged %d times, want 1", n)
	}
}

// failingUntilStore applies reservations but loses the reply of the first
// one, and fails every release until healed: a store whose writer stalls
// under a flood (issue 36: "the writer did not apply the write in time")
// and fails and reopens for longer than a reservation's lease.
type failingUntilStore struct {
	*badger.Store
	mu     sync.Mutex
	lost   bool
	healed bool
}

func (s *failingUntilStore) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	rec, err := s.Store.Reserve(ctx, key, res)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && !s.lost {
		s.lost = true
		return nil, errLostReply
	}
	return rec, err
}

func (s *failingUntilStore) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	healed := s.healed
	s.mu.Unlock()
	if !healed {
		return errLostReply
	}
	return s.Store.Release(ctx, key, token)
}

func (s *failingUntilStore) heal() {
	s.mu.Lock()
	s.healed = true
	s.mu.Unlock()
}

// TestRefusedReservationNeverInDoubt pins issue 36 item 3: a request
// answered 503 because its reservation's reply was lost was never
// forwarded, so its key must never stay in doubt, even when the store
// comes back only after the reservation's lease ended. The release used
// to be retried until the lease only, then logged "it will be in doubt
// when its lease ends": the client that was refused got 409 for the
// key's whole TTL.
func TestRefusedReservationNeverInDoubt(t *testing.T) {
	up := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	defer up.Close()
	cfg := proxytest.ParseConfig(t, up.URL, `  - name: charges
    match: POST /charges
    key: {json: orderId}
    lease: 2s
    upstream_timeout: 1s
    ttl: 1h
`)
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	st := &failingUntilStore{Store: bs}
	p, err := proxy.New(cfg, proxy.Options{Store: st, StoreName: "badger",
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	e := &proxytest.Env{T: t, Stub: up, Server: srv, Proxy: p, Store: bs}

	if a := e.Charge(`"ORD-REFUSED"`, 5); a.Status != 503 {
		t.Fatalf("charge with the reservation's reply lost = %v, want 503 store-unavailable", a)
	}
	// The store stays failing past the lease: the key reads in doubt.
	deadline := time.Now().Add(30 * time.Second)
	for e.State("charges", "", "ORD-REFUSED") != store.StateInDoubt {
		if time.Now().After(deadline) {
			t.Fatalf("the key is %q, want it to read in doubt once its lease ended", e.State("charges", "", "ORD-REFUSED"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Past the lease plus the settler's longest backoff, then the store heals.
	time.Sleep(1500 * time.Millisecond)
	st.heal()
	deadline = time.Now().Add(30 * time.Second)
	for e.State("charges", "", "ORD-REFUSED") != "" {
		if time.Now().After(deadline) {
			t.Fatalf("the key of a request answered 503 and never forwarded is still %q once the store answers again: "+
				"its retries get 409 for the whole TTL", e.State("charges", "", "ORD-REFUSED"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a := e.Charge(`"ORD-REFUSED"`, 5); a.Status != 201 {
		t.Fatalf("retry = %v, want 201: forwarded, the first was never sent", a)
	}
	if n := e.Charges("ORD-REFUSED"); n != 1 {
		t.Errorf("ORD-REFUSED charged %d times, want 1", n)
	}
}
