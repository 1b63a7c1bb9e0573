package keyscmd

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// oneRoute is the admin API's routes: charges, not scoped.
type oneRoute struct{}

func (oneRoute) RouteScope(name string) (string, bool) { return "", name == "charges" }

const token = "t0ken-for-the-keys-tests"

// adminAPI serves the real admin API on a Badger store, with key in
// flight on route charges, and returns its URL and its audit log.
func adminAPI(t *testing.T, inFlight ...string) (string, *bytes.Buffer) {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("badger.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	for _, k := range inFlight {
		res := store.Reservation{Token: "owner-" + k, Fingerprint: "fp", Lease: time.Hour, TTL: 24 * time.Hour}
		if prev, err := st.Reserve(context.Background(), store.Key("charges", "", k), res); err != nil || prev != nil {
			t.Fatalf("Reserve(%s) = %v, %v", k, prev, err)
		}
	}
	var logs bytes.Buffer
	srv := httptest.NewServer(admin.NewHandler(admin.Options{
		Store: st, Routes: oneRoute{}, Gatherer: prometheus.NewRegistry(), Token: token,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &logs
}

// env is a getenv of the admin token and the given variables.
func env(vars ...string) func(string) string {
	return func(k string) string {
		if k == "IDEMPROXY_ADMIN_TOKEN" {
			return token
		}
		for _, kv := range vars {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v
			}
		}
		return ""
	}
}

// TestReleaseInFlightAdvisesForce: the admin API refuses to release a key
// in flight and advises ?force=true, the query its API user adds; the
// command's user is advised the flag that sends it, -force, which then
// releases the key.
func TestReleaseInFlightAdvisesForce(t *testing.T) {
	url, _ := adminAPI(t, "busy")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{
			name: "refused: the advice names -force", args: []string{"release", "charges", "busy"}, wantCode: 1,
			wantStderr: "idemproxy keys: Key in flight (409): the key is in flight: its request is being forwarded now; wait for it to settle, or add -force\n",
		},
		{
			name: "with -force: released", args: []string{"release", "charges", "busy", "-force"}, wantCode: 0,
			wantStdout: "released        true\nprevious_state  in_flight\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut strings.Builder
			code := Run(context.Background(), append(tt.args, "-admin", url), &out, &errOut, env())
			if code != tt.wantCode || out.String() != tt.wantStdout || errOut.String() != tt.wantStderr {
				t.Errorf("keys %v = exit %d\nstdout %q\nstderr %q\nwant exit %d\nstdout %q\nstderr %q",
					tt.args, code, out.String(), errOut.String(), tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

// TestProblemText: a problem in one line, its override advised as the
// command's flag wherever the detail names the query, and added when the
// detail does not; an override the command has no flag for is left as the
// API says it.
func TestProblemText(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"no override", `{"title":"No record for this key","status":404,"detail":"no record for this key"}`,
			"No record for this key (404): no record for this key"},
		{"override in the detail", `{"title":"Key in flight","status":409,"detail":"wait, or add ?force=true","override":"?force=true"}`,
			"Key in flight (409): wait, or add -force"},
		{"override not in the detail", `{"title":"Key in flight","status":409,"detail":"the key is in flight","override":"?force=true"}`,
			"Key in flight (409): the key is in flight (add -force to override)"},
		{"override without a detail", `{"title":"Key in flight","status":409,"override":"?force=true"}`,
			"Key in flight (409): (add -force to override)"},
		{"an override with no flag", `{"title":"Refused","status":409,"detail":"add ?other=1","override":"?other=1"}`,
			"Refused (409): add ?other=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: 409, Status: "409 Conflict", Header: http.Header{"Content-Type": {"application/problem+json"}}}
			if strings.Contains(tt.body, `"status":404`) {
				resp.StatusCode, resp.Status = 404, "404 Not Found"
			}
			if got := problemText(resp, []byte(tt.body)); got != tt.want {
				t.Errorf("problemText = %q\nwant          %q", got, tt.want)
			}
		})
	}
}

// TestOperatorDefault: release and reconcile name the operator in the
// admin API's audit line: -operator when given, else $USER, else the
// account of the process's user ID; never an empty name.
func TestOperatorDefault(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatalf("user.Current: %v", err)
	}
	tests := []struct {
		name string
		args []string
		vars []string
		want string
	}{
		{"-operator", []string{"-operator", "alice"}, []string{"USER=bob"}, "alice"},
		{"$USER", nil, []string{"USER=bob"}, "bob"},
		{"no $USER: the OS account", nil, nil, me.Username},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, logs := adminAPI(t, "k")
			var out, errOut strings.Builder
			args := append([]string{"release", "charges", "k", "-force", "-admin", url}, tt.args...)
			if code := Run(context.Background(), args, &out, &errOut, env(tt.vars...)); code != 0 {
				t.Fatalf("keys %v = exit %d: %s", args, code, errOut.String())
			}
			var line map[string]any
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("audit line %q: %v", logs.String(), err)
			}
			if line["msg"] != "key released by an operator" || line["operator"] != tt.want {
				t.Errorf("audit line = %s\nwant key released by an operator, operator %q", logs.String(), tt.want)
			}
		})
	}
}
