package admin_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
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

// TestIfMatchWithoutAVersion: an If-Match that names no version (a
// script's ETag variable left empty: "", or nothing) matches no record,
// as any If-Match that is not the record's version: the act is refused
// 412 and the key left as it is, not done without the check it asked for.
func TestIfMatchWithoutAVersion(t *testing.T) {
	st := openStore(t)
	h := newHandler(t, st, func(o *admin.Options) { o.Reconciler = reconcileApplied{} })
	for _, tc := range []struct {
		name, method, suffix, ifMatch string
	}{
		{"release, quotes", http.MethodDelete, "", `""`},
		{"release, empty", http.MethodDelete, "", ""},
		{"reconcile, quotes", http.MethodPost, "/reconcile", `""`},
		{"reconcile, empty", http.MethodPost, "/reconcile", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "ifmatch-none-" + strings.NewReplacer(",", "", " ", "-").Replace(tc.name)
			sk := store.Key("charges", "", key)
			seed(t, st, sk, seedInDoubt)
			target := "/v1/keys/charges/" + key
			got := serve(t, h, tc.method, target+tc.suffix, bearer, http.Header{"If-Match": {tc.ifMatch}})
			checkProblem(t, got, target+tc.suffix, http.StatusPreconditionFailed, "key-changed-since-read")
			if rec, err := st.Get(t.Context(), sk); err != nil || rec == nil || rec.State != store.StateInDoubt {
				t.Fatalf("after a refused %s: record %+v, %v; want it in doubt still", tc.name, rec, err)
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

// TestAPIActTextIsBounded: the key API's reason and X-Operator go to the
// audit line as the console's do, so they are held to the same rules: a
// reason over 1,000 bytes, or a control or bidirectional character that
// would make the line read otherwise, is refused 400 with nothing done.
func TestAPIActTextIsBounded(t *testing.T) {
	st := openStore(t)
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.Reconciler = reconcileApplied{}
	})
	long := make([]byte, 1001)
	for i := range long {
		long[i] = 'r'
	}
	for i, tc := range []struct {
		name, reason, operator string
	}{
		{"long reason", string(long), ""},
		{"newline in reason", "INC-1\nlevel=INFO msg=fine", ""},
		{"bidi in reason", "INC-1 \u202eko", ""},
		{"bidi in operator", "INC-1", "eve\u202eecila"},
	} {
		for _, act := range []struct{ method, suffix string }{{http.MethodDelete, ""}, {http.MethodPost, "/reconcile"}} {
			key := "text-" + string(rune('a'+i)) + act.method
			sk := store.Key("charges", "", key)
			seed(t, st, sk, seedInDoubt)
			logs.Reset()
			hdr := http.Header{}
			if tc.operator != "" {
				hdr.Set("X-Operator", tc.operator)
			}
			target := "/v1/keys/charges/" + key + act.suffix + "?reason=" + url.QueryEscape(tc.reason)
			checkProblem(t, serve(t, h, act.method, target, bearer, hdr), target, http.StatusBadRequest, "invalid-parameter")
			if rec, err := st.Get(t.Context(), sk); err != nil || rec == nil || rec.State != store.StateInDoubt {
				t.Errorf("%s %s: record %+v, %v; want it in doubt still", tc.name, act.method, rec, err)
			}
			if logs.Len() != 0 {
				t.Errorf("%s %s: audit line %s, want none", tc.name, act.method, logs.String())
			}
		}
	}
}
