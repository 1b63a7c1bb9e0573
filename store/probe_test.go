package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

func openBadger(t *testing.T) *badger.Store {
	t.Helper()
	s, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestWriteProbe: the verdict is nil before the first probe ends (no
// verdict yet), nil after a probe that wrote, the error of one that
// failed; the probe leaves no record behind; Observe reports a real
// reservation's failure at once (not its caller's cancellation, nor an
// origin too long) and a success clears it, and keeps a ReconcileStore
// one.
func TestWriteProbe(t *testing.T) {
	ctx := context.Background()
	s := openBadger(t)
	p := store.NewWriteProbe(s, store.ProbeOptions{})
	if p.Ready() || p.Err() != nil {
		t.Fatalf("before the first probe: Ready %v, Err %v; want false, nil", p.Ready(), p.Err())
	}
	for range 3 {
		if err := p.Probe(ctx); err != nil {
			t.Fatalf("probe of an open store: %v", err)
		}
	}
	if !p.Ready() || p.Err() != nil || p.Failures() != 0 {
		t.Errorf("after probes that wrote: Ready %v, Err %v, Failures %d", p.Ready(), p.Err(), p.Failures())
	}
	if recs, _, err := s.List(ctx, store.ListQuery{Prefix: store.ProbeRoute + "/", Limit: 10}); err != nil || len(recs) != 0 {
		t.Errorf("records the probes left: %v, %v; want none", recs, err)
	}
	if _, ok := p.Observe(s).(store.ReconcileStore); !ok {
		t.Errorf("Observe of a ReconcileStore is not one")
	}

	closed := openBadger(t)
	closed.Close()
	obs := p.Observe(closed)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := obs.Reserve(canceled, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Minute}); err == nil {
		t.Fatal("Reserve with a canceled context succeeded")
	}
	if p.Err() != nil {
		t.Errorf("a caller's cancellation set the verdict: %v", p.Err())
	}
	long := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Minute, Origin: strings.Repeat("a", store.MaxOriginLen+1)}
	if _, err := p.Observe(s).Reserve(ctx, "r/-/long", long); !errors.Is(err, store.ErrOriginTooLong) {
		t.Fatalf("Reserve with an origin too long = %v, want ErrOriginTooLong", err)
	}
	if p.Err() != nil {
		t.Errorf("a caller's origin too long set the verdict: %v", p.Err())
	}
	if _, err := obs.Reserve(ctx, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Minute}); err == nil {
		t.Fatal("Reserve on a closed store succeeded")
	}
	if err := p.Err(); err == nil || !strings.HasPrefix(err.Error(), "writes fail: a reservation failed: ") {
		t.Errorf("Err after a failed reservation = %v, want writes fail: a reservation failed: …", err)
	}
	if rec, err := p.Observe(s).Reserve(ctx, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Minute}); err != nil || rec != nil {
		t.Fatalf("Reserve on the open store = %v, %v", rec, err)
	}
	if p.Err() != nil {
		t.Errorf("Err after a reservation that succeeded = %v, want nil", p.Err())
	}

	failing := store.NewWriteProbe(closed, store.ProbeOptions{})
	if err := failing.Probe(ctx); err == nil || failing.Err() == nil || failing.Failures() != 1 {
		t.Errorf("probe of a closed store: %v, Err %v, Failures %d; want an error counted", err, failing.Err(), failing.Failures())
	}
}

// gatedStore holds a reservation of key slow until release is closed,
// and fails every reservation of key fail.
type gatedStore struct {
	store.Store
	entered, release chan struct{}
}

func (g gatedStore) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	switch key {
	case "r/-/slow":
		close(g.entered)
		<-g.release
	case "r/-/fail":
		return nil, errors.New("badger: free disk space below the floor")
	}
	return g.Store.Reserve(ctx, key, res)
}

// TestWriteProbeKeepsTheLatestWrite: a reservation that started before a
// failing one but reports after it (it won its place just before the
// disk filled) does not turn the verdict back to ready: the failure is
// the newer news. (TestDiskFillsInOneBurst found /readyz ready on a
// full disk that way.)
func TestWriteProbeKeepsTheLatestWrite(t *testing.T) {
	ctx := context.Background()
	p := store.NewWriteProbe(openBadger(t), store.ProbeOptions{})
	if err := p.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	g := gatedStore{Store: openBadger(t), entered: make(chan struct{}), release: make(chan struct{})}
	obs := p.Observe(g)
	res := store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Minute}
	done := make(chan error)
	go func() { _, err := obs.Reserve(ctx, "r/-/slow", res); done <- err }()
	<-g.entered
	if _, err := obs.Reserve(ctx, "r/-/fail", res); err == nil {
		t.Fatal("the failing reservation succeeded")
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatalf("the slow reservation: %v", err)
	}
	if p.Err() == nil {
		t.Fatal("an older reservation's success overrode a newer one's failure: Err is nil")
	}
	if err := p.Probe(ctx); err != nil || p.Err() != nil {
		t.Errorf("a probe after both: %v, Err %v; want the store writable", err, p.Err())
	}
}

// TestRegisterProbeMetrics: idemproxy_store_writable is the probe's
// verdict, 1 while the store takes writes and 0 once a probe failed, and
// idemproxy_store_write_probe_failures_total counts the failed probes.
func TestRegisterProbeMetrics(t *testing.T) {
	ctx := context.Background()
	read := func(reg *prometheus.Registry) (writable, failures float64) {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		writable, failures = -1, -1
		for _, f := range families {
			switch f.GetName() {
			case "idemproxy_store_writable":
				writable = f.GetMetric()[0].GetGauge().GetValue()
			case "idemproxy_store_write_probe_failures_total":
				failures = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return writable, failures
	}

	ok := store.NewWriteProbe(openBadger(t), store.ProbeOptions{})
	reg := prometheus.NewRegistry()
	store.RegisterProbeMetrics(reg, ok)
	if err := ok.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if w, f := read(reg); w != 1 || f != 0 {
		t.Errorf("after a probe that wrote: writable %v, failures %v; want 1, 0", w, f)
	}

	closed := openBadger(t)
	closed.Close()
	failing := store.NewWriteProbe(closed, store.ProbeOptions{})
	reg = prometheus.NewRegistry()
	store.RegisterProbeMetrics(reg, failing)
	for range 2 {
		failing.Probe(ctx)
	}
	if w, f := read(reg); w != 0 || f != 2 {
		t.Errorf("after two failed probes: writable %v, failures %v; want 0, 2", w, f)
	}
}
