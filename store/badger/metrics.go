package badger

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/internal/prealloc"
)

// RegisterMetrics registers the embedded store's metrics of g on reg: its
// size on disk (the figure an operator watches for a store that grows
// without bound), the guard's free space, refusals and reopens, whether
// the store could be opened (idemproxy_store_open_failed), and the
// preallocation of its files. They are read from g when scraped; a nil g
// reads as zero (for listing the metrics without a store).
func RegisterMetrics(reg prometheus.Registerer, g *Guard) {
	read := func(v func(*Guard) float64) func() float64 {
		return func() float64 {
			if g == nil {
				return 0
			}
			return v(g)
		}
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_store_open_failed",
		Help: "1 while the embedded (Badger) store could not be opened (a damaged reservation log, a missing or unreadable MANIFEST, a permission error): protected routes answer 503 store-unavailable and /readyz says why; 0 once it is open.",
	}, read(func(g *Guard) float64 {
		if g.OpenFailed() != nil {
			return 1
		}
		return 0
	})))
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_badger_disk_free_bytes",
			Help: "Free space of the Badger data directory's file system, as last measured.",
		}, read(func(g *Guard) float64 { return float64(g.FreeBytes()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_badger_low_disk_refusals_total",
			Help: "Reservations refused because free disk space was below store.badger.min_free_bytes.",
		}, read(func(g *Guard) float64 { return float64(g.LowDiskRefusals()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_badger_reopens_total",
			Help: "Times the Badger store was reopened after it failed.",
		}, read(func(g *Guard) float64 { return float64(g.Reopens()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_badger_preallocation_active",
			Help: "1 when the files Badger grows are preallocated, so that a full disk is a 503 and not a crash; 0 where seccomp is unavailable or store.badger.preallocate is off.",
		}, func() float64 {
			if prealloc.Active() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_badger_files_waiting_for_space",
			Help: "Badger table files whose creation waits for disk space.",
		}, func() float64 { return float64(prealloc.Waiting()) }),
	)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_badger_lsm_size_bytes",
			Help: "Size of Badger's LSM tree on disk.",
		}, read(func(g *Guard) float64 { lsm, _ := g.Sizes(); return float64(lsm) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_badger_vlog_size_bytes",
			Help: "Size of Badger's value log on disk.",
		}, read(func(g *Guard) float64 { _, vlog := g.Sizes(); return float64(vlog) })),
	)
}
