package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
)

// Tracing (docs/observability.md): while Options.Tracing is on, every
// request gets a server span (startSpan, ended by finish with the outcome),
// each store operation a child span (storeSpan), and the upstream call a
// client span whose context the upstream gets (tracedTransport). A
// reservation keeps its server span as the record's Origin, and a request
// answered from a record links to it (linkOrigin). While tracing is off,
// a.span is nil and none of this runs.

// startSpan starts a's server span, the child of the trace context the
// client sent, and makes a.in carry it; it does nothing while tracing is
// off.
func (a *attempt) startSpan() {
	tr := a.p.tracing.Tracer()
	if tr == nil {
		return
	}
	r := a.in
	ctx := tracing.Extract(r.Context(), r.Header)
	method := knownMethod(r.Method)
	name := method
	if method == "_OTHER" {
		name = "HTTP"
	}
	if a.rt != nil {
		name += " " + a.rt.httpRoute
	}
	ctx, a.span = tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	a.in = r.WithContext(ctx)
	if !a.span.IsRecording() {
		return // not sampled: no attribute is read
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String(method),
		semconv.URLPath(tracing.Text(r.URL.Path)),
		semconv.URLScheme(scheme(r)),
		semconv.ServerAddress(tracing.Text(canonicalHost(r.Host))),
		semconv.NetworkProtocolVersion(strings.TrimPrefix(r.Proto, "HTTP/")),
	)
	if method == "_OTHER" {
		attrs = append(attrs, semconv.HTTPRequestMethodOriginal(tracing.Text(r.Method[:min(len(r.Method), 64)])))
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, semconv.ClientAddress(host))
	}
	if ua := r.UserAgent(); ua != "" {
		attrs = append(attrs, semconv.UserAgentOriginal(tracing.Text(ua)))
	}
	if a.rt != nil {
		attrs = append(attrs, semconv.HTTPRoute(a.rt.httpRoute), tracing.AttrRoute.String(a.rt.cfg.Name),
			tracing.AttrPolicy.String(a.rt.cfg.Policy), tracing.AttrStore.String(a.p.storeName))
	}
	a.span.SetAttributes(attrs...)
}

// knownMethod is a request's method as the HTTP semantic conventions name
// it: one of the methods they know, else "_OTHER", so that a client's
// invented methods cannot grow the span names without bound.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// endSpan ends a's server span with what finish counts: the outcome, the
// status, the key's hash, whether the answer was a replay.
func (a *attempt) endSpan() {
	if a.span == nil {
		return
	}
	if !a.span.IsRecording() {
		a.span.End()
		return
	}
	a.span.SetAttributes(
		tracing.AttrOutcome.String(string(a.outcome)),
		tracing.AttrReplayed.Bool(a.outcome == OutcomeReplayed),
	)
	if a.status != 0 {
		a.span.SetAttributes(semconv.HTTPResponseStatusCode(a.status))
		if a.status >= 500 {
			a.span.SetStatus(codes.Error, "")
			a.span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(a.status)))
		}
	}
	if a.storeKey != "" {
		a.span.SetAttributes(tracing.AttrKeyHash.String(store.KeyHash(a.storeKey)))
	}
	a.span.End()
}

// observeDuration observes the request's duration d in obs, with the trace
// ID as its exemplar when a's span is sampled.
func (a *attempt) observeDuration(obs prometheus.Observer, d float64) {
	if a.span != nil {
		if sc := a.span.SpanContext(); sc.IsSampled() {
			if eo, ok := obs.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(d, prometheus.Labels{"trace_id": sc.TraceID().String()})
				return
			}
		}
	}
	obs.Observe(d)
}

// event adds the event name to a's server span.
func (a *attempt) event(name string, attrs ...attribute.KeyValue) {
	if a.span != nil {
		a.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// origin is what a's reservation keeps of its span: its Origin when
// sampled, "" otherwise.
func (a *attempt) origin() string {
	if a.span == nil {
		return ""
	}
	return tracing.Origin(a.span.SpanContext())
}

// linkOrigin links a's span to the span that forwarded the request which
// made rec (none for a record stored without one).
func (a *attempt) linkOrigin(rec *store.Record) {
	if a.span == nil {
		return
	}
	if sc, ok := tracing.ParseOrigin(rec.Origin); ok {
		a.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("idemproxy.link", "original")}})
	}
}

