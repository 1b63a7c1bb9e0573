package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/keyextract"
)

// attempt is one request's journey through the proxy.
type attempt struct {
	p     *Proxy
	rt    *route // nil for passthrough
	in    *http.Request
	start time.Time

	storeKey string
	token    string // empty: the request is not protected by a reservation
	settled  bool

	outcome    Outcome
	status     int
	upstreamAt time.Time
	upstream   time.Duration

	// wrote is set once the request's headers were written to the
	// upstream connection: before that, a failure proves it was not sent.
	wrote atomic.Bool
}

// errUpstreamTimeout is the cause of an upstream request cancelled by the
// route's upstream_timeout.
var errUpstreamTimeout = fmt.Errorf("upstream timeout: %w", context.DeadlineExceeded)

// traced returns ctx with a trace that records when a's request headers
// have been written.
func (a *attempt) traced(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { a.wrote.Store(true) }})
}

type attemptKey struct{}

func (a *attempt) routeName() string {
	if a.rt == nil {
		return ""
	}
	return a.rt.cfg.Name
}

// problem answers with a proxy-made error and records the outcome.
func (a *attempt) problem(w http.ResponseWriter, o Outcome, p problem, detail string, retryAfter int, ext map[string]any) {
	a.outcome, a.status = o, p.status
	writeProblem(w, a.in, p, detail, retryAfter, ext)
}

func (p *Proxy) serveRoute(w http.ResponseWriter, r *http.Request, rt *route) {
	a := &attempt{p: p, rt: rt, in: r, start: time.Now()}
	gauge := p.m.inFlight.WithLabelValues(rt.cfg.Name)
	gauge.Inc()
	defer gauge.Dec()
	defer p.finish(a)
	cfg := &rt.cfg
	if !p.active.enter() {
		a.problem(w, OutcomeStoreError, probShuttingDown, "the proxy is shutting down; retry on another instance", 1, nil)
		return
	}
	defer p.active.leave()

	body, ok := a.readBody(w, cfg.MaxBodyBytes)
	if !ok {
		return
	}
	// The target is the (cleaned) path and the query, parameters sorted:
	// the same key with another query is another request.
	target := r.URL.Path
	if raw := r.URL.RawQuery; raw != "" {
		target += "?" + canonicalQuery(raw)
	}
	fp, jsonErr := keyextract.Fingerprint(r.Method, target, body, cfg.Fingerprint.Ignore)
	if rt.spec.NeedsJSON() && jsonErr != nil {
		a.problem(w, OutcomeBadRequest, probInvalidJSON, jsonErr.Error(), 0, nil)
		return
	}
	if cfg.Fingerprint.Disabled {
		fp = ""
	}
	key, err := rt.spec.Extract(r, body)
	if err != nil {
		if errors.Is(err, keyextract.ErrMissing) && cfg.OnMissingKey == config.MissingKeyForward {
			a.outcome = OutcomeUnprotected
			p.forward(w, a, body)
			return
		}
		prob := probInvalidKey
		switch {
		case errors.Is(err, keyextract.ErrMissing):
			prob = probMissingKey
		case errors.Is(err, keyextract.ErrBadJSON):
			prob = probInvalidJSON
		}
		a.problem(w, OutcomeBadRequest, prob, err.Error(), 0, nil)
		return
	}
	var scope string
	if h := cfg.Scope.Header; h != "" {
		if scope = r.Header.Get(h); scope == "" {
			a.problem(w, OutcomeBadRequest, probMissingScope, "this route keeps one key space per "+h+" header", 0, nil)
			return
		}
	}
	a.storeKey = StoreKey(cfg.Name, scope, key)
	res := Reservation{Token: rand.Text(), Fingerprint: fp, Lease: cfg.Lease.D(), TTL: cfg.TTL.D()}
	waitUntil := time.Now().Add(cfg.WaitTimeout.D())
	for {
		// A client that hangs up now does not undo its request: the
		// reservation and the forward run to the end, and the answer is
		// stored for its retry.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
		rec, err := p.store.Reserve(rctx, a.storeKey, res)
		cancel()
		if err != nil {
			// The reservation may have been applied with its reply lost:
			// take it back, so the key is not left in flight (and then in
			// doubt) for a request that was never forwarded.
			p.releaseLater(a.storeKey, res.Token)
			a.storeFailed(w, body, "reserve", err)
			return
		}
		if rec == nil {
			a.token = res.Token
			p.forward(w, a, body)
			return
		}
		if fp != "" && rec.Fingerprint != "" && rec.Fingerprint != fp {
			a.problem(w, OutcomeMismatch, probMismatch,
				"this key was first used with another request (method, path or body); a new request needs a new key", 0, nil)
			return
		}
		if rec.State == StateInFlight && cfg.Concurrent == config.ConcurrentWait && time.Now().Before(waitUntil) {
			rec, err = p.waitSettled(r.Context(), a.storeKey, waitUntil)
			if err != nil && r.Context().Err() != nil {
				a.outcome = OutcomeConflict // the client stopped waiting
				return
			}
			if err != nil {
				a.storeFailed(w, body, "get", err)
				return
			}
			// Settled, released or still in flight at the deadline: ask
			// again, so the answer is checked against this request's
			// fingerprint (another request may have taken the key).
			continue
		}
		a.answerExisting(w, rec)
		return
	}
}

