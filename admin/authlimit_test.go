package admin_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
)

// serveFrom runs one request from remote (host:port) through h.
func serveFrom(h http.Handler, remote, method, target, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestFailedAuthenticationsAreThrottled: a burst of wrong tokens from one
// address gets 401 a few times, then 429 too-many-auth-failures with
// Retry-After, for a correct token too (an answer that told it apart
// would let the guessing go on); the same IPv6 /64 is the same client;
// other addresses are served; every failure is counted and logged at a
// rate lograte bounds (one message).
func TestFailedAuthenticationsAreThrottled(t *testing.T) {
	const target = "/v1/keys/charges/k"
	tests := []struct {
		name              string
		attacker, sibling string // sibling: another address of the attacker's client
		other             string // another client
	}{
		{"IPv4", "192.0.2.1:4000", "192.0.2.1:4001", "192.0.2.2:4000"},
		{"IPv6 /64", "[2001:db8:1:2::1]:4000", "[2001:db8:1:2:ffff::9]:4000", "[2001:db8:1:3::1]:4000"},
		{"IPv4-mapped IPv6", "[::ffff:192.0.2.1]:4000", "192.0.2.1:4001", "[::ffff:192.0.2.2]:4000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			h := newHandler(t, openStore(t), func(o *admin.Options) {
				o.Registerer = reg
				o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			})
			failures := 0
			for i := range 100 {
				rec := serveFrom(h, tt.attacker, http.MethodGet, target, "Bearer guess-"+strconv.Itoa(i))
				if rec.Code == http.StatusTooManyRequests {
					break
				}
				checkProblem(t, rec, target, http.StatusUnauthorized, "unauthorized")
				failures++
			}
			if failures < 3 || failures > 10 {
				t.Fatalf("wrong tokens answered 401 before the first 429: %d, want a few (3 to 10)", failures)
			}
			for _, c := range []struct{ name, remote, auth string }{
				{"a wrong token", tt.attacker, "Bearer guess-again"},
				{"no token", tt.attacker, ""},
				{"the correct token", tt.attacker, bearer},
				{"the correct token from the same client's other address", tt.sibling, bearer},
			} {
				rec := serveFrom(h, c.remote, http.MethodGet, target, c.auth)
				p := checkProblem(t, rec, target, http.StatusTooManyRequests, "too-many-auth-failures")
				ra, err := strconv.Atoi(rec.Header().Get("Retry-After"))
				if err != nil || ra < 1 || ra > 60 {
					t.Errorf("%s during the penalty: Retry-After = %q, want 1 to 60 seconds", c.name, rec.Header().Get("Retry-After"))
				}
				if p.Detail == "" {
					t.Errorf("%s during the penalty: no detail", c.name)
				}
			}
			if rec := serveFrom(h, tt.other, http.MethodGet, "/v1/keys/charges/never-seen", bearer); rec.Code != http.StatusNotFound {
				t.Errorf("the correct token from another client = %d %s, want 404 no-record (served)", rec.Code, rec.Body)
			}
			if rec := serveFrom(h, tt.attacker, http.MethodGet, "/readyz", ""); rec.Code != http.StatusOK {
				t.Errorf("/readyz from the throttled client = %d, want 200: only the token's endpoints are throttled", rec.Code)
			}
			if got := counter(t, reg, "idemproxy_admin_auth_failures_total"); got != float64(failures) {
				t.Errorf("idemproxy_admin_auth_failures_total = %v, want %d", got, failures)
			}
			if got := counter(t, reg, "idemproxy_admin_auth_throttled_total"); got != 5 {
				t.Errorf("idemproxy_admin_auth_throttled_total = %v, want 5 (the first 429 and four more)", got)
			}
			if n := strings.Count(logs.String(), `"msg":"admin authentication failed"`); n != failures {
				t.Errorf("%d log lines of failed authentications, want %d:\n%s", n, failures, logs.String())
			}
			if strings.Contains(logs.String(), "guess-") {
				t.Errorf("the log holds a guessed token:\n%s", logs.String())
			}
		})
	}
}

// counter reads a registered counter by name.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}

// TestFailedAuthenticationsFromManyNetworksNeverLockOutTheOperator: an
// attacker fails 5 times from each of more IPv6 /64s (of one /48) than
// the limiter tracks (4,096, docs/http-api.md), which fills its table
// with penalized addresses, and goes on from more. The operator's correct
// token from an address that never failed is served, IPv4 or IPv6; the
// attacker's penalized addresses are still refused with a correct token,
// and an address beyond the table is answered 401, not 429.
func TestFailedAuthenticationsFromManyNetworksNeverLockOutTheOperator(t *testing.T) {
	const tracked = 4096
	h := newHandler(t, openStore(t), func(o *admin.Options) { o.Logger = slog.New(slog.DiscardHandler) })
	const target = "/v1/keys/charges/k"
	attacker := func(i int) string { return fmt.Sprintf("[2001:db8:0:%x::1]:4000", i) }
	for i := range tracked + 2 {
		for j := range 5 {
			serveFrom(h, attacker(i), http.MethodGet, target, "Bearer guess-"+strconv.Itoa(j))
		}
	}
	for _, operator := range []string{"192.0.2.10:5000", "[2001:db8:ffff::1]:5000"} {
		if rec := serveFrom(h, operator, http.MethodGet, "/v1/keys/charges/never-seen", bearer); rec.Code != http.StatusNotFound {
			t.Errorf("the correct token from %s, which never failed = %d %s, want 404 no-record (served)", operator, rec.Code, rec.Body)
		}
	}
	rec := serveFrom(h, attacker(0), http.MethodGet, target, bearer)
	checkProblem(t, rec, target, http.StatusTooManyRequests, "too-many-auth-failures")
	rec = serveFrom(h, attacker(tracked+1), http.MethodGet, target, "Bearer guess-again")
	checkProblem(t, rec, target, http.StatusUnauthorized, "unauthorized")
}
