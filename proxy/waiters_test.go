package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// countingStore is a real Badger store that counts its reads.
type countingStore struct {
	*badger.Store
	gets atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, key string) (*store.Record, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

// TestWaitersOnOneKeyShareOnePoll: many duplicates waiting (concurrent:
// wait) on one key cost the store one read per poll interval between
// them, not one each, whether the request holding the key is this
// replica's (its settle wakes them) or another's sharing the store (only
// the poll sees it settle); when the holder settles, every waiter gets
// its answer replayed, and the upstream was asked once.
func TestWaitersOnOneKeyShareOnePoll(t *testing.T) {
	t.Parallel()
	for _, holder := range []string{"this replica", "another replica"} {
		t.Run(holder, func(t *testing.T) { testWaitersShareOnePoll(t, holder == "another replica") })
	}
}

func testWaitersShareOnePoll(t *testing.T, otherReplica bool) {
	const waiters = 20
	var upstream atomic.Int64
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		<-release
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("charged once"))
	}))
	defer up.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	st := &countingStore{}
	e := &proxytest.Env{T: t, WrapStore: func(bs *badger.Store) store.Store { st.Store = bs; return st }}
	const routes = `  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    concurrent: wait
    wait_timeout: 60s
    lease: 90s
    upstream_timeout: 80s
`
	e.Start(up.URL, routes)
	send := func() proxytest.Answer {
		return e.Do("POST", "/charges", `{"amount":5}`, "Idempotency-Key", "K-WAIT")
	}
	holder := e
	if otherReplica { // a second proxy on the same store holds the key
		holder = &proxytest.Env{T: t, WrapStore: func(*badger.Store) store.Store { return st.Store }}
		holder.Start(up.URL, routes)
	}

	first := make(chan proxytest.Answer, 1)
	go func() { first <- holder.Do("POST", "/charges", `{"amount":5}`, "Idempotency-Key", "K-WAIT") }()
	for deadline := time.Now().Add(30 * time.Second); upstream.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first request never reached the upstream")
		}
	}
	answers := make(chan proxytest.Answer, waiters)
	for range waiters {
		go func() { answers <- send() }()
	}
	// Every waiter reads the record once through its reservation; then
	// only polls read it. Let them all arrive, then count the reads of a
	// window: one poll per 100 ms at most between them all (about 200 with
	// a poll each).
	time.Sleep(500 * time.Millisecond)
	const window = time.Second
	before := st.gets.Load()
	time.Sleep(window)
	reads := st.gets.Load() - before
	if limit := int64(2*window/(100*time.Millisecond)) + 5; reads > limit {
		t.Errorf("%d waiters on one key read the store %d times in %v, want at most %d (one poll between them)", waiters, reads, window, limit)
	}
	if reads == 0 {
		t.Errorf("no read in %v: the waiters do not poll (a holder on another replica would never be seen)", window)
	}
	unblock()
	if a := <-first; a.Status != http.StatusCreated {
		t.Fatalf("the first request = %d %s, want 201", a.Status, a.Body)
	}
	for range waiters {
		select {
		case a := <-answers:
			if a.Status != http.StatusCreated || !a.Replayed() || string(a.Body) != "charged once" {
				t.Errorf("a waiter got %d (replayed %v) %q, want the 201 replayed", a.Status, a.Replayed(), a.Body)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a waiter was not answered in 60 s")
		}
	}
	if n := upstream.Load(); n != 1 {
		t.Errorf("the upstream was asked %d times, want 1", n)
	}
}
