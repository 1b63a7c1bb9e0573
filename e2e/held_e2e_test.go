package e2e

// Attacks of issue 25's hostile pass that the proxy already held, pinned
// with the real binary so that they keep holding: a Redis that stops
// answering (DEBUG SLEEP) and 200 reloads under load.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
)

// TestRedisDebugSleepFailsClosed: while Redis sleeps (DEBUG SLEEP, every
// command queued behind it), charges are refused with 503, never
// forwarded; when it wakes, the reservations it applied late for requests
// that were answered 503 do not keep their keys: each order is charged
// once, and an order charged before the sleep is replayed.
func TestRedisDebugSleepFailsClosed(t *testing.T) {
	t.Parallel()
	rd := redistest.Start(t, "--enable-debug-command", "yes")
	up := startStub(t)
	p := startProxy(t, writeRedisConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, []string{rd.Addr()}, chargesRoute))
	first := charge(p, "ORD-Z1")
	if first.status != 201 {
		t.Fatalf("ORD-Z1 = %d %s %v, want 201", first.status, first.body, first.err)
	}

	// The client gives up on DEBUG SLEEP's reply before the server wakes:
	// its error says nothing; PING answers once the sleep is over.
	go rd.Do("DEBUG", "SLEEP", "6")
	time.Sleep(300 * time.Millisecond) // the sleep has begun
	for _, order := range []string{"ORD-Z1", "ORD-Z2", "ORD-Z2", "ORD-Z3"} {
		r := charge(p, order)
		if r.status != 503 || problemType(r) != "store-unavailable" {
			t.Errorf("%s while Redis sleeps = %d %s %v, want 503 store-unavailable", order, r.status, r.body, r.err)
		}
	}
	eventually(t, "Redis wakes", func() bool { pong, err := rd.Do("PING"); return err == nil && pong == "PONG" })
	for order, want := range map[string]int{"ORD-Z1": 1, "ORD-Z2": 0, "ORD-Z3": 0} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charged %d times while Redis slept, want %d", order, got, want)
		}
	}

	if r := replayed(t, p, "ORD-Z1"); r.body != first.body {
		t.Errorf("ORD-Z1 after the sleep replays %q, want %q", r.body, first.body)
	}
	for _, order := range []string{"ORD-Z2", "ORD-Z3"} {
		var r result
		eventually(t, order+" is charged after Redis woke", func() bool {
			r = charge(p, order)
			return r.status == 201
		})
		replayed(t, p, order)
		if got := chargeCount(t, up.URL, order); got != 1 {
			t.Errorf("%s charged %d times, want 1", order, got)
		}
	}
}

// TestReloadsUnderLoad: 200 reloads (each rewriting a setting a reload
// applies; through the admin API, whose answer says the reload is done,
// and a SIGHUP every tenth) while clients charge orders, each twice: every
// reload applies, every order is charged once, and no client gets an
// error.
func TestReloadsUnderLoad(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	data := filepath.Join(dir, "data")
	routes := func(i int) string {
		return fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    concurrent: wait
    wait_timeout: %ds
    upstream_timeout: 10s
    lease: 15s
`, 5+i%2)
	}
	writeConfig(t, path, up.URL, data, "", routes(0))
	const token = "reloads-under-load"
	p := startProxy(t, path, "IDEMPROXY_ADMIN_TOKEN="+token)

	const reloads, clients = 200, 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var orders []string
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				order := fmt.Sprintf("ORD-R%d-%d", c, i)
				for try := range 2 {
					r := charge(p, order)
					if r.status != 201 || (try == 1 && r.header.Get("Idempotent-Replayed") != "true") {
						t.Errorf("%s try %d during reloads = %d %s %v, want 201 (replayed the second time)", order, try, r.status, r.body, r.err)
					}
				}
				mu.Lock()
				orders = append(orders, order)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // load, not a flood: the reloads are the point
			}
		}()
	}
	for i := 1; i <= reloads; i++ {
		writeConfig(t, path, up.URL, data, "", routes(i))
		if i%10 == 0 {
			p.signal(syscall.SIGHUP)
			want := i
			eventually(t, fmt.Sprintf("reload %d (SIGHUP) is applied", i), func() bool {
				return len(p.log.logLines("configuration reloaded")) >= want
			})
			continue
		}
		if r := do("POST", p.adminURL("/-/reload"), "", "Authorization", "Bearer "+token); r.status != 200 {
			t.Fatalf("reload %d = %d %s %v", i, r.status, r.body, r.err)
		}
	}
	close(stop)
	wg.Wait()
	if n := len(p.log.logLines("configuration reloaded")); n != reloads {
		t.Errorf("%d reloads logged, want %d", n, reloads)
	}

	if n := len(p.log.logLines("configuration reload failed; the running configuration is kept")); n != 0 {
		t.Errorf("%d reloads failed", n)
	}
	if len(orders) < clients {
		t.Fatalf("only %d orders were charged during the reloads", len(orders))
	}
	charged := map[string]int{}
	for _, c := range statement(t, up.URL) {
		charged[c]++
	}
	for _, order := range orders {
		if charged[order] != 1 {
			t.Errorf("%s charged %d times, want 1", order, charged[order])
		}
	}
	t.Logf("%d reloads, %d orders sent twice each", reloads, len(orders))
}

// statement returns the order ID of every charge the stub at stubURL
// recorded.
func statement(t *testing.T, stubURL string) []string {
	t.Helper()
	r := do("GET", stubURL+"/charges", "")
	if r.err != nil || r.status != 200 {
		t.Fatalf("GET /charges = %d %v", r.status, r.err)
	}
	var st struct{ Items []struct{ OrderID string } }
	if err := json.Unmarshal([]byte(r.body), &st); err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(st.Items))
	for i, c := range st.Items {
		out[i] = c.OrderID
	}
	return out
}
