package proxy_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// TestStoreLostKeys: on a store whose keys are lost (the epoch watcher
// refuses reservations), an enforcing route answers 503 store-lost-keys
// and forwards nothing; a route with on_store_error: forward and a route
// in mode: observe forward unprotected, as for any store failure; a
// request that matches no route passes through. Once the loss is
// accepted, the enforcing route serves again.
func TestStoreLostKeys(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(up.Close)
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	w := epoch.New(epoch.Options{Store: st, Interval: time.Second})
	if err := w.Check(ctx); err != nil || w.Err() != nil {
		t.Fatalf("first check: %v, %v", err, w.Err())
	}
	routes := `  - name: charges
    match: POST /charges
    key: {json: orderId}
  - name: fail-open
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    on_store_error: forward
`
	p, err := proxy.New(proxytest.ParseConfig(t, up.URL, routes), proxy.Options{Store: epoch.Gate(st, w), StoreName: "badger",
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	post := func(path, order string) proxytest.Answer {
		return proxytest.Send(srv.Client(), "POST", srv.URL+path, `{"orderId": "`+order+`", "amount": 10}`)
	}
	// Lost: another replica's lost marker.
	cur, _ := st.Epoch(ctx)
	if _, ok, err := st.SwapEpoch(ctx, cur.ID, store.Epoch{ID: "lost", State: store.EpochLost, Gen: cur.Gen + 1, CreatedAt: time.Now()}); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	w.Check(ctx)

	a := post("/charges", "L-1")
	proxytest.WantStatus(t, "enforcing route", a, 503, "store-lost-keys")
	if a.Header.Get("Retry-After") == "" {
		t.Error("store-lost-keys without Retry-After")
	}
	if rec, _ := st.Get(ctx, store.Key("charges", "", "L-1")); rec != nil {
		t.Errorf("the refused request left a record: %+v", rec)
	}
	if a := post("/orders/L-2/charges", "L-2"); a.Status != 201 || a.Replayed() {
		t.Errorf("on_store_error: forward = %s, want a forwarded 201", a)
	}
	observe := strings.Replace(routes, "    key: {json: orderId}\n", "    key: {json: orderId}\n    mode: observe\n", 1)
	if err := p.Reload(proxytest.ParseConfig(t, up.URL, observe)); err != nil {
		t.Fatal(err)
	}
	if a := post("/charges", "L-3"); a.Status != 201 || a.Replayed() {
		t.Errorf("mode: observe = %s, want a forwarded 201", a)
	}
	if err := p.Reload(proxytest.ParseConfig(t, up.URL, routes)); err != nil {
		t.Fatal(err)
	}
	if a := proxytest.Send(srv.Client(), "GET", srv.URL+"/orders/L-2/charges", ""); a.Status != 200 {
		t.Errorf("unmatched request = %s, want it passed through", a)
	}
	statement := func(order string) int {
		a := proxytest.Send(up.Client(), "GET", up.URL+"/orders/"+order+"/charges", "")
		n, _ := a.Field("charges").(float64)
		return int(n)
	}
	for order, want := range map[string]int{"L-1": 0, "L-2": 1, "L-3": 1} {
		if got := statement(order); got != want {
			t.Errorf("%s charged %d times, want %d", order, got, want)
		}
	}

	if _, _, err := epoch.Accept(ctx, st, "op", "test", time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	w.Check(ctx)
	if a := post("/charges", "L-1"); a.Status != 201 || a.Replayed() {
		t.Errorf("after the acceptance = %s, want a forwarded 201", a)
	}
}
