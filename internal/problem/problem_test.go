package problem_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemproxy/idemproxy/internal/problem"
)

// TestWriteBytes pins the bytes of a problem answer: clients and the docs
// rely on its members, and the proxy and the admin API answer with the
// same form (the bodies are those idemproxy wrote before the writer was
// one, and the newline that ends it since). The members come sorted by
// name, extensions among them.
func TestWriteBytes(t *testing.T) {
	tests := []struct {
		name       string
		typ        problem.Type
		target     string
		detail     string
		retryAfter int
		ext        map[string]any
		wantHeader http.Header
		wantBody   string
	}{
		{
			name: "no detail: no detail member; the path without its query as instance", typ: problem.StoreUnavailable, target: "/charges?x=1",
			wantHeader: http.Header{"Content-Type": {"application/problem+json"}, "Content-Length": {"126"}, "Cache-Control": {"no-store"}},
			wantBody:   `{"instance":"/charges","status":503,"title":"Idempotency store unavailable","type":"urn:idemproxy:problem:store-unavailable"}` + "\n",
		},
		{
			name: "detail, Retry-After and extension members", typ: problem.Overloaded, target: "/charges?x=1", detail: "too many", retryAfter: 1,
			ext:        map[string]any{"limit": 5, "zeta": "z", "a": "b"},
			wantHeader: http.Header{"Content-Type": {"application/problem+json"}, "Content-Length": {"155"}, "Cache-Control": {"no-store"}, "Retry-After": {"1"}},
			wantBody:   `{"a":"b","detail":"too many","instance":"/charges","limit":5,"status":503,"title":"Proxy overloaded","type":"urn:idemproxy:problem:overloaded","zeta":"z"}` + "\n",
		},
		{
			name: "an admin problem with the key's state", typ: problem.Type{Name: "key-not-in-doubt", Status: http.StatusConflict, Title: "Key not in doubt"},
			target: "/v1/keys/charges/k/reconcile", detail: "not in doubt", ext: map[string]any{"state": "completed"},
			wantHeader: http.Header{"Content-Type": {"application/problem+json"}, "Content-Length": {"176"}, "Cache-Control": {"no-store"}},
			wantBody:   `{"detail":"not in doubt","instance":"/v1/keys/charges/k/reconcile","state":"completed","status":409,"title":"Key not in doubt","type":"urn:idemproxy:problem:key-not-in-doubt"}` + "\n",
		},
		{
			// A detail or an extension may carry what the client sent:
			// it is escaped, never markup.
			name: "escaped detail", typ: problem.Overloaded, target: "/", detail: `<script>"x"</script>`,
			wantHeader: http.Header{"Content-Type": {"application/problem+json"}, "Content-Length": {"153"}, "Cache-Control": {"no-store"}},
			wantBody:   `{"detail":"\u003cscript\u003e\"x\"\u003c/script\u003e","instance":"/","status":503,"title":"Proxy overloaded","type":"urn:idemproxy:problem:overloaded"}` + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			problem.Write(w, httptest.NewRequest(http.MethodPost, tt.target, nil), tt.typ, tt.detail, tt.retryAfter, tt.ext)
			if w.Code != tt.typ.Status {
				t.Errorf("status = %d, want %d", w.Code, tt.typ.Status)
			}
			if got := w.Body.String(); got != tt.wantBody {
				t.Errorf("body = %s\nwant   %s", got, tt.wantBody)
			}
			if len(w.Header()) != len(tt.wantHeader) {
				t.Errorf("header = %v, want %v", w.Header(), tt.wantHeader)
			}
			for k, v := range tt.wantHeader {
				if got := w.Header().Get(k); got != v[0] {
					t.Errorf("%s = %q, want %q", k, got, v[0])
				}
			}
		})
	}
}

// TestRawBytes pins the whole 431 answer written on a connection before a
// handler sees the request: the bytes idemproxy wrote before the writer
// was one, Connection: close included, and the body's ending newline.
func TestRawBytes(t *testing.T) {
	got := string(problem.Raw(problem.TooManyHeaderFields, "the request header has more than 100 lines (request line and fields); send fewer header fields"))
	want := "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/problem+json\r\nContent-Length: 216\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" +
		`{"detail":"the request header has more than 100 lines (request line and fields); send fewer header fields","status":431,"title":"Too many request header fields","type":"urn:idemproxy:problem:too-many-header-fields"}` + "\n"
	if got != want {
		t.Errorf("Raw =\n%q\nwant\n%q", got, want)
	}
}
