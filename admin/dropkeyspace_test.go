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
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// TestDropKeyspace: POST /v1/keyspaces/{keyspace}/drop is behind the
// token, needs a reason, removes the entry from the real Badger store's
// registry, answers it, and writes one audit line naming the operator and
// the reason; an unknown keyspace is 404 unknown-keyspace.
func TestDropKeyspace(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	k := store.Keyspace{Name: "charges", Digest: "d", Recipe: "json orderId; scope none; normalize none", Routes: "charges", UpdatedAt: time.Now()}
	if err := st.PutKeyspace(ctx, k); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.DropKeyspace = func(ctx context.Context, name string) (store.Keyspace, error) {
			found, err := st.DropKeyspace(ctx, name)
			if err == nil && !found {
				err = admin.ErrNoKeyspace
			}
			return k, err
		}
	})
	const path = "/v1/keyspaces/charges/drop"
	checkProblem(t, serve(t, h, http.MethodPost, path+"?reason=x", "", nil), path, http.StatusUnauthorized, "unauthorized")
	checkProblem(t, serve(t, h, http.MethodPost, path, bearer, nil), path, http.StatusBadRequest, "invalid-parameter")
	if got, _ := st.Keyspaces(ctx); len(got) != 1 {
		t.Fatalf("a refused drop changed the registry: %+v", got)
	}
	logs.Reset()
	rec := serve(t, h, http.MethodPost, path+"?reason=INC-5", bearer, http.Header{"X-Operator": {"alice"}})
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"dropped": true`) {
		t.Fatalf("drop = %d %s, want 200 dropped", rec.Code, rec.Body)
	}
	if got, _ := st.Keyspaces(ctx); len(got) != 0 {
		t.Errorf("after the drop the registry holds %+v, want nothing", got)
	}
	var line map[string]any
	if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
		t.Fatalf("audit line %q: %v", logs.String(), err)
	}
	if line["level"] != "WARN" || line["keyspace"] != "charges" || line["operator"] != "alice" || line["reason"] != "INC-5" || line["via"] != "admin" {
		t.Errorf("audit line = %v", line)
	}
	checkProblem(t, serve(t, h, http.MethodPost, path+"?reason=again", bearer, nil), path, http.StatusNotFound, "unknown-keyspace")
}
