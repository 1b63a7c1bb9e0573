package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"fmt"
	"net/http"
	"testing"
)

// Routes of the article's "before" (keyed by the correlation ID) and
// "after" (keyed by the order), on the stub's POST /charges.
const (
	byCorrelationID = `
  - name: charges
    match: POST /charges
    key: {header: X-Correlation-ID}
`
	// The Mule validator exactly: a known ID is a bare duplicate, whatever
	// the body.
	byCorrelationIDMule = `
  - name: charges
    match: POST /charges
    key: {header: X-Correlation-ID}
    duplicate: reject
    fingerprint: {disabled: true}
`
	byOrderID = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
`
)

// TestArticleThreeOrdersOneCorrelationID: a batch sends three different
// orders, each with the batch's correlation ID.
func TestArticleThreeOrdersOneCorrelationID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		routes     string
		want       []int
		wantType   []string
		wantCharge int
	}{
		{"keyed by correlation ID: the others are rejected as another request under a known key",
			byCorrelationID, []int{201, 422, 422}, []string{"", "fingerprint-mismatch", "fingerprint-mismatch"}, 1},
		{"keyed by correlation ID, Mule's validator: accepted, duplicate, duplicate",
			byCorrelationIDMule, []int{201, 409, 409}, []string{"", "duplicate-request", "duplicate-request"}, 1},
		{"keyed by orderId: all accepted",
			byOrderID, []int{201, 201, 201}, []string{"", "", ""}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := proxytest.New(t, tt.routes)
			for i, order := range []string{`"ORD-2101"`, `"ORD-2102"`, `"ORD-2103"`} {
				a := e.Charge(order, 10*(i+1), "X-Correlation-ID", "BATCH-1")
				proxytest.WantStatus(t, fmt.Sprintf("order %d", i+1), a, tt.want[i], tt.wantType[i])
			}
			if got := e.TotalCharges(); got != tt.wantCharge {
				t.Errorf("charges = %d, want %d", got, tt.wantCharge)
			}
		})
	}
}

// TestArticleSameOrderTwoCorrelationIDs: a client retries the same order
// with a new correlation ID.
func TestArticleSameOrderTwoCorrelationIDs(t *testing.T) {
	t.Parallel()
	t.Run("keyed by correlation ID: charged twice", func(t *testing.T) {
		e := proxytest.New(t, byCorrelationID)
		first := e.Charge(`"ORD-IR-B-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-1")
		second := e.Charge(`"ORD-IR-B-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-2")
		proxytest.WantStatus(t, "first", first, 201, "")
		proxytest.WantStatus(t, "second", second, 201, "")
		if got := e.Charges("ORD-IR-B-100"); got != 2 {
			t.Errorf("charges = %d, want 2", got)
		}
	})
	t.Run("keyed by orderId: charged once, the retry replayed", func(t *testing.T) {
		e := proxytest.New(t, byOrderID)
		first := e.Charge(`"ORD-IR-A-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-1")
		second := e.Charge(`"ORD-IR-A-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-2")
		proxytest.WantStatus(t, "first", first, 201, "")
		proxytest.WantStatus(t, "second", second, 201, "")
		if !second.Replayed() || string(second.Body) != string(first.Body) {
			t.Errorf("second answer = %s (replayed %v), want the first answer %s replayed", second.Body, second.Replayed(), first.Body)
		}
		if got := e.Charges("ORD-IR-A-100"); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
	})
}

// TestArticleSameRequestRepeated: the same request with the same
// correlation ID is blocked the second time.
func TestArticleSameRequestRepeated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		routes     string
		wantStatus int
		wantType   string
		replayed   bool
	}{
		{"Mule's validator: rejected", byCorrelationIDMule, 409, "duplicate-request", false},
		{"default: the first answer replayed", byCorrelationID, 201, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := proxytest.New(t, tt.routes)
			proxytest.WantStatus(t, "first", e.Charge(`"ORD-1"`, 5, "X-Correlation-ID", "C-1"), 201, "")
			second := e.Charge(`"ORD-1"`, 5, "X-Correlation-ID", "C-1")
			proxytest.WantStatus(t, "second", second, tt.wantStatus, tt.wantType)
			if second.Replayed() != tt.replayed {
				t.Errorf("replayed = %v, want %v", second.Replayed(), tt.replayed)
			}
			if got := e.Charges("ORD-1"); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
		})
	}
}

// TestTrap is the article's trap and the outcome table of docs/concepts.md ("What
// the upstream's outcome does to the key"): what a failed charge does to
// its retry under each policy.
func TestTrap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		policy      string
		fault       string
		first       int
		firstType   string
		state       string // the key's state after the first attempt
		retry       int
		retryType   string
		retryReplay bool
		charges     int
	}{
		{"fail before charge, reserve-then-commit: the stored 500 is replayed, never charged",
			"reserve-then-commit", "fail-before-charge", 500, "", "completed", 500, "", true, 0},
		{"fail before charge, release-on-5xx: the retry is charged once",
			"release-on-5xx", "fail-before-charge", 500, "", "", 201, "", false, 1},
		{"fail after charge, reserve-then-commit: never charged twice",
			"reserve-then-commit", "fail-after-charge", 500, "", "completed", 500, "", true, 1},
		{"fail after charge, release-on-5xx: charged twice (the upstream broke its promise)",
			"release-on-5xx", "fail-after-charge", 500, "", "", 201, "", false, 2},
		{"429: the upstream did not process it, the retry goes through",
			"reserve-then-commit", "reject-429", 429, "", "", 201, "", false, 1},
		{"connection dropped after the charge: in doubt, never charged twice",
			"reserve-then-commit", "drop-after-charge", 502, "upstream-reset", "in_doubt", 409, "outcome-in-doubt", false, 1},
		{"connection dropped under release-on-5xx: still in doubt",
			"release-on-5xx", "drop-after-charge", 502, "upstream-reset", "in_doubt", 409, "outcome-in-doubt", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := proxytest.New(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    policy: %s
`, tt.policy))
			e.Fault(tt.fault, 1, "")
			first := e.Charge(`"ORD-T"`, 10)
			proxytest.WantStatus(t, "first attempt", first, tt.first, tt.firstType)
			if got := e.State("charges", "", "ORD-T"); string(got) != tt.state {
				t.Errorf("key state after the first attempt = %q, want %q", got, tt.state)
			}
			retry := e.Charge(`"ORD-T"`, 10)
			proxytest.WantStatus(t, "retry", retry, tt.retry, tt.retryType)
			if retry.Replayed() != tt.retryReplay {
				t.Errorf("retry replayed = %v, want %v", retry.Replayed(), tt.retryReplay)
			}
			if got := e.Charges("ORD-T"); got != tt.charges {
				t.Errorf("charges = %d, want %d", got, tt.charges)
			}
		})
	}
}

