package proxy

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
)

// seriesCache resolves a metric vector's child for a label value once, so
// that a request does not hash label values and take the vector's lock.
// Its labels are bounded (outcomes, status codes, store operations), and
// children are created on first use, as WithLabelValues would.
type seriesCache[T any] struct {
	m       sync.Map // label value → T
	resolve func(label string) T
}

func (c *seriesCache[T]) of(label string) T {
	if v, ok := c.m.Load(label); ok {
		return v.(T)
	}
	v := c.resolve(label)
	c.m.Store(label, v)
	return v
}

// routeSeries are the series of one route (route "" for passthrough).
type routeSeries struct {
	route    string
	requests *seriesCache[prometheus.Counter]  // by outcome
	duration *seriesCache[prometheus.Observer] // by outcome
	upstream *seriesCache[prometheus.Observer] // by code
	inFlight prometheus.Gauge
}

// routeSeries returns route's series, none created yet but its in-flight
// gauge (initRoute creates the others that must exist from the start).
// With own false, its latencies go to the histograms shared by the routes
// past metrics.route_histograms (route label config.OtherRoutes): a
// route's histograms are 187 series at start and 17 more per upstream
// status, which 10,000 routes cannot all have.
func (m *Metrics) routeSeries(route string, own bool) *routeSeries {
	s := &routeSeries{
		route: route,
		requests: &seriesCache[prometheus.Counter]{resolve: func(o string) prometheus.Counter {
			return m.requests.WithLabelValues(route, o)
		}},
	}
	if route != config.OtherRoutes {
		s.inFlight = m.inFlight.WithLabelValues(route)
	}
	if !own {
		s.duration, s.upstream = m.other.duration, m.other.upstream
		return s
	}
	s.duration = &seriesCache[prometheus.Observer]{resolve: func(o string) prometheus.Observer {
		return m.duration.WithLabelValues(route, o)
	}}
	s.upstream = &seriesCache[prometheus.Observer]{resolve: func(code string) prometheus.Observer {
		return m.upstreamDuration.WithLabelValues(route, code)
	}}
	return s
}

// storeSeries are the series of one store's operations.
type storeSeries struct {
	duration *seriesCache[prometheus.Observer] // by operation
	errors   *seriesCache[prometheus.Counter]  // by operation
}

func (m *Metrics) storeSeries(store string) *storeSeries {
	return &storeSeries{
		duration: &seriesCache[prometheus.Observer]{resolve: func(op string) prometheus.Observer {
			return m.storeDuration.WithLabelValues(store, op)
		}},
		errors: &seriesCache[prometheus.Counter]{resolve: func(op string) prometheus.Counter {
			return m.storeErrors.WithLabelValues(store, op)
		}},
	}
}

// copyBuffers are the reverse proxies' body copy buffers, shared by every
// route, so that a request does not allocate 32 KiB.
var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}

// copyBufferSize is the size of a reverse proxy's copy buffer.
const copyBufferSize = 32 << 10

// bufferPool pools array pointers, so that Put, which gets a slice back,
// does not allocate a new pointer to store it (a *[]byte would).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[copyBufferSize]byte)[:] }

func (b *bufferPool) Put(v []byte) {
	if len(v) >= copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(v))
	}
}
