package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// manyAddresses returns 127.0.0.2 to 127.0.0.120: the 119 addresses of
// issue 36's attack.
func manyAddresses() []string {
	var from []string
	for i := 2; i <= 120; i++ {
		from = append(from, fmt.Sprintf("127.0.0.%d", i))
	}
	return from
}

// probeAnswer is one probe's charge: ok when answered 201 over the
// protocol asked for.
type probeAnswer struct {
	ok     bool
	took   time.Duration
	status int
	err    error
}

// attackReport is what underAttack saw.
type attackReport struct {
	during    []probeAnswer // the probes sent during the attack
	ready     int           // admin /readyz answers (any status) during the attack
	recovered time.Duration // from the attack's end to the first round served in full
	cpu       float64       // the proxy's CPU during the probes, in cores
	// From the proxy's metrics, over the probes' 8 s: the collector's CPU
	// time (the runtime's estimate), the CPU the process used, and the
	// Badger store's operations (their count, total time and how many
	// took 100 ms or more).
	gc, used, storeOps, storeTime, storeSlow float64
	measured                                 bool // the metrics were read before and after
}

// runtimeSample is what attackReport's measures are differences of.
type runtimeSample struct {
	gc, storeOps, storeTime, storeFast float64
	cpu                                time.Duration
}

// sampleRuntime reads the proxy's metrics for attackReport; ok is false
// when /metrics did not answer (an attack on the admin port can take the
// scrape's place), then the measures are not printed.
func sampleRuntime(p *proc) (s runtimeSample, ok bool) {
	var r result
	for i := 0; i < 5 && (i == 0 || r.err != nil || r.status != 200); i++ {
		r = do("GET", p.adminURL("/metrics"), "")
	}
	if r.err != nil || r.status != 200 {
		return s, false
	}
	sum := func(metric string, labels ...string) float64 {
		v, err := sumSamples(r.body, metric, labels...)
		ok = ok && err == nil
		return v
	}
	ok = true
	s = runtimeSample{
		gc:        sum("go_cpu_classes_gc_total_cpu_seconds_total"),
		storeOps:  sum("idemproxy_store_operation_duration_seconds_count", `store="badger"`),
		storeTime: sum("idemproxy_store_operation_duration_seconds_sum", `store="badger"`),
		storeFast: sum("idemproxy_store_operation_duration_seconds_bucket", `store="badger"`, `le="0.1"`),
		cpu:       procCPU(p.cmd.Process.Pid),
	}
	return s, ok
}

