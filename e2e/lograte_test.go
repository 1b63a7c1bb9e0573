package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/lograte"
)

// TestStoreDownLogsBounded: with the store down, every protected request
// is refused and its failure logged; the binary writes the error at a
// bounded rate, and the lines plus the suppressed counts (reported when
// each interval ends, the last one at shutdown) add up to the requests,
// while the access log keeps exactly one line a request.
func TestStoreDownLogsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there: every store operation fails at once
	up := startStub(t)
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin: {listen: 127.0.0.1:0}
store:
  redis: {addrs: [%q], dial_timeout: 100ms, op_timeout: 100ms}
routes:
%s`, up.URL, dead, chargesRoute)), 0o600)
	p := startProxy(t, cfg)

	const requests, workers = 400, 8
	start := time.Now()
	var next, refused atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= requests; i = next.Add(1) {
				if r := do("POST", p.url("/charges"), fmt.Sprintf(`{"orderId": "ORD-%d", "amount": 1}`, i)); r.status == 503 {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, p.log)
	}
	if refused.Load() != requests {
		t.Fatalf("%d of %d requests refused 503, want all: the store must be down for this test", refused.Load(), requests)
	}

	if got := len(p.log.logLines("request")); got != requests {
		t.Errorf("access log lines = %d, want %d: one a request, never limited", got, requests)
	}
	var logged, suppressed int
	for _, l := range p.log.logLines("store failed") {
		if n, ok := l["suppressed"].(float64); ok {
			suppressed += int(n)
		} else {
			logged++
		}
	}
	// At most a burst in each interval the requests spanned.
	windows := int(elapsed/lograte.DefaultInterval) + 1
	if max := lograte.DefaultBurst * windows; logged > max {
		t.Errorf("%d store failed lines for %d requests in %s, want at most %d", logged, requests, elapsed.Round(time.Millisecond), max)
	}
	if logged+suppressed != requests {
		t.Errorf("%d store failed lines + %d suppressed = %d, want %d: every failure is accounted for",
			logged, suppressed, logged+suppressed, requests)
	}
}
