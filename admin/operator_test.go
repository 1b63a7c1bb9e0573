package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// reconcileApplied is a Reconciler whose every lookup finds the charge.
type reconcileApplied struct{}

func (reconcileApplied) Reconcile(context.Context, string) (reconcile.Outcome, error) {
	return reconcile.Outcome{Result: "applied", LookupStatus: http.StatusOK}, nil
}

// TestAuditLineOperator: the audit lines of a release, a reconcile and an
// acceptance of a store's loss name the request's X-Operator; a request
// that names none leaves "operator" out of the line, rather than logging
// an empty name that reads as one lost on the way.
func TestAuditLineOperator(t *testing.T) {
	st := openStore(t)
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.Reconciler = reconcileApplied{}
		o.AcceptLoss = func(context.Context, string, string) (*store.Epoch, *store.Epoch, error) {
			return nil, &store.Epoch{ID: "e-2", State: store.EpochAccepted, Gen: 2, CreatedAt: time.Now()}, nil
		}
	})
	tests := []struct {
		name     string
		method   string
		target   string // "%s" is a key of its own, seeded in doubt
		operator string // "": no X-Operator
		wantMsg  string
	}{
		{"release, named", http.MethodDelete, "/v1/keys/charges/%s?reason=INC-1", "alice", "key released by an operator"},
		{"release, unnamed", http.MethodDelete, "/v1/keys/charges/%s?reason=INC-1", "", "key released by an operator"},
		{"reconcile, named", http.MethodPost, "/v1/keys/charges/%s/reconcile", "bob", "key reconciled by an operator"},
		{"reconcile, unnamed", http.MethodPost, "/v1/keys/charges/%s/reconcile", "", "key reconciled by an operator"},
		{"accept-loss, named", http.MethodPost, "/v1/store/accept-loss?reason=flushed", "carol", "store loss accepted by an operator: retries of keys answered before the loss will be forwarded again"},
		{"accept-loss, unnamed", http.MethodPost, "/v1/store/accept-loss?reason=flushed", "", "store loss accepted by an operator: retries of keys answered before the loss will be forwarded again"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "audit-" + string(rune('a'+i))
			seed(t, st, store.Key("charges", "", key), seedInDoubt)
			logs.Reset()
			var hdr http.Header
			if tt.operator != "" {
				hdr = http.Header{"X-Operator": {tt.operator}}
			}
			target := strings.Replace(tt.target, "%s", key, 1)
			if rec := serve(t, h, tt.method, target, bearer, hdr); rec.Code != http.StatusOK {
				t.Fatalf("%s %s = %d %s, want 200", tt.method, target, rec.Code, rec.Body)
			}
			var line map[string]any
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("audit line %q: %v", logs.String(), err)
			}
			if line["msg"] != tt.wantMsg {
				t.Errorf("msg = %v, want %q", line["msg"], tt.wantMsg)
			}
			got, present := line["operator"]
			switch {
			case tt.operator != "" && got != tt.operator:
				t.Errorf("operator = %v, want %q", got, tt.operator)
			case tt.operator == "" && present:
				t.Errorf("operator = %q, want no operator attribute for a request without X-Operator", got)
			}
		})
	}
}

// TestKeyInFlightNamesItsOverride: a release refused because the key is in
// flight says how to override it, in the detail for a person and as the
// "override" member for a client that says it otherwise (idemproxy keys
// -force).
func TestKeyInFlightNamesItsOverride(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, nil)
	seed(t, st, store.Key("charges", "", "busy"), seedInFlight)
	const target = "/v1/keys/charges/busy"
	rec := serve(t, h, http.MethodDelete, target, bearer, nil)
	checkProblem(t, rec, target, http.StatusConflict, "key-in-flight")
	var p struct {
		Detail   string `json:"detail"`
		Override string `json:"override"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem %q: %v", rec.Body, err)
	}
	want := struct{ Detail, Override string }{
		"the key is in flight: its request is being forwarded now; wait for it to settle, or add ?force=true", "?force=true",
	}
	if p.Detail != want.Detail || p.Override != want.Override {
		t.Errorf("detail, override = %q, %q\nwant %q, %q", p.Detail, p.Override, want.Detail, want.Override)
	}
}
