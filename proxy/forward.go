package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"time"
)

// forward sends the request to the upstream. With a.token set, the
// upstream's outcome settles the reservation.
func (p *Proxy) forward(w http.ResponseWriter, a *attempt, body []byte) {
	if p.life.Err() != nil { // past the shutdown deadline: do not start now
		v, prob := classify(upstreamResult{kind: shutDown}, nil)
		if a.token != "" {
			a.conclude(v)
		}
		a.problem(w, a.outcome, *prob, "the proxy is shutting down; the request was not sent", 1, nil)
		return
	}
	// The upstream request does not end when the client goes away: the
	// answer is still committed, and the client's retry gets it replayed.
	// It ends at the route's upstream_timeout, answer body included, so
	// that it always settles while its lease (longer) still holds.
	ctx, cancel := context.WithTimeoutCause(p.life, a.rt.cfg.UpstreamTimeout.D(), errUpstreamTimeout)
	defer cancel()
	ctx = a.withSpan(ctx)
	// The server's context value lets the reverse proxy abort the client's
	// connection when the answer breaks off, instead of ending it as if it
	// were complete.
	ctx = &forwardContext{Context: ctx, a: a, server: a.in.Context().Value(http.ServerContextKey)}
	out := a.in.WithContext(a.traced(ctx))
	if sent := a.sentURL(); sent != nil {
		out.URL = sent // matched in cleaned form, forwarded as sent
	}
	if h, ok := a.in.Context().Value(sentHostKey{}).(string); ok {
		out.Host = h // matched as a DNS name; X-Forwarded-Host as sent
	}
	a.body = body
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.Body = http.NoBody
	if len(body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	a.upstreamAt = time.Now()
	defer a.settleUnknown()
	a.client = http.NewResponseController(w)
	a.rt.rp.ServeHTTP(w, out)
}

// errUpstreamTimeout is the cause of an upstream request cancelled by the
// route's upstream_timeout.
var errUpstreamTimeout = fmt.Errorf("upstream timeout: %w", context.DeadlineExceeded)

// forwardContext is the forwarded request's context: ctx with the
// attempt (under attemptKey) and the server's context value, in one
// allocation where two context.WithValue took two.
type forwardContext struct {
	context.Context
	a      *attempt
	server any
}

func (c *forwardContext) Value(key any) any {
	switch key {
	case attemptKey{}:
		return c.a
	case http.ServerContextKey:
		return c.server
	}
	return c.Context.Value(key)
}

// traced returns ctx with a trace that records when a's request headers
// have been written.
func (a *attempt) traced(ctx context.Context) context.Context {
	a.trace = httptrace.ClientTrace{WroteHeaders: func() { a.wrote.Store(true) }}
	return httptrace.WithClientTrace(ctx, &a.trace)
}

// sentURL returns the URL the request was sent with when it was matched in
// cleaned form ("/charges/" for "/charges"), nil when it was matched as sent.
func (a *attempt) sentURL() *url.URL {
	u, _ := a.in.Context().Value(sentURLKey{}).(*url.URL)
	return u
}

// reverseProxy returns the reverse proxy of a route (nil: passthrough).
func (p *Proxy) reverseProxy(up *url.URL, rt *route) *httputil.ReverseProxy {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport:    p.transport,
		ErrorLog:     p.errorLog,
		ErrorHandler: p.upstreamError,
		BufferPool:   copyBuffers,
	}
	if rt != nil {
		// The body was buffered before the request is forwarded: the client
		// already got its 100 Continue, and a second one (the upstream's,
		// passed on) would be read as the final answer's prelude twice.
		//
		// Nor is a protocol switch asked for: a switched connection has no
		// answer to store, so an upstream that accepts one (an h2c or
		// WebSocket upgrade, which curl --http2 asks for on every
		// request) would leave the key in doubt after processing the
		// request. Without it the upstream answers in HTTP/1.1.
		rewrite := rp.Rewrite
		rp.Rewrite = func(pr *httputil.ProxyRequest) {
			rewrite(pr)
			pr.Out.Header.Del("Expect")
			// Without its Upgrade header the reverse proxy asks for no
			// switch; Connection stays, so that the headers it names are
			// still dropped as hop-by-hop.
			pr.Out.Header.Del("Upgrade")
			// The answer is stored for every retry, whatever content
			// codings each accepts: it is asked for unencoded. (Without
			// any Accept-Encoding, Go's transport would ask for gzip and
			// decode it itself; with one, it passes the body as sent.)
			// An upstream that encodes anyway is decoded on replay for a
			// client that does not accept the coding.
			pr.Out.Header.Set("Accept-Encoding", "identity")
		}
		rp.Transport = p.protected
		rp.ModifyResponse = p.upstreamResponse
	} else {
		// The upstream duration ends at the answer's headers, as on a
		// route, not once the client has taken the whole body (a stream,
		// a WebSocket session).
		rp.ModifyResponse = func(resp *http.Response) error {
			resp.Request.Context().Value(attemptKey{}).(*attempt).upstreamDone(strconv.Itoa(resp.StatusCode))
			return nil
		}
	}
	return rp
}

