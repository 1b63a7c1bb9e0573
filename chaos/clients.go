//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/idemproxy/idemproxy/chaos/check"
)

// recorder keeps the history: every attempt any client makes.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []check.Op
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) add(o check.Op) {
	r.mu.Lock()
	o.ID = len(r.ops) + 1
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []check.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]check.Op(nil), r.ops...)
}

// opMeta says who sends a request and why; it rides in the request's
// context to the recording transport.
type opMeta struct {
	client int
	kind   string
	proxy  string
	route  string
	order  string
}

type metaKey struct{}

// recordingTransport records every attempt that passes through it, retries
// of the retrying client included: each is one operation of the history.
type recordingTransport struct {
	base http.RoundTripper
	rec  *recorder
}

func (t *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m, _ := req.Context().Value(metaKey{}).(opMeta)
	o := check.Op{Client: m.client, Kind: m.kind, Proxy: m.proxy, Route: m.route, Order: m.order, Start: t.rec.now()}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		o.End, o.Err, o.NotSent = t.rec.now(), err.Error(), notSent(err)
		t.rec.add(o)
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	o.End = t.rec.now()
	if err != nil {
		o.Err = "reading the answer: " + err.Error()
		t.rec.add(o)
		return nil, err
	}
	o.Status, o.Body = resp.StatusCode, string(body)
	o.Ctype = resp.Header.Get("Content-Type")
	o.Replay = resp.Header.Get("Idempotent-Replayed") == "true"
	o.Recon = resp.Header.Get("Idempotent-Reconciled") == "true"
	t.rec.add(o)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// notSent reports whether err came before the request could reach the
// proxy: the connection was refused.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// target is a proxy that clients can ask.
type target struct {
	name string
	addr string
}

// cluster is a group of proxies that share one store: a key is sent to any
// of them.
type cluster struct {
	short   string // the order prefix
	proxies []target
}

// routeSpec is one protected route of the run, and how a client calls it.
type routeSpec struct {
	name  string
	short string
	check check.Route
	// request builds a charge for order.
	request func(ctx context.Context, base, order string) (*http.Request, error)
}

func jsonCharge(host string) func(ctx context.Context, base, order string) (*http.Request, error) {
	return func(ctx context.Context, base, order string) (*http.Request, error) {
		body := fmt.Sprintf(`{"orderId": %q, "amount": 5}`, order)
		req, err := http.NewRequestWithContext(ctx, "POST", base+"/charges", bytes.NewReader([]byte(body)))
		if err == nil && host != "" {
			req.Host = host
		}
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, err
	}
}

func pathCharge(ctx context.Context, base, order string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/orders/"+order+"/charges", bytes.NewReader([]byte(`{"amount": 7}`)))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, err
}

// workload is the population of clients.
type workload struct {
	rec      *recorder
	clusters []cluster
	routes   []routeSpec
	base     *http.Transport
	raw      *http.Client // one attempt per request: duplicates, storms, probes

	mu     sync.Mutex
	seq    int
	keys   []keyRef
	nextID int
}

// keyRef is one key the workload used: where it lives.
type keyRef struct {
	cluster *cluster
	route   *routeSpec
	order   string
}

func newWorkload(rec *recorder, clusters []cluster, routes []routeSpec) *workload {
	base := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 10 * time.Second, DisableCompression: true}
	w := &workload{rec: rec, clusters: clusters, routes: routes, base: base}
	w.raw = &http.Client{Transport: &recordingTransport{base: base, rec: rec}, Timeout: 10 * time.Second}
	return w
}

func (w *workload) newKey(rng *rand.Rand) keyRef {
	c := &w.clusters[rng.IntN(len(w.clusters))]
	r := &w.routes[rng.IntN(len(w.routes))]
	w.mu.Lock()
	w.seq++
	k := keyRef{cluster: c, route: r, order: fmt.Sprintf("%s-%s-%d", c.short, r.short, w.seq)}
	w.keys = append(w.keys, k)
	w.mu.Unlock()
	return k
}

