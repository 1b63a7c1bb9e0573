package settle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestClosedGroupLetsGoOfItsParent: a Group's context is a child of its
// parent's, which holds it until it is cancelled. Groups come and go for
// the program's whole life (one per Badger store a Guard reopens), so a
// closed Group must cancel its context, also when its Close found no job
// to cut off, or every reopen leaves one behind in the parent.
func TestClosedGroupLetsGoOfItsParent(t *testing.T) {
	s := New(nil)
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"waited for", context.Background()},
		{"past its deadline", expired},
	} {
		for range 100 { // Close picks at random when both are ready
			g := s.Group()
			g.Close(tc.ctx)
			if g.ctx.Err() == nil {
				t.Fatalf("%s: the closed Group's context is still live in its parent", tc.name)
			}
		}
	}
}

// TestRetriesAreBounded: no more than the bound of failed settles wait to
// retry; one past it is left to its lease at once (its Done gets the
// error, nothing retries it), and the metrics say how many wait and how
// many were left, by reason.
func TestRetriesAreBounded(t *testing.T) {
	s := New(nil)
	s.counts.limit = 3
	reg := prometheus.NewRegistry()
	RegisterMetrics(reg, s)
	failed := errors.New("store stalled")
	var attempts atomic.Int64
	done := make(chan error, 10)
	g := s.Group() // a store's Group and the proxy's share the bound
	for i := range 5 {
		owner := s
		if i%2 == 1 {
			owner = g
		}
		j := Job{Key: fmt.Sprint("pay/-/k", i), Operation: "commit", Until: time.Now().Add(time.Hour),
			Attempt: func(context.Context) error { attempts.Add(1); return failed },
			Done:    func(err error) { done <- err }}
		retrying := owner.Settle(j, failed)
		if want := i < 3; retrying != want {
			t.Errorf("settle %d: retrying = %v, want %v (bound 3)", i, retrying, want)
		}
	}
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, failed) {
				t.Errorf("Done of a settle past the bound = %v, want its error", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a settle past the bound was not ended at once")
		}
	}
	checkMetrics(t, reg, 3, 2, 0)
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	s.Close(expired)
	if s.Settle(Job{Key: "pay/-/late", Operation: "commit", Until: time.Now().Add(time.Hour)}, failed) {
		t.Error("a settle after Close is retried")
	}
	checkMetrics(t, reg, 0, 2, 4) // the three retrying, and the one after Close
}

// checkMetrics checks the settle counts RegisterMetrics exports from reg:
// waiting retries, and settles left to their leases past the bound and at
// shutdown (none whose lease ended).
func checkMetrics(t *testing.T, reg *prometheus.Registry, waiting, capped, shutdown int) {
	t.Helper()
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"idemproxy_settle_retries_waiting": float64(waiting),
		"idemproxy_settle_left_to_lease_total/retry_cap": float64(capped), "idemproxy_settle_left_to_lease_total/shutdown": float64(shutdown),
		"idemproxy_settle_left_to_lease_total/lease_ended": 0}
	if !maps.Equal(got, want) {
		t.Errorf("metrics = %v, want %v", got, want)
	}
}