// upstreamResponse settles a key by the upstream's answer (classify): an
// answer that releases it is passed on as it comes; one to be committed is
// captured while it is passed on, and committed once complete.
func (p *Proxy) upstreamResponse(resp *http.Response) error {
	a := resp.Request.Context().Value(attemptKey{}).(*attempt)
	v, _ := classify(a.answerResult(resp), &a.rt.cfg)
	if v == OutcomeInDoubt {
		// 101 Switching Protocols: the connection now speaks another
		// protocol, which a route never asks for (it does not pass
		// Upgrade on): there is no answer to store, and the reverse
		// proxy, which cannot relay it through the capture or to a client
		// that did not ask, would leave the upstream's connection open.
		// The error closes it, and upstreamError settles a protected
		// request, processed with an unknown outcome, as one whose
		// connection was lost: in doubt.
		return errSwitchedProtocols
	}
	a.upstreamDone(strconv.Itoa(resp.StatusCode))
	a.status = resp.StatusCode
	if a.token != "" && v == OutcomeCommitted {
		return a.captureAnswer(resp)
	}
	// The answer's body is read from the upstream as fast as the client
	// takes it. A client that stops reading would hold the request, its
	// connection and its reservation for as long as it stays connected,
	// well past upstream_timeout, which bounds the whole exchange: its
	// writes fail at that deadline too, and the key settles as for an
	// answer that broke off then. (The server clears the deadline before
	// the connection's next request.)
	if d, ok := resp.Request.Context().Deadline(); ok && a.client != nil {
		a.client.SetWriteDeadline(d)
	}
	if a.token != "" {
		a.conclude(v) // released
	}
	return nil
}

// errSwitchedProtocols is the error of a request on a route that the
// upstream answered with 101 Switching Protocols.
var errSwitchedProtocols = errors.New("upstream switched protocols on a route")

// upstreamError answers a request that got no answer from the upstream,
// and settles its key (classify): a request whose headers were never
// written (dial, DNS, TLS, no connection in time) was not sent; one that
// may have been processed timed out or lost its connection.
func (p *Proxy) upstreamError(w http.ResponseWriter, out *http.Request, err error) {
	a := out.Context().Value(attemptKey{}).(*attempt)
	if a.upstream == 0 { // not yet observed at the answer's headers
		a.upstreamDone("error")
	}
	kind := connLost
	switch {
	case !a.wrote.Load() || refusedByTLS(err):
		kind = notSent
	case errors.Is(context.Cause(out.Context()), context.DeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		kind = timedOut
	}
	v, prob := classify(upstreamResult{kind: kind}, nil)
	p.log.Warn("upstream request failed", "route", a.routeName(), "err", err, "problem", prob.Name)
	outcome := a.outcome
	if a.token != "" && !a.settled {
		a.conclude(v)
		outcome = a.outcome
	}
	detail := "the upstream could not be reached; the request was not sent"
	if v != OutcomeReleased {
		detail = "the request may have reached the upstream, but no answer came back"
		if a.token != "" {
			detail += "; its key is now in doubt and retries get 409 until it is released"
		}
	}
	a.problem(w, outcome, *prob, detail, 0, nil)
}

// refusedByTLS reports whether err is an alert from the upstream's TLS
// layer refusing the proxy's certificate (bad, unknown CA, expired, none
// given): the connection was refused before any request on it was read.
// With TLS 1.3 the upstream checks the client certificate after the proxy
// has finished its handshake and written the request, so without this a
// refused client certificate would leave every key in doubt.
func refusedByTLS(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return false
	}
	v := reflect.ValueOf(op.Err)
	if v.Type().PkgPath() != "crypto/tls" || v.Kind() != reflect.Uint8 {
		return false
	}
	switch v.Uint() {
	case 42, 43, 44, 45, 46, 48, 49, 116: // bad_certificate ... unknown_ca, access_denied, certificate_required
		return true
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// answerResult is what happened upstream to a's request that the
// upstream answered with resp.
func (a *attempt) answerResult(resp *http.Response) upstreamResult {
	o := upstreamResult{kind: answered, status: resp.StatusCode, cleaned: a.sentURL() != nil}
	if o.cleaned {
		// Resolved against the request as sent to the upstream, so that
		// the upstream's base path is on both sides.
		loc, err := resp.Location()
		o.toCanonical = err == nil && cleanPath(loc.Path) == cleanPath(resp.Request.URL.Path)
	}
	return o
}

func (a *attempt) upstreamDone(code string) {
	a.upstream = time.Since(a.upstreamAt)
	a.series.upstream.of(code).Observe(a.upstream.Seconds())
}