// retryingClient returns a go-retryablehttp client that retries what a
// careful client retries (no answer, 429, 5xx other than a replay, 409
// request-in-flight) and honours Retry-After.
func (w *workload) retryingClient() *retryablehttp.Client {
	c := retryablehttp.NewClient()
	c.HTTPClient = &http.Client{Transport: &recordingTransport{base: w.base, rec: w.rec}, Timeout: 10 * time.Second}
	c.Logger = nil
	c.RetryMax = 4
	c.RetryWaitMin = 100 * time.Millisecond
	c.RetryWaitMax = 2 * time.Second
	c.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if err != nil {
			return true, nil
		}
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			return false, nil
		}
		switch {
		case resp.StatusCode == 429, resp.StatusCode >= 500 && resp.StatusCode != 501:
			return true, nil
		case resp.StatusCode == 409 && resp.Header.Get("Retry-After") != "":
			return true, nil // request-in-flight; in doubt has no Retry-After
		}
		return false, nil
	}
	c.Backoff = func(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
		if resp != nil {
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
				return min(time.Duration(s)*time.Second, hi)
			}
		}
		return retryablehttp.DefaultBackoff(lo, hi, attempt, nil)
	}
	c.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return c
}

func (w *workload) client() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	return w.nextID
}

// send sends one attempt of k's charge to t with the raw client.
func (w *workload) send(ctx context.Context, kind string, k keyRef, t target) {
	ctx = context.WithValue(ctx, metaKey{}, opMeta{client: w.client(), kind: kind, proxy: t.name, route: k.route.name, order: k.order})
	req, err := k.route.request(ctx, "http://"+t.addr, k.order)
	if err != nil {
		return
	}
	if resp, err := w.raw.Do(req); err == nil {
		resp.Body.Close()
	}
}

// sendRetrying sends k's charge to t with the retrying client.
func (w *workload) sendRetrying(ctx context.Context, c *retryablehttp.Client, k keyRef, t target) {
	ctx = context.WithValue(ctx, metaKey{}, opMeta{client: w.client(), kind: "retry", proxy: t.name, route: k.route.name, order: k.order})
	req, err := k.route.request(ctx, "http://"+t.addr, k.order)
	if err != nil {
		return
	}
	rreq, err := retryablehttp.FromRequest(req)
	if err != nil {
		return
	}
	if resp, err := c.Do(rreq); err == nil {
		resp.Body.Close()
	}
}

func pick(rng *rand.Rand, c *cluster) target { return c.proxies[rng.IntN(len(c.proxies))] }

// run is one client goroutine of the population, until load ends; its
// requests run under ctx, so the last scenario finishes when load ends.
func (w *workload) run(ctx, load context.Context, rng *rand.Rand) {
	rc := w.retryingClient()
	for load.Err() == nil && ctx.Err() == nil {
		k := w.newKey(rng)
		switch p := rng.IntN(100); {
		case p < 60: // a retrying client, sometimes redelivered later to another replica
			w.sendRetrying(ctx, rc, k, pick(rng, k.cluster))
			if rng.IntN(3) == 0 {
				sleep(ctx, time.Duration(rng.IntN(500))*time.Millisecond)
				w.sendRetrying(ctx, rc, k, pick(rng, k.cluster))
			}
		case p < 85: // a raw duplicate delivery, one after the other or overlapping
			a, b := pick(rng, k.cluster), pick(rng, k.cluster)
			if rng.IntN(2) == 0 {
				w.send(ctx, "duplicate", k, a)
				w.send(ctx, "duplicate", k, b)
			} else {
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); w.send(ctx, "duplicate", k, a) }()
				go func() { defer wg.Done(); w.send(ctx, "duplicate", k, b) }()
				wg.Wait()
			}
		default: // a storm of one key over every replica
			n := 4 + rng.IntN(5)
			ts := make([]target, n)
			for i := range ts {
				ts[i] = pick(rng, k.cluster)
			}
			var wg sync.WaitGroup
			for _, t := range ts {
				wg.Add(1)
				go func() { defer wg.Done(); w.send(ctx, "storm", k, t) }()
			}
			wg.Wait()
		}
		sleep(load, time.Duration(20+rng.IntN(80))*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// probe sends k's charge once to t and reports whether the key had settled:
// not in flight, not unavailable, and not in doubt on a route that
// reconciles.
func (w *workload) probe(ctx context.Context, k keyRef, t target) bool {
	ctx = context.WithValue(ctx, metaKey{}, opMeta{client: w.client(), kind: "probe", proxy: t.name, route: k.route.name, order: k.order})
	req, err := k.route.request(ctx, "http://"+t.addr, k.order)
	if err != nil {
		return false
	}
	resp, err := w.raw.Do(req)
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode == 503:
		return false
	case resp.StatusCode == 409 && bytes.Contains(b, []byte("request-in-flight")):
		return false
	case resp.StatusCode == 409 && bytes.Contains(b, []byte("outcome-in-doubt")) && k.route.check.Reconcile:
		return false
	}
	return true
}
