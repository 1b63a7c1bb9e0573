package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
)

// threeRoutes are three routes with distinct patterns, in this order.
var threeRoutes = []string{"first", "second", "third"}

// threeRoutesConfig is a configuration of threeRoutes with extra top-level
// YAML (metrics.route_histograms).
func threeRoutesConfig(t *testing.T, upstream, extra string) *config.Config {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nupstream: %s\nstore: {badger: {dir: unused}}\n%s\nroutes:\n", upstream, extra)
	for _, r := range threeRoutes {
		fmt.Fprintf(&b, "  - name: %s\n    match: POST /%s/charges\n    key: {json: orderId}\n", r, r)
	}
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	return cfg
}

// series returns the label sets of the series of metric name (a
// histogram: its count, one per label set).
func series(t *testing.T, reg prometheus.Gatherer, name string) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := uint64(m.GetCounter().GetValue())
			if h := m.GetHistogram(); h != nil {
				v = h.GetSampleCount()
			}
			out[strings.Join(labels, ",")] = v
		}
	}
	return out
}

// TestRouteHistograms: the first metrics.route_histograms routes have
// latency histograms of their own, created at start for every outcome as
// before; the others are counted together under route="(other)", while
// every route keeps its own counters and, from the start, the counters
// the alerts watch. A reload applies a new value.
func TestRouteHistograms(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(201)
		io.WriteString(w, `{"status":"charged"}`)
	}))
	t.Cleanup(up.Close)
	watched := []proxy.Outcome{proxy.OutcomeInDoubt, proxy.OutcomeConflict, proxy.OutcomeUnprotected, proxy.OutcomeStoreError}
	for _, tc := range []struct {
		extra string
		own   []string // the routes with histograms of their own
	}{
		{"", threeRoutes}, // the default: 50
		{"metrics: {route_histograms: 3}", threeRoutes},
		{"metrics: {route_histograms: 1}", []string{"first"}},
		{"metrics: {route_histograms: -1}", nil},
	} {
		t.Run(tc.extra, func(t *testing.T) {
			e := &proxytest.Env{T: t}
			e.StartConfig(threeRoutesConfig(t, up.URL, tc.extra))
			durations := series(t, e.Registry, "idemproxy_request_duration_seconds")
			requests := series(t, e.Registry, "idemproxy_requests_total")
			notStored := series(t, e.Registry, "idemproxy_answers_not_stored_total")
			inFlight := series(t, e.Registry, "idemproxy_requests_in_flight")
			for _, r := range append(slices.Clone(threeRoutes), config.OtherRoutes) {
				own := slices.Contains(tc.own, r)
				shared := r == config.OtherRoutes && len(tc.own) < len(threeRoutes)
				for _, o := range proxy.Outcomes {
					if o == proxy.OutcomePassthrough {
						continue
					}
					k := fmt.Sprintf("outcome=%s,route=%s", o, r)
					if _, ok := durations[k]; ok != (own || shared) {
						t.Errorf("at start, request_duration_seconds{%s} exists: %v, want %v", k, ok, own || shared)
					}
					_, ok := requests[k]
					want := r != config.OtherRoutes && (own || slices.Contains(watched, o))
					if ok != want {
						t.Errorf("at start, requests_total{%s} exists: %v, want %v", k, ok, want)
					}
				}
				if _, ok := notStored["reason=too_large,route="+r]; ok != own {
					t.Errorf("at start, answers_not_stored_total of %s exists: %v, want %v", r, ok, own)
				}
				if _, ok := inFlight["route="+r]; ok != (r != config.OtherRoutes) {
					t.Errorf("at start, requests_in_flight of %s exists: %v", r, ok)
				}
			}

			for _, r := range threeRoutes {
				if a := e.Do("POST", "/"+r+"/charges", `{"orderId":"ORD-1","amount":1}`); a.Status != 201 {
					t.Fatalf("charge on %s: %v", r, a)
				}
			}
			durations = series(t, e.Registry, "idemproxy_request_duration_seconds")
			upstream := series(t, e.Registry, "idemproxy_upstream_request_duration_seconds")
			requests = series(t, e.Registry, "idemproxy_requests_total")
			for _, r := range threeRoutes {
				if got := requests["outcome=committed,route="+r]; got != 1 {
					t.Errorf("requests_total{committed,%s} = %d, want 1: counters are per route", r, got)
				}
				want := uint64(0)
				if slices.Contains(tc.own, r) {
					want = 1
				}
				if got := durations["outcome=committed,route="+r]; got != want {
					t.Errorf("request_duration_seconds{committed,%s} count = %d, want %d", r, got, want)
				}
				if got := upstream["code=201,route="+r]; got != want {
					t.Errorf("upstream_request_duration_seconds{201,%s} count = %d, want %d", r, got, want)
				}
			}
			shared := uint64(len(threeRoutes) - len(tc.own))
			if got := durations["outcome=committed,route="+config.OtherRoutes]; got != shared {
				t.Errorf("request_duration_seconds{committed,(other)} count = %d, want %d", got, shared)
			}
			if got := upstream["code=201,route="+config.OtherRoutes]; got != shared {
				t.Errorf("upstream_request_duration_seconds{201,(other)} count = %d, want %d", got, shared)
			}
		})
	}

	t.Run("reload", func(t *testing.T) {
		e := &proxytest.Env{T: t}
		e.StartConfig(threeRoutesConfig(t, up.URL, "metrics: {route_histograms: 1}"))
		if err := e.Proxy.Reload(threeRoutesConfig(t, up.URL, "metrics: {route_histograms: 2}")); err != nil {
			t.Fatal(err)
		}
		if _, ok := series(t, e.Registry, "idemproxy_request_duration_seconds")["outcome=replayed,route=second"]; !ok {
			t.Errorf("after a reload to route_histograms 2, the second route has no histograms of its own")
		}
		e.Do("POST", "/second/charges", `{"orderId":"ORD-1","amount":1}`)
		if got := series(t, e.Registry, "idemproxy_request_duration_seconds")["outcome=committed,route=second"]; got != 1 {
			t.Errorf("after the reload, request_duration_seconds{committed,second} count = %d, want 1", got)
		}
	})
}