// underAttack runs each attacker's flood with one connection per address
// of its From (reconnecting), for 2 s, then sends a charge from
// 127.0.0.200 over HTTP/1.1 and h2c, at once, every 0.5 s for 8 s, and
// /readyz on the admin port from 127.0.0.201 after each round; then stops
// the attack and waits, at most 30 s, for a round to be served in full,
// and checks that four rounds in a row after it are. What it saw is
// returned, for the test to assert and print.
func underAttack(t *testing.T, p *proc, attackers ...*h2attack.Attacker) attackReport {
	t.Helper()
	h1, h2 := h2attack.ProbeClients("127.0.0.200")
	var seq atomic.Int64
	round := func() []probeAnswer {
		out := make([]probeAnswer, 2)
		done := make(chan struct{}, 2)
		for i, c := range []*http.Client{h1, h2} {
			go func() {
				defer func() { done <- struct{}{} }()
				start := time.Now()
				r, proto := doWith(c, "POST", p.url("/charges"), fmt.Sprintf(`{"orderId": "OVL-%d", "amount": 10}`, seq.Add(1)))
				out[i] = probeAnswer{ok: r.status == 201 && proto == i+1, took: time.Since(start), status: r.status, err: r.err}
			}()
		}
		<-done
		<-done
		return out
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var running []func()
	for _, a := range attackers {
		running = append(running, a.Run(ctx, len(a.From)).Wait)
	}
	stop := func() {
		cancel()
		for _, wait := range running {
			wait()
		}
	}
	defer stop()
	// The attack under way: every attacker's connections open (the
	// variants reset no streams, so the resets are not what is waited
	// for), then a second of it.
	eventually(t, "the attack under way", func() bool {
		for _, a := range attackers {
			if a.Conns.Load() < int64(len(a.From)) {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second)
	var rep attackReport
	s0, ok0 := sampleRuntime(p)
	t0 := time.Now()
	for time.Since(t0) < 8*time.Second {
		start := time.Now()
		rep.during = append(rep.during, round()...)
		if st, _, err := h2attack.GetFrom(t, "127.0.0.201", p.admin, "/readyz"); st != 0 && err == nil {
			rep.ready++
		}
		time.Sleep(max(500*time.Millisecond-time.Since(start), 0))
	}
	s1, ok1 := sampleRuntime(p)
	rep.used = (s1.cpu - s0.cpu).Seconds()
	rep.cpu = rep.used / time.Since(t0).Seconds()
	if rep.measured = ok0 && ok1; rep.measured {
		rep.gc = s1.gc - s0.gc
		rep.storeOps, rep.storeTime = s1.storeOps-s0.storeOps, s1.storeTime-s0.storeTime
		rep.storeSlow = rep.storeOps - (s1.storeFast - s0.storeFast)
	}
	stop()
	ended := time.Now()

	// Once the attack ends, every probe is served: the first round that
	// is, within a generous deadline, then four rounds in a row.
	for deadline := ended.Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := round()
		if r[0].ok && r[1].ok {
			rep.recovered = time.Since(ended)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probes still fail 30 s after the attack ended: %+v\n%s", r, tail(p.log.String(), 40))
		}
	}
	for i := range 4 {
		for j, r := range round() {
			if !r.ok {
				t.Errorf("probe round %d (%s) after the attack was not served: %+v", i, []string{"HTTP/1.1", "h2c"}[j], r)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return rep
}

// served returns how many of the answers were served, and how many of
// those within d.
func served(as []probeAnswer, d time.Duration) (n, fast int) {
	for _, r := range as {
		if r.ok {
			n++
			if r.took <= d {
				fast++
			}
		}
	}
	return n, fast
}

// logAttack prints what an attack did and what the probes saw.
func logAttack(t *testing.T, rep attackReport, attackers ...*h2attack.Attacker) {
	t.Helper()
	for _, a := range attackers {
		t.Logf("attack on %s: %d streams, %d PING/CONTINUATION frames (written) on %d connections from %d addresses",
			a.Addr, a.Streams.Load(), a.Frames.Load(), a.Conns.Load(), len(a.From))
	}
	n, fast := served(rep.during, time.Second)
	var took []time.Duration
	for _, r := range rep.during {
		took = append(took, r.took)
	}
	t.Logf("during the attack (proxy CPU %.0f%% of a core): %d of %d probes served, %d of them within 1 s (%.0f%%; the issue's target is 90%%); latencies %s",
		rep.cpu*100, n, len(rep.during), fast, 100*float64(fast)/float64(len(rep.during)), summary(took))
	t.Logf("admin /readyz answered %d times during the attack; probes served again %v after it ended (the issue's target: within 2 s)",
		rep.ready, rep.recovered.Round(time.Millisecond))
	if !rep.measured {
		t.Logf("the proxy's /metrics did not answer before or after the probes: no measures")
		return
	}
	gcShare, storeMean := 0.0, 0.0
	if rep.used > 0 {
		gcShare = rep.gc / rep.used
	}
	if rep.storeOps > 0 {
		storeMean = rep.storeTime / rep.storeOps
	}
	t.Logf("during the probes: the collector %.2f s of the %.2f s of CPU the proxy used (%.0f%%); Badger: %v operations, mean %.1f ms, %v of them 100 ms or more",
		rep.gc, rep.used, 100*gcShare, rep.storeOps, 1000*storeMean, rep.storeSlow)
}

// floodFromManyAddresses starts the stub and the proxy (server: section
// server, "" for the defaults) and runs attack (its Flood and settings;
// Addr and From are set here) from the 119 addresses of manyAddresses
// through underAttack, with onAdmin on the proxy's admin port at the same
// time. It prints what was seen and fails the test unless probes were
// served during the attack and the admin port's /readyz answered.
func floodFromManyAddresses(t *testing.T, server string, attack *h2attack.Attacker, onAdmin ...*h2attack.Attacker) (*proc, attackReport) {
	t.Helper()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), server, chargesRoute))
	attack.Addr, attack.From = p.addr, manyAddresses()
	attackers := []*h2attack.Attacker{attack}
	for _, a := range onAdmin {
		a.Addr = p.admin
		attackers = append(attackers, a)
	}
	rep := underAttack(t, p, attackers...)
	logAttack(t, rep, attackers...)
	if n, _ := served(rep.during, time.Minute); n == 0 {
		t.Errorf("no probe of %d served during the attack", len(rep.during))
	}
	if rep.ready == 0 {
		t.Errorf("the admin port's /readyz never answered during the attack")
	}
	return p, rep
}

// wantStoreUntouched fails the test if any request met a store failure,
// any key was marked in doubt (no attack stream is ever forwarded), or
// the log says the store failed or a key will be in doubt.
func wantStoreUntouched(t *testing.T, p *proc) {
	t.Helper()
	if n := metricSum(t, p, "idemproxy_requests_total", `outcome="store_error"`); n != 0 {
		t.Errorf("%v requests met a store failure during the attack, want 0", n)
	}
	if n := metricSum(t, p, "idemproxy_requests_total", `outcome="in_doubt"`); n != 0 {
		t.Errorf("%v keys marked in doubt, want 0: no attack stream was forwarded", n)
	}
	for _, msg := range []string{"store failed", "store failed to settle a key; it will be in doubt when its lease ends"} {
		if l := p.log.logLines(msg); len(l) > 0 {
			t.Errorf("the log says %q %d times: %v", msg, len(l), l[0])
		}
	}
}

// TestRapidResetFromManyAddresses is issue 36's attack with the real
// binary and default settings: 119 reconnecting rapid-reset connections,
// one from each of 127.0.0.2 to 127.0.0.120, each address under its own
// server.max_client_resets_per_second for seconds, so only the bounds over
// all clients meet it. A charge from another address goes over HTTP/1.1
// and h2c every 0.5 s. What does not depend on the machine's pace is
// asserted: probes are served during the attack, every probe is served
// once it ends (within a generous deadline), the store never fails, and no
// key is in doubt (the attack's streams were never forwarded). The share
// served within 1 s during the attack, the target, is printed.
func TestRapidResetFromManyAddresses(t *testing.T) {
	p, _ := floodFromManyAddresses(t, "", &h2attack.Attacker{})
	closed := metricSum(t, p, "idemproxy_overload_actions_total", `action="close_connection"`)
	t.Logf("overload: %v connections closed by the bounds over all clients; per-client refusals for resets %v",
		closed, scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="resets"}`))
	if closed == 0 {
		t.Errorf("idemproxy_overload_actions_total{action=close_connection} = 0: the bounds over all clients never acted")
	}
	wantStoreUntouched(t, p)
}
