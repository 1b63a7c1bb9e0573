package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// failingCommits is a real Badger store whose commits fail while failures
// is above zero (a stalled store, as Redis' op_timeout would make it).
type failingCommits struct {
	store.Store
	failures atomic.Int32
}

func (f *failingCommits) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	if f.failures.Add(-1) >= 0 {
		return errors.New("store stalled")
	}
	return f.Store.Commit(ctx, key, token, resp, ttl)
}

// settleEnv is a proxy on a Badger store whose first failures commits fail.
func settleEnv(t *testing.T, failures int32) *proxytest.Env {
	t.Helper()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.Stub.Close)
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.Store = st
	fc := &failingCommits{Store: st}
	fc.failures.Store(failures)
	e.Registry = prometheus.NewRegistry()
	e.Proxy, err = proxy.New(proxytest.ParseConfig(t, e.Stub.URL, chargesByOrder+"    lease: 10m\n"),
		proxy.Options{Store: fc, StoreName: "badger", Metrics: proxy.NewMetrics(e.Registry)})
	if err != nil {
		t.Fatal(err)
	}
	e.Server = httptest.NewServer(e.Proxy)
	t.Cleanup(e.Server.Close)
	return e
}

// TestWaitWaitsForSettling: a commit that failed is retried in the
// background, and Wait (the shutdown's wait before the store closes)
// returns only once it is written: the key is completed, and the retry of
// the request replayed, not charged again.
func TestWaitWaitsForSettling(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, 3)
	proxytest.WantStatus(t, "the charge whose commit fails", e.Charge(`"ORD-S1"`, 1), 201, "")
	// Counted once its handler has returned (the client may have its answer
	// before the commit is tried): the commit did not settle at once.
	proxytest.Eventually(t, "the request is counted as a store error", func() bool {
		return e.Outcomes("charges", proxy.OutcomeStoreError) == 1
	})
	e.Proxy.Wait()
	if got := e.State("charges", "", "ORD-S1"); got != store.StateCompleted {
		t.Errorf("after Wait, the key is %q, want %q", got, store.StateCompleted)
	}
}

// TestAbortStopsSettling: a commit that cannot be written is retried until
// the shutdown deadline (Abort), not for the whole lease, and its key is
// left in flight (in doubt once its lease ends): never released, so its
// retry is never charged again.
func TestAbortStopsSettling(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, 1<<30)
	proxytest.WantStatus(t, "the charge whose commit fails", e.Charge(`"ORD-S2"`, 1), 201, "")
	e.Proxy.Abort()
	e.Proxy.Wait() // would wait for the lease (10m) if Abort did not stop the retry
	if got := e.State("charges", "", "ORD-S2"); got != store.StateInFlight {
		t.Errorf("after Abort, the key is %q, want %q (left for its lease, never released)", got, store.StateInFlight)
	}
	if got := e.Charges("ORD-S2"); got != 1 {
		t.Errorf("ORD-S2 charged %d times, want 1", got)
	}
}

// TestWaitRefusesRequestsWhileSettling: once Wait has begun, a protected
// request is answered 503 shutting-down without being forwarded, also while
// Wait is still waiting for a settling retry (a stalled store): forwarded
// then, its charge could no longer be retried into the store, which the
// program closes once Wait returns.
func TestWaitRefusesRequestsWhileSettling(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, 1<<30)
	proxytest.WantStatus(t, "the charge whose commit fails", e.Charge(`"ORD-W1"`, 1), 201, "")
	proxytest.Eventually(t, "the commit is being retried", func() bool {
		return e.Outcomes("charges", proxy.OutcomeStoreError) == 1
	})
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		e.Proxy.Wait() // until Abort: the retry holds for the lease (10m)
	}()
	defer func() {
		e.Proxy.Abort()
		<-waited
	}()
	n := 0
	proxytest.Eventually(t, "a charge after Wait began is answered 503 shutting-down", func() bool {
		n++
		a := e.Charge(fmt.Sprintf(`"ORD-W2-%d"`, n), 1)
		return a.Err == nil && a.Status == 503 && a.ProblemType() == "shutting-down"
	})
	if got := e.Charges(fmt.Sprintf("ORD-W2-%d", n)); got != 0 {
		t.Errorf("the refused charge was forwarded %d times, want 0", got)
	}
}
