package proxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/canary"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// lostLog records what a witness told.
type lostLog struct {
	mu      sync.Mutex
	reasons []string
}

func (l *lostLog) lost(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reasons = append(l.reasons, reason)
}

func (l *lostLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reasons)
}

// TestWitnessRefusesALostKey: a key this replica answered, gone from the
// store without a release mark (lost), is refused with 503
// store-lost-keys on its retry, never forwarded, also on a route that
// forwards on store errors, and left in doubt; the witness tells the
// loss. With a release mark (an operator's release) the retry is
// forwarded. When the marks cannot be read, the retry is a store failure
// (503 store-unavailable) and its reservation is released. A route in
// observe mode tells the loss but forwards.
func TestWitnessRefusesALostKey(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(up.Close)
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	var marksDown atomic.Bool
	start := func(routes string, l *lostLog) *httptest.Server {
		wit := witness.New(witness.Options{Window: time.Minute, MaxKeys: 1024, Lost: l.lost,
			Released: func(ctx context.Context, key string) (bool, error) {
				if marksDown.Load() {
					return false, errors.New("marks unreadable")
				}
				return canary.Released(ctx, st, key)
			}})
		p, err := proxy.New(proxytest.ParseConfig(t, up.URL, routes), proxy.Options{Store: st, StoreName: "badger",
			Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler), Witness: wit})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		return srv
	}
	var enforced, observed lostLog
	srv := start(`  - name: charges
    match: POST /charges
    key: {json: orderId}
  - name: fail-open
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    on_store_error: forward
`, &enforced)
	obs := start(`  - name: observed
    match: POST /charges
    key: {json: orderId}
    mode: observe
`, &observed)
	post := func(srv *httptest.Server, path, order string) proxytest.Answer {
		return proxytest.Send(srv.Client(), "POST", srv.URL+path, `{"orderId": "`+order+`", "amount": 10}`)
	}
	charges := func(order string) int {
		a := proxytest.Send(up.Client(), "GET", up.URL+"/orders/"+order+"/charges", "")
		n, _ := a.Field("charges").(float64)
		return int(n)
	}
	lose := func(route, order string) {
		t.Helper()
		key := store.Key(route, "", order)
		rec, err := st.Get(ctx, key)
		if err != nil || rec == nil {
			t.Fatalf("%s: %v, %v", key, rec, err)
		}
		if err := st.Release(ctx, key, rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	answered := func(srv *httptest.Server, path, order string) {
		t.Helper()
		if a := post(srv, path, order); a.Status != 201 {
			t.Fatalf("%s = %s, want 201", order, a)
		}
	}

	// Lost, on an enforcing route and on one that forwards on store errors.
	for _, tc := range []struct{ route, path, order string }{
		{"charges", "/charges", "ORD-W1"},
		{"fail-open", "/orders/ORD-W2/charges", "ORD-W2"},
	} {
		answered(srv, tc.path, tc.order)
		lose(tc.route, tc.order)
		proxytest.WantStatus(t, tc.order+" retried after its loss", post(srv, tc.path, tc.order), 503, "store-lost-keys")
		if n := charges(tc.order); n != 1 {
			t.Errorf("%s charged %d times, want 1", tc.order, n)
		}
		rec, err := st.Get(ctx, store.Key(tc.route, "", tc.order))
		if err != nil || rec == nil || rec.State != store.StateInDoubt {
			t.Errorf("%s after the refusal: %v, %v; want in doubt", tc.order, rec, err)
		}
	}
	if n := enforced.count(); n != 2 || !strings.Contains(enforced.reasons[0], "route charges") {
		t.Errorf("losses told %q, want 2, the first naming route charges", enforced.reasons)
	}

	// Released by an operator: the mark says so.
	answered(srv, "/charges", "ORD-W3")
	if err := canary.MarkReleased(ctx, st, store.Key("charges", "", "ORD-W3"), time.Minute); err != nil {
		t.Fatal(err)
	}
	lose("charges", "ORD-W3")
	if a := post(srv, "/charges", "ORD-W3"); a.Status != 201 || a.Replayed() {
		t.Errorf("ORD-W3 retried after its release = %s, want a forwarded 201", a)
	}

	// The marks unreadable: a store failure, the reservation released.
	answered(srv, "/charges", "ORD-W4")
	lose("charges", "ORD-W4")
	marksDown.Store(true)
	proxytest.WantStatus(t, "ORD-W4 with the marks unreadable", post(srv, "/charges", "ORD-W4"), 503, "store-unavailable")
	marksDown.Store(false)
	if rec, err := st.Get(ctx, store.Key("charges", "", "ORD-W4")); err != nil || rec != nil {
		t.Errorf("ORD-W4's reservation after the failure: %v, %v; want released", rec, err)
	}
	if n := enforced.count(); n != 2 {
		t.Errorf("%d losses told, want still 2", n)
	}

	// Observe mode: told, forwarded.
	answered(obs, "/charges", "ORD-W5")
	lose("observed", "ORD-W5")
	if a := post(obs, "/charges", "ORD-W5"); a.Status != 201 || a.Replayed() {
		t.Errorf("ORD-W5 on the observed route after its loss = %s, want a forwarded 201", a)
	}
	if n := observed.count(); n != 1 {
		t.Errorf("observe mode told %d losses, want 1", n)
	}
}