// canonicalQuery sorts the parameters of a query string. A query Go cannot
// parse (a ';', a bad escape) is sorted as raw pairs, so that no part of it
// is left out of the fingerprint.
func canonicalQuery(raw string) string {
	if q, err := url.ParseQuery(raw); err == nil {
		return q.Encode()
	}
	pairs := strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' })
	slices.Sort(pairs)
	return "raw:" + strings.Join(pairs, "&")
}

// readBody buffers the request body up to limit bytes.
func (a *attempt) readBody(w http.ResponseWriter, limit int64) ([]byte, bool) {
	r := a.in
	tooLarge := func() ([]byte, bool) {
		a.problem(w, OutcomeBadRequest, probBodyTooLarge,
			fmt.Sprintf("this route accepts bodies of at most %d bytes", limit), 0, map[string]any{"max_body_bytes": limit})
		return nil, false
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge()
		}
		a.problem(w, OutcomeBadRequest, probUnreadableBody, err.Error(), 0, nil)
		return nil, false
	}
	return body, true
}

// releaseLater releases a reservation that may or may not exist, in the
// background; the owner token makes that safe.
func (p *Proxy) releaseLater(key, token string) {
	release := func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		p.store.Release(ctx, key, token)
	}
	if !p.active.enter() { // shutting down: the store closes soon
		release()
		return
	}
	go func() {
		defer p.active.leave()
		release()
	}()
}

// storeFailed answers a store failure: 503, or the request forwarded
// unprotected under on_store_error: forward.
func (a *attempt) storeFailed(w http.ResponseWriter, body []byte, op string, err error) {
	a.p.log.Error("store failed", "route", a.routeName(), "operation", op, "key_hash", keyHash(a.storeKey), "err", err)
	a.outcome = OutcomeStoreError
	if a.rt.cfg.OnStoreError == config.StoreErrorForward {
		a.p.forward(w, a, body)
		return
	}
	a.problem(w, OutcomeStoreError, probStoreUnavailable, "the idempotency store cannot be reached; retry later", 1, nil)
}

