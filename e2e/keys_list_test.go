package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// keysPage is an answer of GET /v1/keys/{route}.
type keysPage struct {
	Keys []struct {
		Route        string `json:"route"`
		Key          string `json:"key"`
		ScopeHash    string `json:"scope_hash"`
		KeyHash      string `json:"key_hash"`
		State        string `json:"state"`
		StoredStatus int    `json:"stored_status"`
	} `json:"keys"`
	NextCursor string `json:"next_cursor"`
}

// TestListInDoubtKeysAfterTimeouts is the operator's path from an alert on
// in-doubt keys: after two 504s the listing of the route's in-doubt keys
// names their raw keys, page by page, and the key_hash of an access log
// line leads to its key.
func TestListInDoubtKeysAfterTimeouts(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	route := `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 1s
    lease: 2s
`
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", route)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	for _, order := range []string{"ORD-L1", "ORD-L3"} {
		if r := charge(p, order, "X-Stub-Fault", "delay", "X-Stub-Delay", "3s"); r.status != http.StatusGatewayTimeout {
			t.Fatalf("charge %s with a late answer = %d %s, want 504", order, r.status, r.body)
		}
	}
	if r := charge(p, "ORD-L2"); r.status != http.StatusCreated {
		t.Fatalf("charge ORD-L2 = %d %s, want 201", r.status, r.body)
	}

	list := func(query string) keysPage {
		t.Helper()
		r := do("GET", p.adminURL("/v1/keys/charges?"+query), "", "Authorization", "Bearer s3cret")
		if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET /v1/keys/charges?%s = %d %s, want 200 JSON", query, r.status, r.body)
		}
		var page keysPage
		if err := json.Unmarshal([]byte(r.body), &page); err != nil {
			t.Fatalf("decode %s: %v", r.body, err)
		}
		return page
	}

	// One key a page, following the cursor.
	var inDoubt []string
	cursor := ""
	for range 10 {
		q := "state=in_doubt&limit=1"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		page := list(q)
		if len(page.Keys) > 1 {
			t.Fatalf("limit=1: %d keys", len(page.Keys))
		}
		for _, k := range page.Keys {
			if k.Route != "charges" || k.ScopeHash != "-" || k.State != "in_doubt" || k.KeyHash != store.KeyHash(store.Key("charges", "", k.Key)) {
				t.Errorf("listed %+v, want charges, scope -, in_doubt and the key's hash", k)
			}
			inDoubt = append(inDoubt, k.Key)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	slices.Sort(inDoubt)
	if want := []string{"ORD-L1", "ORD-L3"}; !slices.Equal(inDoubt, want) {
		t.Errorf("in-doubt keys = %q, want %q", inDoubt, want)
	}

	completed := list("state=completed")
	if len(completed.Keys) != 1 || completed.Keys[0].Key != "ORD-L2" || completed.Keys[0].StoredStatus != http.StatusCreated {
		t.Errorf("completed keys = %+v, want ORD-L2 with stored_status 201", completed.Keys)
	}

	// The access log line of a 504 carries the key's hash, never the key:
	// the listing turns it back into the key.
	var hash string
	eventually(t, "the access log has the 504s", func() bool {
		for _, l := range p.log.logLines("request") {
			if s, _ := l["status"].(float64); s == http.StatusGatewayTimeout {
				hash, _ = l["key_hash"].(string)
				return hash != ""
			}
		}
		return false
	})
	found := list("key_hash=" + hash)
	if len(found.Keys) != 1 || found.Keys[0].KeyHash != hash || !slices.Contains([]string{"ORD-L1", "ORD-L3"}, found.Keys[0].Key) {
		t.Errorf("key_hash=%s found %+v, want the in-doubt key of that log line", hash, found.Keys)
	}

	r := do("GET", p.adminURL("/v1/keys/charges?state=lost"), "", "Authorization", "Bearer s3cret")
	if r.status != http.StatusBadRequest || problemType(r) != "invalid-parameter" {
		t.Errorf("state=lost = %d %s, want 400 invalid-parameter", r.status, r.body)
	}
	if r := do("GET", p.adminURL("/v1/keys/charges"), ""); r.status != http.StatusUnauthorized {
		t.Errorf("listing without the token = %d, want 401", r.status)
	}
}
