package keyscmd

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestKeysDotSegmentKeys: an idempotency key is any string a client sent,
// "." and ".." and "a/../b" included; the CLI must name it in a path the
// admin API's router does not clean away (a ServeMux answers a path with
// dot segments with a redirect to another path, that of another key or of
// none, and turns a DELETE into a GET).
func TestKeysDotSegmentKeys(t *testing.T) {
	mux := http.NewServeMux()
	for _, m := range []string{"GET", "DELETE"} {
		mux.HandleFunc(m+" /v1/keys/{route}/{key...}", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]string{"route": r.PathValue("route"), "key": r.PathValue("key"), "method": r.Method})
		})
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	getenv := func(k string) string {
		if k == "IDEMPROXY_ADMIN_TOKEN" {
			return "t"
		}
		return ""
	}
	for _, sub := range []string{"show", "release"} {
		for _, key := range []string{"..", ".", "a/../b", "x/./y", "../../../-/reload"} {
			var out, errOut strings.Builder
			code := Run(context.Background(), []string{sub, "-admin", srv.URL, "-o", "json", "charges", key}, &out, &errOut, getenv)
			var got map[string]string
			json.Unmarshal([]byte(out.String()), &got)
			want := map[string]string{"route": "charges", "key": key, "method": map[string]string{"show": "GET", "release": "DELETE"}[sub]}
			if code != 0 || got["route"] != want["route"] || got["key"] != want["key"] || got["method"] != want["method"] {
				t.Errorf("keys %s charges %q = exit %d, answer %v (stderr %q); want %v", sub, key, code, got, errOut.String(), want)
			}
		}
	}
}