// waitSettled polls the record under key until it is no longer in flight,
// the deadline passes or the client goes away, and returns it (nil when it
// was released).
func (p *Proxy) waitSettled(ctx context.Context, key string, until time.Time) (*Record, error) {
	delay := 5 * time.Millisecond
	for {
		t := time.NewTimer(min(delay, time.Until(until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		rec, err := p.store.Get(ctx, key)
		if err != nil || rec == nil || rec.State != StateInFlight || !time.Now().Before(until) {
			return rec, err
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// answerExisting answers a request whose key is already known.
func (a *attempt) answerExisting(w http.ResponseWriter, rec *Record) {
	switch rec.State {
	case StateInFlight:
		a.problem(w, OutcomeConflict, probInFlight,
			"a request with this key is being forwarded now; retry after it has been answered", 1, nil)
	case StateCompleted:
		resp := rec.Response
		if resp == nil {
			resp = &Response{}
		}
		switch {
		case a.rt.cfg.Duplicate == config.DuplicateReject:
			a.problem(w, OutcomeDuplicate, probDuplicate, "this key was already processed", 0,
				map[string]any{"stored_status": resp.Status})
		case !resp.BodyStored:
			a.problem(w, OutcomeDuplicate, probNotReplayable,
				"this key was already processed, but its answer was larger than the route's max_stored_body_bytes", 0,
				map[string]any{"stored_status": resp.Status})
		default:
			a.outcome, a.status = OutcomeReplayed, resp.Status
			h := w.Header()
			for k, vs := range resp.Header {
				h[k] = vs
			}
			h.Set("Idempotent-Replayed", "true")
			h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
			w.WriteHeader(resp.Status)
			w.Write(resp.Body)
		}
	default:
		ext := map[string]any{}
		if !rec.ExpiresAt.IsZero() {
			ext["expires_at"] = rec.ExpiresAt.UTC().Format(time.RFC3339)
		}
		a.problem(w, OutcomeConflict, probInDoubt,
			"an earlier request with this key may have reached the upstream, but its answer was lost; "+
				"check the upstream, then release the key through the admin API, or wait for it to expire", 0, ext)
	}
}

// forward sends the request to the upstream. With a.token set, the
// upstream's outcome settles the reservation.
func (p *Proxy) forward(w http.ResponseWriter, a *attempt, body []byte) {
	if p.life.Err() != nil { // past the shutdown deadline: do not start now
		if a.token != "" {
			a.release()
		}
		a.problem(w, a.outcome, probShuttingDown, "the proxy is shutting down; the request was not sent", 1, nil)
		return
	}
	// The upstream request does not end when the client goes away: the
	// answer is still committed, and the client's retry gets it replayed.
	// It ends at the route's upstream_timeout, answer body included, so
	// that it always settles while its lease (longer) still holds.
	ctx, cancel := context.WithTimeoutCause(p.life, a.rt.cfg.UpstreamTimeout.D(), errUpstreamTimeout)
	defer cancel()
	// The server's context value lets the reverse proxy abort the client's
	// connection when the answer breaks off, instead of ending it as if it
	// were complete.
	ctx = context.WithValue(ctx, http.ServerContextKey, a.in.Context().Value(http.ServerContextKey))
	out := a.in.WithContext(a.traced(context.WithValue(ctx, attemptKey{}, a)))
	if sent, ok := a.in.Context().Value(sentURLKey{}).(*url.URL); ok {
		out.URL = sent // matched in cleaned form, forwarded as sent
	}
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.Body = http.NoBody
	if len(body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	a.upstreamAt = time.Now()
	defer a.settleUnknown()
	a.rt.rp.ServeHTTP(w, out)
}

// settleUnknown makes sure a reservation is settled, should the reverse
// proxy have returned (or panicked) without a verdict: the request may
// have reached the upstream, so the key is in doubt.
func (a *attempt) settleUnknown() {
	if a.token != "" && !a.settled {
		a.markInDoubt()
	}
}

func (a *attempt) commit(status int, header http.Header, body []byte, stored bool) {
	a.settled = true
	a.outcome = OutcomeCommitted
	resp := Response{Status: status, Header: http.Header{}, BodyStored: stored}
	for _, name := range a.rt.cfg.ReplayHeaders {
		if vs := header.Values(name); len(vs) > 0 {
			resp.Header[name] = vs
		}
	}
	if stored {
		resp.Body = body
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	a.settleErr("commit", a.p.store.Commit(ctx, a.storeKey, a.token, resp, a.rt.cfg.TTL.D()))
}

func (a *attempt) release() {
	a.settled = true
	a.outcome = OutcomeReleased
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	a.settleErr("release", a.p.store.Release(ctx, a.storeKey, a.token))
}

func (a *attempt) markInDoubt() {
	a.settled = true
	a.outcome = OutcomeInDoubt
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	a.settleErr("mark_in_doubt", a.p.store.MarkInDoubt(ctx, a.storeKey, a.token, a.rt.cfg.TTL.D()))
}

func (a *attempt) settleErr(op string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, ErrNotOwner):
		a.p.log.Warn("reservation was taken over before it settled; left to its new owner",
			"route", a.routeName(), "operation", op, "key_hash", keyHash(a.storeKey))
	default:
		// The reservation stays in flight and turns in doubt when its
		// lease runs out: never released, never charged twice.
		a.p.log.Error("store failed to settle a key; it will be in doubt when its lease ends",
			"route", a.routeName(), "operation", op, "key_hash", keyHash(a.storeKey), "err", err)
		a.outcome = OutcomeStoreError
	}
}

// reverseProxy returns the reverse proxy of a route (nil: passthrough).
func (p *Proxy) reverseProxy(up *url.URL, rt *route) *httputil.ReverseProxy {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport:    p.transport,
		ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ErrorHandler: p.upstreamError,
	}
	if rt != nil {
		rp.Transport = p.protected
		rp.ModifyResponse = p.upstreamResponse
	}
	return rp
}

// upstreamResponse classifies an answer: a status in the route's release
// set releases the key; any other answer is streamed to the client while it
// is captured, and committed once complete.
func (p *Proxy) upstreamResponse(resp *http.Response) error {
	a := resp.Request.Context().Value(attemptKey{}).(*attempt)
	a.upstreamDone(strconv.Itoa(resp.StatusCode))
	a.status = resp.StatusCode
	if a.token == "" {
		return nil
	}
	if a.rt.cfg.Releases(resp.StatusCode) {
		a.release()
		return nil
	}
	resp.Body = &capture{rc: resp.Body, a: a, resp: resp, limit: a.rt.cfg.MaxStoredBodyBytes}
	return nil
}

// upstreamError answers a request that got no answer from the upstream: a
// request whose headers were never written (dial, DNS, TLS, no connection
// in time) releases its key (502); one that may have been processed turns
// its key in doubt (504 on timeout, 502 otherwise).
func (p *Proxy) upstreamError(w http.ResponseWriter, out *http.Request, err error) {
	a := out.Context().Value(attemptKey{}).(*attempt)
	a.upstreamDone("error")
	prob, verdict := probUpstreamReset, a.markInDoubt
	switch {
	case !a.wrote.Load():
		prob, verdict = probUpstreamDown, a.release
	case errors.Is(context.Cause(out.Context()), context.DeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		prob = probUpstreamTimeout
	}
	p.log.Warn("upstream request failed", "route", a.routeName(), "err", err, "problem", prob.name)
	outcome := a.outcome
	if a.token != "" {
		verdict()
		outcome = a.outcome
	}
	detail := "the upstream could not be reached; the request was not sent"
	if prob != probUpstreamDown {
		detail = "the request may have reached the upstream, but no answer came back"
		if a.token != "" {
			detail += "; its key is now in doubt and retries get 409 until it is released"
		}
	}
	a.problem(w, outcome, prob, detail, 0, nil)
}

func (a *attempt) upstreamDone(code string) {
	a.upstream = time.Since(a.upstreamAt)
	a.p.m.upstreamDuration.WithLabelValues(a.routeName(), code).Observe(a.upstream.Seconds())
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// capture passes the upstream's body through to the client and keeps a
// copy up to limit bytes. When the body ends, the answer is committed; if
// the client went away first, the rest is still read so the answer can be
// stored; if the upstream's body breaks off, the key is in doubt.
type capture struct {
	rc    io.ReadCloser
	a     *attempt
	resp  *http.Response
	limit int64
	buf   bytes.Buffer
	over  bool
	eof   bool
	err   error
	done  bool
}

func (c *capture) keep(p []byte) (int, error) {
	if !c.over {
		if int64(c.buf.Len()+len(p)) > c.limit {
			c.over = true
			c.buf = bytes.Buffer{}
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capture) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.keep(p[:n])
	switch {
	case err == io.EOF:
		c.eof = true
	case err != nil:
		c.err = err
	}
	return n, err
}

func (c *capture) Close() error {
	if !c.done {
		c.done = true
		if !c.eof && c.err == nil {
			if _, err := io.Copy(writerFunc(c.keep), c.rc); err != nil {
				c.err = err
			} else {
				c.eof = true
			}
		}
		if c.eof {
			c.a.commit(c.resp.StatusCode, c.resp.Header, c.buf.Bytes(), !c.over)
		} else {
			c.a.p.log.Warn("upstream answer broke off", "route", c.a.routeName(), "err", c.err)
			c.a.markInDoubt()
		}
	}
	return c.rc.Close()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// servePassthrough proxies a request that matches no route, untouched.
func (p *Proxy) servePassthrough(w http.ResponseWriter, r *http.Request, t *table) {
	a := &attempt{p: p, in: r, start: time.Now(), outcome: OutcomePassthrough}
	defer p.finish(a)
	ctx, cancel := context.WithTimeout(r.Context(), t.ptTimeout)
	defer cancel()
	a.upstreamAt = time.Now()
	out := r.WithContext(a.traced(context.WithValue(ctx, attemptKey{}, a)))
	sw := &statusWriter{ResponseWriter: w}
	t.passthrough.ServeHTTP(sw, out)
	if a.status == 0 {
		a.status = sw.status
	}
	if a.upstream == 0 {
		a.upstreamDone(strconv.Itoa(sw.status))
	}
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish counts a handled request and writes its access log line.
func (p *Proxy) finish(a *attempt) {
	d := time.Since(a.start)
	route := a.routeName()
	p.m.requests.WithLabelValues(route, string(a.outcome)).Inc()
	p.m.duration.WithLabelValues(route, string(a.outcome)).Observe(d.Seconds())
	attrs := []slog.Attr{
		slog.String("route", route),
		slog.String("method", a.in.Method),
		slog.String("path", a.in.URL.Path),
		slog.String("outcome", string(a.outcome)),
		slog.Int("status", a.status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
	}
	if a.upstream > 0 {
		attrs = append(attrs, slog.Float64("upstream_ms", float64(a.upstream.Microseconds())/1000))
	}
	if a.storeKey != "" {
		attrs = append(attrs, slog.String("key_hash", keyHash(a.storeKey)))
	}
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}
