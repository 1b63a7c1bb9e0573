package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// pipelineSizes records the size of every pipeline the client sends.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (h *pipelineSizes) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *pipelineSizes) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}
func (h *pipelineSizes) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.mu.Lock()
		h.sizes = append(h.sizes, len(cmds))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestPipelinedCallsShareARoundTrip: calls queued while Redis is busy are
// sent as one pipeline, each gets its own reply (one script's error fails
// only its caller), and scripts Redis has forgotten (SCRIPT FLUSH) are
// loaded again.
func TestPipelinedCallsShareARoundTrip(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := New(Options{Addrs: []string{srv.Addr()}, KeyPrefix: "idemproxy:", DialTimeout: time.Second, OpTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hook := &pipelineSizes{}
	s.client.AddHook(hook)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Pause Redis. A first call, alone, is sent by its caller; a second
	// is taken by the pipeliner and sent alone too; both wait on the wire.
	// The rest queue behind them, then Redis is unpaused: they go in one
	// pipeline.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	errs := make(chan error, n+3)
	for i, key := range []string{"first", "second"} {
		go func() {
			_, err := s.Reserve(ctx, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			errs <- err
		}()
		for deadline := time.Now().Add(5 * time.Second); s.pipe.calls.Load() < int64(i+1) || s.pipe.q.Len() > 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the %s call was not sent", key)
			}
		}
		time.Sleep(50 * time.Millisecond) // it is on the wire, waiting for the pause to end
	}
	boom := goredis.NewScript(`return redis.error_reply('boom')`)
	for i := range n {
		go func() {
			_, err := s.Reserve(ctx, fmt.Sprintf("k%d", i), store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
			errs <- err
		}()
	}
	go func() {
		errs <- fmt.Errorf("bad script: %w", s.pipe.run(ctx, false, boom, []string{"x"}).Err())
	}()
	for deadline := time.Now().Add(5 * time.Second); s.pipe.q.Len() < n+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", s.pipe.q.Len(), n+1)
		}
	}
	if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	var failed int
	for range n + 3 {
		err := <-errs
		switch {
		case err == nil:
		case strings.HasPrefix(err.Error(), "bad script: ") && strings.Contains(err.Error(), "boom"):
			failed++
		default:
			t.Errorf("call failed: %v", err)
		}
	}
	if failed != 1 {
		t.Errorf("%d calls failed with the bad script's error, want exactly its own", failed)
	}
	for i := range n {
		rec, err := s.Get(ctx, fmt.Sprintf("k%d", i))
		if err != nil || rec == nil || rec.State != store.StateInFlight {
			t.Errorf("k%d = %+v %v, want reserved", i, rec, err)
		}
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	var biggest int
	for _, sz := range hook.sizes {
		biggest = max(biggest, sz)
	}
	if biggest != n+1 {
		t.Errorf("pipelines %v, want one of all %d queued calls", hook.sizes, n+1)
	}
}
