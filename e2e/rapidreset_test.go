package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// probe sends n charges, one at a time, from each client and returns
// their latencies; it fails the test for any answer but 201.
func probe(t *testing.T, p *proc, name string, c *http.Client, n int, wantProto int) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for i := range n {
		start := time.Now()
		r, proto := doWith(c, "POST", p.url("/charges"), fmt.Sprintf(`{"orderId": "PROBE-%s-%d", "amount": 10}`, name, i))
		d := time.Since(start)
		lat = append(lat, d)
		if r.status != 201 || proto != wantProto {
			t.Errorf("%s probe %d during the attack = %d HTTP/%d %q %v after %v, want 201 over HTTP/%d", name, i, r.status, proto, r.body, r.err, d, wantProto)
		} else if d > 10*time.Second {
			t.Errorf("%s probe %d took %v, want well under 10s", name, i, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return lat
}

// attackUnderWay waits until a's n connections are open and the proxy
// counts their resets by the thousand: the probes then meet the attack,
// whatever the machine's pace.
func attackUnderWay(t *testing.T, p *proc, a *h2attack.Attacker, n int) {
	t.Helper()
	eventually(t, "the attack under way", func() bool {
		return a.Conns.Load() >= int64(n) && scrapeValue(t, p, "idemproxy_client_stream_resets_total") >= 1000
	})
}

func summary(lat []time.Duration) string {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var parts []string
	for _, d := range s {
		parts = append(parts, d.Round(100*time.Microsecond).String())
	}
	return strings.Join(parts, " ")
}

// TestRapidResetDoesNotLockOutOtherClients is the attack: 24
// reconnecting HTTP/2 connections from one address, each opening streams
// and resetting them at once. Every probe from another address, over
// HTTP/1.1 and HTTP/2, gets its real answer.
func TestRapidResetDoesNotLockOutOtherClients(t *testing.T) {
	var spread []string
	for i := range 24 {
		spread = append(spread, fmt.Sprintf("127.0.0.%d", 10+i))
	}
	for _, tc := range []struct {
		name      string
		from      []string
		endStream bool
		pause     time.Duration
		pad       int
	}{
		{"streams reset while their body is awaited", []string{"127.0.0.1"}, false, 0, 0},
		{"streams reset after END_STREAM", []string{"127.0.0.1"}, true, 0, 0},
		// The variants an attacker tries next: resets spread out in time
		// (each connection a stream every 2 ms), and the connections
		// spread over 24 addresses, one each.
		{"slow resets", []string{"127.0.0.1"}, false, 2 * time.Millisecond, 0},
		{"one connection from each of 24 addresses", spread, false, 0, 0},
		// Resets padded with served requests, one or three per reset, so
		// that they are at most half the client's streams: not refused
		// for its resets, but each reset costs it a request the upstream
		// answers, and its requests stay within max_requests_per_client.
		{"one served request per reset", []string{"127.0.0.1"}, false, 0, 1},
		{"three served requests per reset", []string{"127.0.0.1"}, false, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
			h1, h2 := h2attack.ProbeClients("127.0.0.2")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			a := &h2attack.Attacker{Addr: p.addr, From: tc.from, EndStream: tc.endStream, Pause: tc.pause, Pad: tc.pad}
			wg := a.Run(ctx, 24)
			defer wg.Wait()
			defer cancel()
			attackUnderWay(t, p, a, 24)
			cpu0 := procCPU(p.cmd.Process.Pid)
			t0 := time.Now()
			l1 := probe(t, p, "h1", h1, 5, 1)
			l2 := probe(t, p, "h2", h2, 5, 2)
			cpu := (procCPU(p.cmd.Process.Pid) - cpu0).Seconds() / time.Since(t0).Seconds()
			t.Logf("attack: %d streams opened and reset (written) on %d connections; proxy CPU during the probes %.0f%% of a core", a.Streams.Load(), a.Conns.Load(), cpu*100)
			t.Logf("HTTP/1.1 probe latencies: %s", summary(l1))
			t.Logf("HTTP/2 probe latencies: %s", summary(l2))
			if got := scrapeValue(t, p, "idemproxy_client_stream_resets_total"); got == 0 {
				t.Errorf("idemproxy_client_stream_resets_total = 0 after the attack, want the resets counted")
			}
			t.Logf("refused: streams %v, resets %v, shed %v; global %v",
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="streams"}`),
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="resets"}`),
				scrapeValue(t, p, `idemproxy_client_streams_refused_total{reason="shed"}`),
				scrapeValue(t, p, "idemproxy_http2_streams_refused_total"))
		})
	}
}
