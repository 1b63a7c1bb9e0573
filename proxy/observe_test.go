package proxy_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

const observeRoute = `  - name: charges
    match: POST /charges
    key: {json: orderId}
    mode: observe
`

func observed(e *proxytest.Env, would proxy.Outcome) int {
	e.T.Helper()
	return int(proxytest.CounterValue(e.T, e.Registry, "idemproxy_observed_total", map[string]string{"route": "charges", "would": string(would)}))
}

// TestObserveModeForwardsAndCounts: a route in observe mode forwards every
// request, duplicates and mismatches included, and counts what enforce
// would have answered; a reload to enforce then protects the same keys.
func TestObserveModeForwardsAndCounts(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, observeRoute)
	sk := store.Key("charges", "", "O-3")
	if r, err := e.Store.Reserve(context.Background(), sk, store.Reservation{Token: "busy", Lease: time.Minute, TTL: time.Hour}); err != nil || r != nil {
		t.Fatalf("Reserve = %v, %v", r, err)
	}
	steps := []struct {
		name   string
		body   string
		status int
		would  proxy.Outcome // "" : nothing counted
	}{
		{"first request", `{"orderId": "O-1", "amount": 5}`, http.StatusCreated, ""},
		{"duplicate", `{"orderId": "O-1", "amount": 5}`, http.StatusCreated, proxy.OutcomeReplayed},
		{"same key, another body", `{"orderId": "O-1", "amount": 7}`, http.StatusCreated, proxy.OutcomeMismatch},
		{"key in flight", `{"orderId": "O-3", "amount": 5}`, http.StatusCreated, proxy.OutcomeConflict},
		{"no key: the upstream's own 400", `{"amount": 5}`, http.StatusBadRequest, proxy.OutcomeBadRequest},
		{"not JSON: the upstream's own 400", `{"orderId": `, http.StatusBadRequest, proxy.OutcomeBadRequest},
	}
	for _, s := range steps {
		before := map[proxy.Outcome]int{}
		for _, w := range proxy.Woulds {
			before[w] = observed(e, w)
		}
		a := e.Do("POST", "/charges", s.body)
		if a.Status != s.status || a.ProblemType() != "" || a.Replayed() {
			t.Errorf("%s: got %v (replayed %v), want the upstream's %d", s.name, a, a.Replayed(), s.status)
		}
		for _, w := range proxy.Woulds {
			want := before[w]
			if w == s.would {
				want++
			}
			if got := observed(e, w); got != want {
				t.Errorf("%s: observed{would=%s} = %d, want %d", s.name, w, got, want)
			}
		}
	}
	if got := e.Charges("O-1"); got != 3 {
		t.Errorf("charges of O-1 = %d, want 3: observe mode forwards everything", got)
	}
	if st := e.State("charges", "", "O-1"); st != store.StateCompleted {
		t.Errorf("state of O-1 = %q, want completed: observe mode keeps the bookkeeping", st)
	}

	// The rollout: switch to enforce by a reload; the recorded key is now
	// protected.
	if err := e.Proxy.Reload(proxytest.ParseConfig(t, e.Stub.URL, strings.Replace(observeRoute, "mode: observe", "mode: enforce", 1))); err != nil {
		t.Fatal(err)
	}
	if a := e.Charge(`"O-1"`, 5); !a.Replayed() || e.Charges("O-1") != 3 {
		t.Errorf("after the switch to enforce: %v, charges %d; want the first answer replayed, no new charge", a, e.Charges("O-1"))
	}
	proxytest.WantStatus(t, "mismatch under enforce", e.Charge(`"O-1"`, 9), http.StatusUnprocessableEntity, "fingerprint-mismatch")
}

// TestObserveModeForwardsOnStoreFailure: a store failure in observe mode
// forwards the request and counts it as a store error.
func TestObserveModeForwardsOnStoreFailure(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, observeRoute)
	e.Store.Close()
	proxytest.WantStatus(t, "store closed", e.Charge(`"O-9"`, 5), http.StatusCreated, "")
	if got := e.Outcomes("charges", proxy.OutcomeStoreError); got != 1 {
		t.Errorf("outcome store_error = %d, want 1", got)
	}
	if got := e.Charges("O-9"); got != 1 {
		t.Errorf("charges of O-9 = %d, want 1", got)
	}
}

// TestObserveModeCountsDuplicateUnderReject: under duplicate: reject,
// enforce would have answered a known key with 409 duplicate-request.
func TestObserveModeCountsDuplicateUnderReject(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, observeRoute+"    duplicate: reject\n")
	for range 2 {
		proxytest.WantStatus(t, "charge", e.Charge(`"O-5"`, 5), http.StatusCreated, "")
	}
	if got, replayed := observed(e, proxy.OutcomeDuplicate), observed(e, proxy.OutcomeReplayed); got != 1 || replayed != 0 {
		t.Errorf("observed duplicate, replayed = %d, %d; want 1, 0", got, replayed)
	}
	if got := e.Charges("O-5"); got != 2 {
		t.Errorf("charges of O-5 = %d, want 2", got)
	}
}

// TestWouldsAreOutcomes: what observe mode counts (the would label of
// idemproxy_observed_total) is a subset of the outcomes of
// idemproxy_requests_total, so that the metrics, the access log and the
// docs share one vocabulary; and a would is never the outcome of the
// observed request itself (unprotected, store_error).
func TestWouldsAreOutcomes(t *testing.T) {
	t.Parallel()
	seen := map[proxy.Outcome]bool{}
	for _, w := range proxy.Woulds {
		if !slices.Contains(proxy.Outcomes, w) {
			t.Errorf("would %q is not one of proxy.Outcomes", w)
		}
		if w == proxy.OutcomeUnprotected || w == proxy.OutcomeStoreError || w == proxy.OutcomePassthrough {
			t.Errorf("would %q is an outcome observe mode gives the forwarded request itself", w)
		}
		if seen[w] {
			t.Errorf("would %q is listed twice", w)
		}
		seen[w] = true
	}
}
