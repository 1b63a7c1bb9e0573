package proxy_test

import (
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
			e := newEnv(t, tt.routes)
			for i, order := range []string{`"ORD-2101"`, `"ORD-2102"`, `"ORD-2103"`} {
				a := e.charge(order, 10*(i+1), "X-Correlation-ID", "BATCH-1")
				wantStatus(t, fmt.Sprintf("order %d", i+1), a, tt.want[i], tt.wantType[i])
			}
			if got := e.totalCharges(); got != tt.wantCharge {
				t.Errorf("charges = %d, want %d", got, tt.wantCharge)
			}
		})
	}
}

// TestArticleSameOrderTwoCorrelationIDs: a client retries the same order
// with a new correlation ID.
func TestArticleSameOrderTwoCorrelationIDs(t *testing.T) {
	t.Run("keyed by correlation ID: charged twice", func(t *testing.T) {
		e := newEnv(t, byCorrelationID)
		first := e.charge(`"ORD-IR-B-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-1")
		second := e.charge(`"ORD-IR-B-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-2")
		wantStatus(t, "first", first, 201, "")
		wantStatus(t, "second", second, 201, "")
		if got := e.charges("ORD-IR-B-100"); got != 2 {
			t.Errorf("charges = %d, want 2", got)
		}
	})
	t.Run("keyed by orderId: charged once, the retry replayed", func(t *testing.T) {
		e := newEnv(t, byOrderID)
		first := e.charge(`"ORD-IR-A-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-1")
		second := e.charge(`"ORD-IR-A-100"`, 100, "X-Correlation-ID", "CLIENT-TRY-2")
		wantStatus(t, "first", first, 201, "")
		wantStatus(t, "second", second, 201, "")
		if !second.replayed() || string(second.body) != string(first.body) {
			t.Errorf("second answer = %s (replayed %v), want the first answer %s replayed", second.body, second.replayed(), first.body)
		}
		if got := e.charges("ORD-IR-A-100"); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
	})
}

// TestArticleSameRequestRepeated: the same request with the same
// correlation ID is blocked the second time.
func TestArticleSameRequestRepeated(t *testing.T) {
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
			e := newEnv(t, tt.routes)
			wantStatus(t, "first", e.charge(`"ORD-1"`, 5, "X-Correlation-ID", "C-1"), 201, "")
			second := e.charge(`"ORD-1"`, 5, "X-Correlation-ID", "C-1")
			wantStatus(t, "second", second, tt.wantStatus, tt.wantType)
			if second.replayed() != tt.replayed {
				t.Errorf("replayed = %v, want %v", second.replayed(), tt.replayed)
			}
			if got := e.charges("ORD-1"); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
		})
	}
}

// TestTrap is the article's trap and the README's outcome table ("What
// the upstream's outcome does to the key"): what a failed charge does to
// its retry under each policy.
func TestTrap(t *testing.T) {
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
			e := newEnv(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    policy: %s
`, tt.policy))
			e.fault(tt.fault, 1, "")
			first := e.charge(`"ORD-T"`, 10)
			wantStatus(t, "first attempt", first, tt.first, tt.firstType)
			if got := e.state("charges", "", "ORD-T"); string(got) != tt.state {
				t.Errorf("key state after the first attempt = %q, want %q", got, tt.state)
			}
			retry := e.charge(`"ORD-T"`, 10)
			wantStatus(t, "retry", retry, tt.retry, tt.retryType)
			if retry.replayed() != tt.retryReplay {
				t.Errorf("retry replayed = %v, want %v", retry.replayed(), tt.retryReplay)
			}
			if got := e.charges("ORD-T"); got != tt.charges {
				t.Errorf("charges = %d, want %d", got, tt.charges)
			}
		})
	}
}

// TestTrapRejectShowsStoredStatus: with duplicate: reject (the Mule
// behaviour) the retry of a failed charge is a 409 that at least names the
// stored 500.
func TestTrapRejectShowsStoredStatus(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    duplicate: reject
`)
	e.fault("fail-before-charge", 1, "")
	wantStatus(t, "first", e.charge(`"ORD-R"`, 1), 500, "")
	retry := e.charge(`"ORD-R"`, 1)
	wantStatus(t, "retry", retry, 409, "duplicate-request")
	if got := retry.field("stored_status"); got != float64(500) {
		t.Errorf("stored_status = %v, want 500", got)
	}
}

// TestLateAnswer: an answer that comes after the upstream timeout is a
// 504, the key is in doubt, the retry gets 409 and the order is charged once.
func TestLateAnswer(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 200ms
    lease: 1s
`)
	e.fault("delay", 1, "700ms")
	wantStatus(t, "first", e.charge(`"ORD-L"`, 1), http.StatusGatewayTimeout, "upstream-timeout")
	if got := e.state("charges", "", "ORD-L"); got != "in_doubt" {
		t.Errorf("state = %q, want in_doubt", got)
	}
	retry := e.charge(`"ORD-L"`, 1)
	wantStatus(t, "retry", retry, http.StatusConflict, "outcome-in-doubt")
	if retry.field("expires_at") == nil {
		t.Errorf("the in-doubt problem does not say when the key expires: %s", retry.body)
	}
	eventually(t, "the late charge is recorded", func() bool { return e.charges("ORD-L") == 1 })
	wantStatus(t, "retry after the late answer", e.charge(`"ORD-L"`, 1), http.StatusConflict, "outcome-in-doubt")
	if got := e.charges("ORD-L"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	if got := e.outcomes("charges", "in_doubt"); got != 1 {
		t.Errorf("in_doubt outcomes = %d, want 1", got)
	}
}
