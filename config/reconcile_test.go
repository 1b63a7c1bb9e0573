package config

import (
	"strings"
	"testing"
	"time"
)

func TestReconcileAndModeProblems(t *testing.T) {
	rc := func(s string) string { return withRoute("    reconcile: " + s + "\n") }
	tests := []struct {
		name string
		src  string
		want string
	}{
		{"bad mode", withRoute("    mode: shadow\n"), `routes[0].mode: "shadow" is not one of enforce, observe`},
		{"no lookup", rc("{grace: 10m}"), "routes[0].reconcile.lookup: required"},
		{"lookup not GET", rc(`{lookup: "POST /orders/{key}/charge"}`), `routes[0].reconcile.lookup: "POST /orders/{key}/charge" must be a GET`},
		{"lookup without path", rc(`{lookup: "GET orders/{key}"}`), `routes[0].reconcile.lookup: "GET orders/{key}" needs a path`},
		{"lookup without key", rc(`{lookup: "GET /orders/charge"}`), `routes[0].reconcile.lookup: "GET /orders/charge" must hold {key} exactly once`},
		{"lookup with two keys", rc(`{lookup: "GET /o/{key}/{key}"}`), `routes[0].reconcile.lookup: "GET /o/{key}/{key}" must hold {key} exactly once`},
		{"lookup with another placeholder", rc(`{lookup: "GET /o/{id}/{key}"}`), `routes[0].reconcile.lookup: "GET /o/{id}/{key}" must hold {key} exactly once`},
		{"grace not above the lease", rc(`{lookup: "GET /o/{key}", grace: 35s}`), "routes[0].reconcile.grace: 35s must exceed lease (35s)"},
		{"grace not above a long lease", withRoute("    upstream_timeout: 2m\n    reconcile: {lookup: \"GET /o/{key}\", grace: 1m}\n"),
			"routes[0].reconcile.grace: 1m0s must exceed lease (2m5s)"},
		{"grace beyond ttl", withRoute("    ttl: 1h\n    reconcile: {lookup: \"GET /o/{key}\", grace: 2h}\n"), "routes[0].reconcile.grace: 2h0m0s must be shorter than ttl"},
		{"negative interval", rc(`{lookup: "GET /o/{key}", interval: -1m}`), "routes[0].reconcile.interval: must be positive"},
		{"composite key", strings.Replace(rc(`{lookup: "GET /o/{key}"}`), "json: orderId", "parts: [{json: orderId}, {json: kind}]", 1),
			"routes[0].reconcile.lookup: a composite key (key.parts) has no single value"},
		{"scoped route", withRoute("    scope: {header: X-Api-Key}\n    reconcile: {lookup: \"GET /o/{key}\"}\n"), "routes[0].reconcile: not allowed with scope.header"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			probs := problemsOf(t, tc.src)
			for _, p := range probs {
				if strings.HasPrefix(p, tc.want) {
					return
				}
			}
			t.Errorf("problems %q\nhave none starting with %q", probs, tc.want)
		})
	}
}

func TestReconcileAndModeDefaults(t *testing.T) {
	tests := []struct {
		name            string
		extra           string
		grace, interval time.Duration
	}{
		{"defaults", "    reconcile: {lookup: \"GET /o/{key}\"}\n", defaultReconcileGrace, defaultReconcileInterval},
		{"grace follows a long lease", "    upstream_timeout: 5m\n    reconcile: {lookup: \"GET /o/{key}\"}\n", 2 * (5*time.Minute + defaultLeaseMargin), defaultReconcileInterval},
		{"set", "    reconcile: {lookup: \"GET /o/{key}\", grace: 90s, interval: 10s}\n", 90 * time.Second, 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, withRoute(tc.extra)).Routes[0]
			if r.Mode != modeEnforce {
				t.Errorf("Mode = %q, want %q", r.Mode, modeEnforce)
			}
			if r.Reconcile.Grace.D() != tc.grace || r.Reconcile.Interval.D() != tc.interval {
				t.Errorf("grace, interval = %v, %v; want %v, %v", r.Reconcile.Grace.D(), r.Reconcile.Interval.D(), tc.grace, tc.interval)
			}
			if m, p := r.Reconcile.lookupMethod(), r.Reconcile.LookupPath(); m != "GET" || !strings.HasPrefix(p, "/o/") {
				t.Errorf("LookupMethod, LookupPath = %q, %q", m, p)
			}
		})
	}
	if r := mustParse(t, withRoute("")).Routes[0]; r.Reconcile != nil {
		t.Errorf("Reconcile = %+v without a reconcile section, want nil", r.Reconcile)
	}
}

func TestReconcileObserveFile(t *testing.T) {
	c, err := Load("testdata/reconcile-observe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Routes[0]; r.Mode != ModeObserve || r.Reconcile.Grace.D() != 2*time.Minute || r.Reconcile.Interval.D() != 30*time.Second {
		t.Errorf("routes[0] = mode %q, reconcile %+v; want observe, 2m, 30s", r.Mode, r.Reconcile)
	}
	if p := c.Routes[1].Reconcile.LookupPath(); p != "/payments?key={key}" {
		t.Errorf("routes[1] lookup path = %q", p)
	}
}
