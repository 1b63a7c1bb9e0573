package e2e

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// The variants of issue 36's attack an attacker tries next, each from the
// same 119 addresses, reconnecting, against the real binary: what others
// see during and after it, the store, and the overload's counters. As in
// TestRapidResetFromManyAddresses, nothing asserts a duration: the share
// served within 1 s is printed.

// TestFrameFloodsFromManyAddresses: every connection sends frames that
// ask the server for work and bring no request: empty CONTINUATION frames
// on a stream whose header block never ends, or PING frames (reading the
// acknowledgements). Each connection is closed for it (counted: at least
// once per address, as each reconnects), the others are served.
func TestFrameFloodsFromManyAddresses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flood   h2attack.Flood
		counter string
	}{
		{"CONTINUATION", h2attack.Continuation, "idemproxy_http2_continuation_floods_total"},
		{"PING", h2attack.Ping, "idemproxy_http2_ping_floods_total"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := floodFromManyAddresses(t, "", &h2attack.Attacker{Flood: tc.flood})
			closed := scrapeValue(t, p, tc.counter)
			t.Logf("connections closed for their %s frames: %v", tc.name, closed)
			if closed < float64(len(manyAddresses())) {
				t.Errorf("%s = %v, want at least one per attacking address (%d)", tc.counter, closed, len(manyAddresses()))
			}
			wantStoreUntouched(t, p)
		})
	}
}

// TestSlowBodiesFromManyAddresses: every connection keeps eight bodies
// under way, a byte of each every 50 ms, and opens eight new streams
// every 3 s, under the same budgets (server.max_buffered_bytes,
// max_connections requests in flight) as everyone: 952 bodies at once.
// The bodies are cut at body_timeout (counted), the buffered bytes never
// pass the budget, the store never fails, HTTP/1.1 probes are served
// throughout and an HTTP/2 probe is served or refused with 503
// (docs/admission.md, "What an attacker can hold"), never fails
// otherwise.
func TestSlowBodiesFromManyAddresses(t *testing.T) {
	p, rep := floodFromManyAddresses(t, serverLimits(0, "body_timeout: 2s"), &h2attack.Attacker{Flood: h2attack.SlowBody, Hold: 3 * time.Second})
	for i, r := range rep.during {
		switch {
		case i%2 == 0 && !r.ok:
			t.Errorf("HTTP/1.1 probe %d during the attack was not served: %+v", i/2, r)
		case i%2 == 1 && !r.ok && r.status != 503:
			t.Errorf("h2c probe %d during the attack = %+v, want 201, or 503 overloaded", i/2, r)
		}
	}
	cut := scrapeValue(t, p, "idemproxy_request_body_timeouts_total")
	held, limit := scrapeValue(t, p, "idemproxy_buffered_bytes"), scrapeValue(t, p, "idemproxy_buffered_bytes_limit")
	t.Logf("bodies cut at body_timeout: %v; refused for the budget: %v; buffered now %v of %v",
		cut, metricSum(t, p, "idemproxy_buffer_refusals_total"), held, limit)
	if cut == 0 {
		t.Errorf("idemproxy_request_body_timeouts_total = 0, want the slow bodies cut")
	}
	if held > limit {
		t.Errorf("idemproxy_buffered_bytes = %v, past the budget %v", held, limit)
	}
	wantStoreUntouched(t, p)
}

// TestAttackOnBothPorts: the rapid reset of TestRapidResetFromManyAddresses
// on the proxy's port and, at the same time, the same frames from the
// same 119 addresses on the admin port (which speaks no HTTP/2: each
// connection is answered and closed, and comes again). The probes are
// served, the admin port keeps answering /readyz, and the bounds over all
// clients act on the proxy's port.
func TestAttackOnBothPorts(t *testing.T) {
	admin := &h2attack.Attacker{From: manyAddresses()}
	p, _ := floodFromManyAddresses(t, "", &h2attack.Attacker{}, admin)
	if admin.Conns.Load() < int64(len(admin.From)) {
		t.Errorf("the admin port took %d attacking connections, want the attack to have reached it (%d addresses)", admin.Conns.Load(), len(admin.From))
	}
	if closed := metricSum(t, p, "idemproxy_overload_actions_total", `action="close_connection"`); closed == 0 {
		t.Errorf("idemproxy_overload_actions_total{action=close_connection} = 0: the bounds over all clients never acted")
	}
	if st, _, err := h2attack.GetFrom(t, "127.0.0.201", p.admin, "/readyz"); st != 200 {
		t.Errorf("admin /readyz after the attack = %d %v, want 200", st, err)
	}
	wantStoreUntouched(t, p)
}
