package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/keyextract"
	"github.com/idemproxy/idemproxy/store"
)

// TestRecordsFromBeforeTheNumberRuleStillReplay: a record stored before
// numbers were canonicalised in the fingerprint (12.50 hashed as written,
// now as 12.5) still answers its identical retry after an upgrade with its
// replay, not 422 fingerprint-mismatch; a retry with another body is still
// a mismatch.
func TestRecordsFromBeforeTheNumberRuleStillReplay(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	const body = `{"orderId": "ORD-LEGACY", "amount": 12.50}`
	// Fingerprint("POST", "/charges", body, nil) as computed by 33f5b72,
	// before the key rules of issue 16.
	const oldFP = "8aee7de71eefaeab7bcd9c50356ca28fedeb115ec151594a33f9270e2d670720"
	ctx := context.Background()
	key := store.Key("charges", "", "ORD-LEGACY")
	res := store.Reservation{Token: "t-old", Fingerprint: oldFP, Lease: time.Minute, TTL: time.Hour}
	if rec, err := e.Store.Reserve(ctx, key, res); err != nil || rec != nil {
		t.Fatalf("Reserve = %v, %v", rec, err)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"ch_old"}`), BodyStored: true}
	if err := e.Store.Commit(ctx, key, "t-old", resp, time.Hour); err != nil {
		t.Fatal(err)
	}

	a := e.Do("POST", "/charges", body, "Content-Type", "application/json")
	if a.Status != 201 || !a.Replayed() || string(a.Body) != `{"id":"ch_old"}` {
		t.Errorf("the identical retry after the upgrade: %v (replayed %v), want the stored 201 replayed", a, a.Replayed())
	}
	a = e.Do("POST", "/charges", `{"orderId": "ORD-LEGACY", "amount": 12.51}`, "Content-Type", "application/json")
	proxytest.WantStatus(t, "a retry with another amount", a, 422, "fingerprint-mismatch")
	if n := e.Charges("ORD-LEGACY"); n != 0 {
		t.Errorf("upstream charges = %d, want 0", n)
	}
}

// TestRecordsUnderKeysFromBeforeTheKeyRulesStillAnswer: a key the previous
// version derived differently (a quoted header key kept its quotes, a
// number key was kept as written) still finds its record after an
// upgrade: the identical retry is replayed, not forwarded and charged a
// second time under the new form of its key.
func TestRecordsUnderKeysFromBeforeTheKeyRulesStillAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, routes, oldKey, body string
		hdr                        []string
	}{
		{"quoted header key", "\n  - name: charges\n    match: POST /charges\n    key: {header: Idempotency-Key}\n",
			`"k-1"`, `{"orderId": "ORD-Q", "amount": 10}`, []string{"Idempotency-Key", `"k-1"`}},
		{"number key", "\n  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n",
			`4200.0`, `{"orderId": 4200.0, "amount": 10}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := proxytest.New(t, tt.routes)
			ctx := context.Background()
			key := store.Key("charges", "", tt.oldKey)
			fp, _ := keyextract.LegacyFingerprintIgnoring("POST", "/charges", []byte(tt.body), nil)
			res := store.Reservation{Token: "t-old", Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
			if rec, err := e.Store.Reserve(ctx, key, res); err != nil || rec != nil {
				t.Fatalf("Reserve = %v, %v", rec, err)
			}
			resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"id":"ch_old"}`), BodyStored: true}
			if err := e.Store.Commit(ctx, key, "t-old", resp, time.Hour); err != nil {
				t.Fatal(err)
			}
			a := e.Do("POST", "/charges", tt.body, append([]string{"Content-Type", "application/json"}, tt.hdr...)...)
			if a.Status != 201 || !a.Replayed() || string(a.Body) != `{"id":"ch_old"}` {
				t.Errorf("the identical retry after the upgrade: %v (replayed %v), want the stored 201 replayed", a, a.Replayed())
			}
			if n := e.TotalCharges(); n != 0 {
				t.Errorf("upstream charges = %d, want 0", n)
			}
		})
	}
}
