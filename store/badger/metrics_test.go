package badger_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/store/badger"
)

// gauges gathers reg and returns the value of each gauge and counter.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				got[f.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[f.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}

// TestRegisterMetrics: the store's metrics say what the guard sees (the
// free space last measured, the reservations refused below the floor, an
// open store), and without a store they are registered all the same,
// reading zero, for listing them.
func TestRegisterMetrics(t *testing.T) {
	t.Parallel()
	var free atomic.Uint64
	free.Store(10 << 20)
	s := openGuarded(t, t.TempDir(), badger.GuardOptions{
		MinFreeBytes: 64 << 20,
		FreeBytes:    func(string) (uint64, error) { return free.Load(), nil },
	})
	reg := prometheus.NewRegistry()
	badger.RegisterMetrics(reg, s)
	ctx := context.Background()
	n := 0
	eventually(t, "a reservation is refused below the floor", func() bool {
		n++
		_, err := s.Reserve(ctx, fmt.Sprintf("new-%d", n), res)
		return errors.Is(err, badger.ErrLowDisk)
	})
	got := gauges(t, reg)
	for name, want := range map[string]float64{
		"idemproxy_store_open_failed":              0,
		"idemproxy_badger_disk_free_bytes":         10 << 20,
		"idemproxy_badger_low_disk_refusals_total": float64(s.LowDiskRefusals()),
		"idemproxy_badger_reopens_total":           0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (registered: %v); want %v", name, v, ok, want)
		}
	}
	if got["idemproxy_badger_low_disk_refusals_total"] < 1 {
		t.Errorf("idemproxy_badger_low_disk_refusals_total = %v after a refusal; want at least 1", got["idemproxy_badger_low_disk_refusals_total"])
	}

	none := prometheus.NewRegistry()
	badger.RegisterMetrics(none, nil)
	without := gauges(t, none)
	for name := range got {
		v, ok := without[name]
		switch {
		case !ok:
			t.Errorf("%s is not registered without a store", name)
		case v != 0 && name != "idemproxy_badger_preallocation_active":
			t.Errorf("%s = %v without a store; want 0", name, v)
		}
	}
	if len(without) != len(got) {
		t.Errorf("without a store %d metrics are registered; with one %d", len(without), len(got))
	}
}
