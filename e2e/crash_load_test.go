package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestCrashUnderLoad: kill -9 during a storm of unique keys with
// sync_writes on, restart on the same data, and retry every key sent. A
// reservation is on disk before its request is forwarded, so no key is
// charged twice: every key the stub charged is replayed or in doubt, and
// every key answered 201 before the crash is replayed or in doubt.
func TestCrashUnderLoad(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	p := startProxy(t, cfg)

	const clients = 16
	var (
		stop    atomic.Bool
		ok201   atomic.Int64
		mu      sync.Mutex
		answers = map[string]result{} // every key sent, with its answer before the crash
		wg      sync.WaitGroup
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load() && i < 5000; i++ {
				order := fmt.Sprintf("ORD-L%d-%d", c, i)
				r := charge(p, order)
				mu.Lock()
				answers[order] = r
				mu.Unlock()
				if r.status == 201 {
					ok201.Add(1)
				}
			}
		}()
	}
	// Kill once the storm is well under way.
	eventually(t, "the storm gets answers", func() bool { return ok201.Load() >= 300 })
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait()
	stop.Store(true)
	wg.Wait()

	p2 := startProxy(t, cfg)
	charged := stubCharges(t, up.URL)
	type retry struct {
		order string
		r     result
	}
	orders := make(chan string)
	retries := make(chan retry)
	for range 8 {
		go func() {
			for o := range orders {
				retries <- retry{o, charge(p2, o)}
			}
		}()
	}
	go func() {
		for o := range answers {
			orders <- o
		}
		close(orders)
	}()
	var answered, replayed, inDoubt, fresh int
	for range len(answers) {
		rt := <-retries
		before := answers[rt.order]
		replay := rt.r.status == 201 && rt.r.header.Get("Idempotent-Replayed") == "true"
		doubt := rt.r.status == 409 && problemType(rt.r) == "outcome-in-doubt"
		switch {
		case replay:
			replayed++
		case doubt:
			inDoubt++
		case rt.r.status == 201:
			fresh++
		}
		if before.status == 201 {
			answered++
			if !replay && !doubt {
				t.Errorf("%s was answered 201 before the crash; retry = %d %s, want replayed or in doubt", rt.order, rt.r.status, rt.r.body)
			} else if replay && rt.r.body != before.body {
				t.Errorf("%s replayed %s, want the first answer %s", rt.order, rt.r.body, before.body)
			}
		}
		if charged[rt.order] > 0 && !replay && !doubt {
			t.Errorf("%s was charged before the crash; retry = %d %s, want replayed or in doubt", rt.order, rt.r.status, rt.r.body)
		}
	}
	after := stubCharges(t, up.URL)
	for order, n := range after {
		if n > 1 {
			t.Errorf("%s charged %d times", order, n)
		}
	}
	t.Logf("%d keys sent, %d answered 201 before the crash; retries: %d replayed, %d in doubt, %d forwarded (never reached the upstream)",
		len(answers), answered, replayed, inDoubt, fresh)
	if answered < 300 {
		t.Errorf("%d keys answered before the crash, want the storm's 300 or more", answered)
	}
}

// stubCharges returns the stub's charge count per order.
func stubCharges(t *testing.T, stubURL string) map[string]int {
	t.Helper()
	r := do("GET", stubURL+"/charges", "")
	var list struct {
		Items []struct {
			OrderID string `json:"orderId"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.body), &list); err != nil {
		t.Fatalf("charges: %v %v", err, r.err)
	}
	out := map[string]int{}
	for _, c := range list.Items {
		out[c.OrderID]++
	}
	return out
}

// TestKillLosesNoAnswer: an answer goes to the client only once its commit
// is where kill -9 cannot take it (Badger's memtable and the reservation
// log, in the page cache), so after kill -9 under load, with sync_writes,
// every key a client got a 201 for replays that 201 on retry: none comes
// back in doubt. Several kills, each during a storm of unique keys from
// many clients, so that commits are queued behind a batch's fdatasync
// when the process dies.
func TestKillLosesNoAnswer(t *testing.T) {
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	const (
		rounds  = 4
		clients = 32
	)
	p := startProxy(t, cfg)
	var total, inDoubt, lost int
	for round := range rounds {
		var (
			stop    atomic.Bool
			ok201   atomic.Int64
			mu      sync.Mutex
			answers = map[string]string{} // key answered 201 → its body
			wg      sync.WaitGroup
		)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load() && i < 2000; i++ {
					order := fmt.Sprintf("ORD-K%d-%d-%d", round, c, i)
					if r := charge(p, order); r.status == 201 {
						mu.Lock()
						answers[order] = r.body
						mu.Unlock()
						ok201.Add(1)
					}
				}
			}()
		}
		eventually(t, "the storm gets answers", func() bool { return ok201.Load() >= 400 })
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.wait()
		stop.Store(true)
		wg.Wait()

		p = startProxy(t, cfg)
		orders := make(chan string)
		type retry struct {
			order string
			r     result
		}
		retries := make(chan retry)
		for range 8 {
			go func() {
				for o := range orders {
					retries <- retry{o, charge(p, o)}
				}
			}()
		}
		go func() {
			for o := range answers {
				orders <- o
			}
			close(orders)
		}()
		for range len(answers) {
			rt := <-retries
			total++
			replay := rt.r.status == 201 && rt.r.header.Get("Idempotent-Replayed") == "true"
			switch {
			case replay && rt.r.body == answers[rt.order]:
			case rt.r.status == 409 && problemType(rt.r) == "outcome-in-doubt":
				inDoubt++
				t.Errorf("round %d: %s was answered 201 before kill -9; retry = 409 outcome-in-doubt, want its 201 replayed", round, rt.order)
			default:
				lost++
				t.Errorf("round %d: %s was answered 201 %s before kill -9; retry = %d %s, want that 201 replayed",
					round, rt.order, answers[rt.order], rt.r.status, rt.r.body)
			}
		}
	}
	for order, n := range stubCharges(t, up.URL) {
		if n > 1 {
			t.Errorf("%s charged %d times", order, n)
		}
	}
	t.Logf("%d kills; %d keys answered 201 before a kill: %d in doubt on retry, %d otherwise not replayed", rounds, total, inDoubt, lost)
	// What the operator is promised is what this test shows.
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	const promise = "A process crash (`kill -9`) loses nothing: an answer goes to its client only once its commit is in Badger"
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), promise) {
		t.Errorf("%s no longer says %q", operationsDoc, promise)
	}
}