// TestTrapRejectShowsStoredStatus: with duplicate: reject (the Mule
// behaviour) the retry of a failed charge is a 409 that at least names the
// stored 500.
func TestTrapRejectShowsStoredStatus(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    duplicate: reject
`)
	e.Fault("fail-before-charge", 1, "")
	proxytest.WantStatus(t, "first", e.Charge(`"ORD-R"`, 1), 500, "")
	retry := e.Charge(`"ORD-R"`, 1)
	proxytest.WantStatus(t, "retry", retry, 409, "duplicate-request")
	if got := retry.Field("stored_status"); got != float64(500) {
		t.Errorf("stored_status = %v, want 500", got)
	}
}

// TestLateAnswer: an answer that comes after the upstream timeout is a
// 504, the key is in doubt, the retry gets 409 and the order is charged once.
func TestLateAnswer(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 200ms
    lease: 1s
`)
	e.Fault("delay", 1, "700ms")
	proxytest.WantStatus(t, "first", e.Charge(`"ORD-L"`, 1), http.StatusGatewayTimeout, "upstream-timeout")
	if got := e.State("charges", "", "ORD-L"); got != "in_doubt" {
		t.Errorf("state = %q, want in_doubt", got)
	}
	retry := e.Charge(`"ORD-L"`, 1)
	proxytest.WantStatus(t, "retry", retry, http.StatusConflict, "outcome-in-doubt")
	if retry.Field("expires_at") == nil {
		t.Errorf("the in-doubt problem does not say when the key expires: %s", retry.Body)
	}
	proxytest.Eventually(t, "the late charge is recorded", func() bool { return e.Charges("ORD-L") == 1 })
	proxytest.WantStatus(t, "retry after the late answer", e.Charge(`"ORD-L"`, 1), http.StatusConflict, "outcome-in-doubt")
	if got := e.Charges("ORD-L"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	if got := e.Outcomes("charges", "in_doubt"); got != 1 {
		t.Errorf("in_doubt outcomes = %d, want 1", got)
	}
}
