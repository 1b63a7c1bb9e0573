package settle

import (
	"context"
	"errors"
	"fmt"
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
	if got := gathered(t, reg, "idemproxy_settle_retries_waiting", ""); got != 3 {
		t.Errorf("idemproxy_settle_retries_waiting = %v, want 3", got)
	}
	if got := gathered(t, reg, "idemproxy_settle_left_to_lease_total", "retry_cap"); got != 2 {
		t.Errorf(`idemproxy_settle_left_to_lease_total{reason="retry_cap"} = %v, want 2`, got)
	}
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	s.Close(expired)
	if got := gathered(t, reg, "idemproxy_settle_retries_waiting", ""); got != 0 {
		t.Errorf("idemproxy_settle_retries_waiting after Close = %v, want 0", got)
	}
	if got := gathered(t, reg, "idemproxy_settle_left_to_lease_total", "shutdown"); got != 3 {
		t.Errorf(`idemproxy_settle_left_to_lease_total{reason="shutdown"} = %v, want 3`, got)
	}
}

// gathered is the value of the metric name in reg, of the series whose
// reason label is reason ("" for a metric without labels).
func gathered(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			r := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					r = l.GetValue()
				}
			}
			if r != reason {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s{reason=%q} is not registered", name, reason)
	return 0
}
