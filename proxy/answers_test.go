package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// upstreamCodes returns the code labels of
// idemproxy_upstream_request_duration_seconds observed for route.
func upstreamCodes(t *testing.T, e *env, route string) map[string]uint64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "idemproxy_upstream_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var r, c string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "route":
					r = l.GetValue()
				case "code":
					c = l.GetValue()
				}
			}
			if r == route && m.GetHistogram().GetSampleCount() > 0 {
				codes[c] += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return codes
}

// TestPassthroughEarlyHintsStatus: an upstream that sends 103 Early Hints
// before its 200 is a 200 to the client, and must be a 200 in the metrics
// and the access log too, not the informational 103.
func TestPassthroughEarlyHintsStatus(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	e := &env{t: t}
	e.start(up.URL, chargesByOrder)
	wantStatus(t, "passthrough", e.do("GET", "/page", ""), 200, "")
	if got := upstreamCodes(t, e, ""); got["200"] != 1 || len(got) != 1 {
		t.Errorf("upstream codes of the passthrough = %v, want one 200", got)
	}
}
