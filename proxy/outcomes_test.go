package proxy_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestEveryOutcomeIsCounted drives one request to each outcome and checks
// that exactly the right series of idemproxy_requests_total moved.
func TestEveryOutcomeIsCounted(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    release_statuses: [429, 503]
  - name: strict
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
    duplicate: reject
    on_missing_key: forward
`)
	steps := []struct {
		name    string
		send    func() proxytest.Answer
		route   string
		outcome proxy.Outcome
	}{
		{"first charge", func() proxytest.Answer { return e.Charge(`"O-1"`, 1) }, "charges", proxy.OutcomeCommitted},
		{"duplicate", func() proxytest.Answer { return e.Charge(`"O-1"`, 1) }, "charges", proxy.OutcomeReplayed},
		{"other request under the key", func() proxytest.Answer { return e.Charge(`"O-1"`, 2) }, "charges", proxy.OutcomeMismatch},
		{"429", func() proxytest.Answer { return e.Charge(`"O-2"`, 1, "X-Stub-Fault", "reject-429") }, "charges", proxy.OutcomeReleased},
		{"dropped connection", func() proxytest.Answer { return e.Charge(`"O-3"`, 1, "X-Stub-Fault", "drop-after-charge") }, "charges", proxy.OutcomeInDoubt},
		{"retry of the dropped one", func() proxytest.Answer { return e.Charge(`"O-3"`, 1) }, "charges", proxy.OutcomeConflict},
		{"bad JSON", func() proxytest.Answer { return e.Do("POST", "/charges", "{") }, "charges", proxy.OutcomeBadRequest},
		{"no route", func() proxytest.Answer { return e.Do("GET", "/charges", "") }, "", proxy.OutcomePassthrough},
		{"first under reject", func() proxytest.Answer {
			return e.Do("POST", "/orders/O-4/charges", `{"amount": 1}`, "Idempotency-Key", "k4")
		}, "strict", proxy.OutcomeCommitted},
		{"duplicate under reject", func() proxytest.Answer {
			return e.Do("POST", "/orders/O-4/charges", `{"amount": 1}`, "Idempotency-Key", "k4")
		}, "strict", proxy.OutcomeDuplicate},
		{"no key, forwarded", func() proxytest.Answer { return e.Do("POST", "/orders/O-5/charges", `{"amount": 1}`) }, "strict", proxy.OutcomeUnprotected},
	}
	counts := func() map[[2]string]int {
		m := map[[2]string]int{}
		for _, route := range []string{"", "charges", "strict"} {
			for _, o := range proxy.Outcomes {
				m[[2]string{route, string(o)}] = e.Outcomes(route, o)
			}
		}
		return m
	}
	before := counts()
	for _, st := range steps {
		if a := st.send(); a.Err != nil {
			t.Fatalf("%s: %v", st.name, a.Err)
		}
		after := counts()
		for k, v := range after {
			want := before[k]
			if k == [2]string{st.route, string(st.outcome)} {
				want++
			}
			if v != want {
				t.Errorf("%s: requests_total{route=%q, outcome=%q} = %d, want %d", st.name, k[0], k[1], v, want)
			}
		}
		before = after
	}
	e.Store.Close()
	e.Charge(`"O-6"`, 1)
	if got := e.Outcomes("charges", proxy.OutcomeStoreError); got != 1 {
		t.Errorf("store_error = %d, want 1", got)
	}
}
