package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// The variants of issue 36's attack an attacker tries next, each from the
// same 119 addresses, reconnecting, against the real binary: what others
// see during and after it, the store, and the overload's counters. As in
// TestRapidResetFromManyAddresses, nothing asserts a duration: the share
// served within 1 s is printed.

// TestContinuationFloodFromManyAddresses: every connection opens a stream
// whose header block never ends and sends empty CONTINUATION frames on it.
// Each is closed for it (counted), the others are served.
func TestContinuationFloodFromManyAddresses(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	a := &h2attack.Attacker{Addr: p.addr, From: manyAddresses(), Flood: h2attack.Continuation}
	rep := underAttack(t, p, a)
	logAttack(t, rep, a)
	if n, _ := served(rep.during, time.Minute); n == 0 {
		t.Errorf("no probe of %d served during the attack", len(rep.during))
	}
	if rep.ready == 0 {
		t.Errorf("the admin port's /readyz never answered during the attack")
	}
	floods := scrapeValue(t, p, "idemproxy_http2_continuation_floods_total")
	t.Logf("connections closed for their CONTINUATION frames: %v", floods)
	if floods < float64(len(a.From)) {
		t.Errorf("idemproxy_http2_continuation_floods_total = %v, want at least one per attacking address (%d)", floods, len(a.From))
	}
	wantStoreUntouched(t, p)
}

// TestPingFloodFromManyAddresses: every connection sends PING frames and
// opens no stream, reading the acknowledgements. Each is closed once past
// the PING bound (counted), the others are served.
func TestPingFloodFromManyAddresses(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	a := &h2attack.Attacker{Addr: p.addr, From: manyAddresses(), Flood: h2attack.Ping}
	rep := underAttack(t, p, a)
	logAttack(t, rep, a)
	if n, _ := served(rep.during, time.Minute); n == 0 {
		t.Errorf("no probe of %d served during the attack", len(rep.during))
	}
	if rep.ready == 0 {
		t.Errorf("the admin port's /readyz never answered during the attack")
	}
	floods := scrapeValue(t, p, "idemproxy_http2_ping_floods_total")
	t.Logf("connections closed for their PINGs: %v", floods)
	if floods < float64(len(a.From)) {
		t.Errorf("idemproxy_http2_ping_floods_total = %v, want at least one per attacking address (%d)", floods, len(a.From))
	}
	wantStoreUntouched(t, p)
}

// TestSlowBodiesFromManyAddresses: every connection keeps eight bodies
// under way, a byte at a time, opening one more stream every 10 ms, under
// the same budgets (server.max_buffered_bytes, max_connections requests
// in flight) as everyone. The bodies are cut at body_timeout (counted),
// the buffered bytes never pass the budget, HTTP/1.1 probes are served
// throughout and an HTTP/2 probe is served or refused at once with 503
// (docs/admission.md, "What an attacker can hold"), never left waiting.
func TestSlowBodiesFromManyAddresses(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"),
		serverLimits(0, "body_timeout: 2s"), chargesRoute))
	a := &h2attack.Attacker{Addr: p.addr, From: manyAddresses(), Flood: h2attack.SlowBody}
	rep := underAttack(t, p, a)
	logAttack(t, rep, a)
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
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	main := &h2attack.Attacker{Addr: p.addr, From: manyAddresses()}
	admin := &h2attack.Attacker{Addr: p.admin, From: manyAddresses()}
	rep := underAttack(t, p, main, admin)
	logAttack(t, rep, main, admin)
	if n, _ := served(rep.during, time.Minute); n == 0 {
		t.Errorf("no probe of %d served during the attack", len(rep.during))
	}
	if rep.ready == 0 {
		t.Errorf("the admin port's /readyz never answered during the attack")
	}
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
