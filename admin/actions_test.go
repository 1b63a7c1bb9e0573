package admin_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
)

// TestIfMatch: GET's ETag names the record's version, and an act with
// If-Match acts on that record or not at all: a record that changed since
// (settled, released and reserved again) is refused 412 and left as it is.
func TestIfMatch(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	for _, tc := range []struct {
		name, method, suffix string
	}{
		{"release", http.MethodDelete, ""},
		{"reconcile", http.MethodPost, "/reconcile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sk := store.Key("charges", "", "ifmatch-"+tc.name)
			seed(t, st, sk, seedInDoubt)
			target := "/v1/keys/charges/ifmatch-" + tc.name
			got := serve(t, h, http.MethodGet, target, bearer, nil)
			etag := got.Header().Get("ETag")
			if got.Code != http.StatusOK || len(etag) != 18 || etag[0] != '"' {
				t.Fatalf("GET = %d, ETag %q; want 200 and a quoted version", got.Code, etag)
			}
			if again := serve(t, h, http.MethodGet, target, bearer, nil).Header().Get("ETag"); again != etag {
				t.Fatalf("ETag of an unchanged record = %s, then %s; want the same", etag, again)
			}

			// The key changes: released and reserved again by a retry.
			if err := st.Release(t.Context(), sk, ownerToken); err != nil {
				t.Fatal(err)
			}
			res := store.Reservation{Token: "retry-token", Fingerprint: "fp-" + seedInDoubt, Lease: lease, TTL: ttl}
			if rec, err := st.Reserve(t.Context(), sk, res); err != nil || rec != nil {
				t.Fatalf("Reserve again = %v, %v", rec, err)
			}
			if err := st.MarkInDoubt(t.Context(), sk, res.Token, ttl); err != nil {
				t.Fatal(err)
			}
			stale := serve(t, h, tc.method, target+tc.suffix, bearer, http.Header{"If-Match": {etag}})
			checkProblem(t, stale, target+tc.suffix, http.StatusPreconditionFailed, "key-changed-since-read")
			if rec, err := st.Get(t.Context(), sk); err != nil || rec == nil || rec.State != store.StateInDoubt {
				t.Fatalf("after a refused %s: record %+v, %v; want it in doubt still", tc.name, rec, err)
			}

			fresh := serve(t, h, http.MethodGet, target, bearer, nil).Header().Get("ETag")
			if fresh == etag {
				t.Fatalf("ETag unchanged (%s) for a record released and reserved again", etag)
			}
			ok := serve(t, h, tc.method, target+tc.suffix, bearer, http.Header{"If-Match": {fresh}})
			if ok.Code != http.StatusOK {
				t.Errorf("%s with the current ETag = %d %s, want 200", tc.name, ok.Code, ok.Body)
			}
		})
	}
}

// TestAuditLineNamesTheWay: the audit line of an act says it came through
// the key API (the console's say "console"), with the reason given.
func TestAuditLineNamesTheWay(t *testing.T) {
	st := openStore(t)
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.Reconciler = reconcileApplied{}
	})
	for _, tc := range []struct {
		name, method, target, msg string
	}{
		{"release", http.MethodDelete, "/v1/keys/charges/via-1?reason=INC-7", "key released by an operator"},
		{"reconcile", http.MethodPost, "/v1/keys/charges/via-2/reconcile?reason=INC-7", "key reconciled by an operator"},
	} {
		seed(t, st, store.Key("charges", "", "via-"+map[string]string{"release": "1", "reconcile": "2"}[tc.name]), seedInDoubt)
		logs.Reset()
		if got := serve(t, h, tc.method, tc.target, bearer, http.Header{"X-Operator": {"dana"}}); got.Code != http.StatusOK {
			t.Fatalf("%s = %d %s", tc.name, got.Code, got.Body)
		}
		var line map[string]any
		if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
			t.Fatalf("%s: audit line %q: %v", tc.name, logs.String(), err)
		}
		for k, want := range map[string]string{"msg": tc.msg, "via": "api", "operator": "dana", "reason": "INC-7", "route": "charges"} {
			if line[k] != want {
				t.Errorf("%s: audit %s = %v, want %q (line %s)", tc.name, k, line[k], want, logs.String())
			}
		}
	}
}