// detached returns a context with no deadline or cancellation that carries
// a's span, for the store writes that settle a request after it ended.
func (a *attempt) detached() context.Context {
	if a.span == nil {
		return context.Background()
	}
	return trace.ContextWithSpan(context.Background(), a.span)
}

// withSpan returns ctx carrying a's span, for the upstream request.
func (a *attempt) withSpan(ctx context.Context) context.Context {
	if a.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, a.span)
}

// storeSpan starts the child span of a store operation under ctx's span,
// when tracing is on and that span is recording; the span is nil
// otherwise.
func storeSpan(ctx context.Context, t *tracing.Tracing, storeName, op string) (context.Context, trace.Span) {
	tr := t.Tracer()
	if tr == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return tr.Start(ctx, "store "+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.DBSystemNameKey.String(dbSystem(storeName)), semconv.DBOperationName(op)))
}

// endStoreSpan ends a store operation's span (nil: none) with its error.
func endStoreSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		tracing.RecordError(span, err)
	}
	span.End()
}

// dbSystem is the db.system.name of a store's spans.
func dbSystem(storeName string) string {
	if storeName == "postgres" {
		return "postgresql"
	}
	return storeName
}

// tracedTransport starts a client span for each request it carries that
// belongs to a traced request or lookup (its context carries a span), and
// sends the request with that span's trace context, so that the upstream's
// spans are its children.
type tracedTransport struct {
	next    http.RoundTripper
	tracing *tracing.Tracing
}

func (t tracedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := t.tracing.Tracer()
	if tr == nil {
		return t.next.RoundTrip(req)
	}
	parent := trace.SpanFromContext(req.Context())
	if !parent.SpanContext().IsValid() {
		return t.next.RoundTrip(req)
	}
	// The requests this transport carries are the proxy's own (the
	// reverse proxy's outgoing copy, a lookup it built), so their headers
	// are set in place rather than on a clone.
	//
	// Inject sets a tracestate only when the context has one: the
	// client's, as it came (not cut, or sent with a traceparent that
	// could not be read), must not go with the proxy's traceparent.
	req.Header.Del("tracestate")
	if !parent.IsRecording() {
		// Not sampled: the upstream continues the request's trace
		// context as it is, and no client span is built that nobody
		// would record.
		tracing.Propagator.Inject(req.Context(), propagation.HeaderCarrier(req.Header))
		return t.next.RoundTrip(req)
	}
	method := knownMethod(req.Method)
	full, ok := tracing.URL(req.Context())
	if !ok {
		full = redactedURL(req)
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(method),
		semconv.URLFull(tracing.Text(full)),
		semconv.ServerAddress(req.URL.Hostname()),
	}
	if p := req.URL.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			attrs = append(attrs, semconv.ServerPort(n))
		}
	}
	name := method
	if method == "_OTHER" {
		name = "HTTP"
	}
	ctx, span := tr.Start(req.Context(), name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		tracing.RecordError(span, err)
		span.SetAttributes(semconv.ErrorTypeKey.String("connection"))
		span.End()
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, "")
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody {
		span.End() // a switched connection's body is the connection itself: left as it is
		return resp, nil
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// redactedURL is the request's URL without its query (which may carry a
// customer reference) or credentials.
func redactedURL(req *http.Request) string {
	u := *req.URL
	u.User, u.RawQuery, u.ForceQuery = nil, "", false
	return u.String()
}

// spanBody ends the client span once the answer's body has been read to
// its end, or closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		if err != io.EOF {
			tracing.RecordError(b.span, err)
		}
		b.end()
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

func (b *spanBody) end() { b.once.Do(func() { b.span.End() }) }
