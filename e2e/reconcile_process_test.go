package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReconcileAfterCrash: the proxy is killed while a charge is at the
// upstream; started again on the same Badger directory, its background
// reconciler finds the orphaned reservation, asks the stub after the grace,
// and the retry gets the charge replayed instead of charging again. The
// process then stops cleanly on SIGTERM.
func TestReconcileAfterCrash(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	route := `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 1s
    lease: 1500ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 2s, interval: 500ms}
`
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", route)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := do("POST", up.URL+"/faults", `{"fault": "delay", "delay": "900ms"}`); r.status != http.StatusCreated {
		t.Fatalf("queue fault: %v", r)
	}
	go do("POST", p.url("/charges"), `{"orderId": "CR-1", "amount": 5}`)
	eventually(t, "the stub charged CR-1", func() bool { return chargeCount(t, up.URL, "CR-1") == 1 })
	p.signal(syscall.SIGKILL)
	p.wait()

	p = startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := do("POST", p.url("/charges"), `{"orderId": "CR-1", "amount": 5}`); r.status != http.StatusConflict {
		t.Errorf("retry right after the restart = %d %s, want 409 (in doubt, within the grace)", r.status, r.body)
	}
	var r result
	eventually(t, "the retry is replayed", func() bool {
		r = do("POST", p.url("/charges"), `{"orderId": "CR-1", "amount": 5}`)
		return r.status == http.StatusCreated // reconcile.applied_status' default, the charge's own
	})
	if r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotent-Reconciled") != "true" || !strings.Contains(r.body, `"orderId":"CR-1"`) {
		t.Errorf("retry = %d %v %s, want the lookup's charge, replayed and reconciled", r.status, r.header, r.body)
	}
	if n := chargeCount(t, up.URL, "CR-1"); n != 1 {
		t.Errorf("charges of CR-1 = %d, want 1", n)
	}
	m := do("GET", p.adminURL("/metrics"), "")
	if got, _ := metricValue(m.body, `idemproxy_reconciliations_total{result="applied",route="charges"}`); got != "1" {
		t.Errorf("reconciliations applied = %q, want 1", got)
	}
	k := do("GET", p.adminURL("/v1/keys/charges/CR-1"), "", "Authorization", "Bearer s3cret")
	if !strings.Contains(k.body, `"reconciled": true`) {
		t.Errorf("admin GET = %s, want reconciled: true", k.body)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
	}
	if len(p.log.logLines("idemproxy stopped")) != 1 {
		t.Errorf("no clean stop in the log:\n%s", p.log)
	}
}
