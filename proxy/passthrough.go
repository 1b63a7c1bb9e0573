package proxy

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/statuswriter"
)

// servePassthrough proxies a request that matches no route, untouched.
func (p *Proxy) servePassthrough(w http.ResponseWriter, r *http.Request, t *table) {
	a := &attempt{p: p, in: r, start: time.Now(), outcome: OutcomePassthrough, series: t.ptSeries}
	a.startSpan()
	r = a.in
	defer p.finish(a)
	if invalidUpgrade(r.Header) {
		a.problem(w, OutcomePassthrough, probInvalidUpgrade, upgradeDetail, 0, nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.ptTimeout)
	defer cancel()
	a.upstreamAt = time.Now()
	out := r.WithContext(a.traced(context.WithValue(ctx, attemptKey{}, a)))
	sw := &statuswriter.Writer{ResponseWriter: w}
	t.passthrough.ServeHTTP(sw, out)
	if a.status == 0 {
		a.status = sw.Status
	}
	if a.upstream == 0 {
		a.upstreamDone(strconv.Itoa(sw.Status))
	}
}
