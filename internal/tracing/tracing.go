// Package tracing is idemproxy's OpenTelemetry switch: a tracer provider
// that the configuration's tracing.enabled turns on and off (also by a
// reload), configured the standard way by the OTEL_* environment
// variables, and the few helpers the proxy, the reconciler and the admin
// API share to start their spans.
//
// A nil *Tracing, or one that is off, costs the callers one atomic load per
// request: they ask Tracer and skip every span when it returns nil.
package tracing

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every idemproxy span.
const ScopeName = "github.com/idemproxy/idemproxy"

// The idemproxy attributes of a request's server span (docs/observability.md
// lists them with the HTTP semantic conventions' own).
const (
	AttrRoute    = attribute.Key("idemproxy.route")
	AttrKeyHash  = attribute.Key("idemproxy.key_hash")
	AttrPolicy   = attribute.Key("idemproxy.policy")
	AttrStore    = attribute.Key("idemproxy.store")
	AttrOutcome  = attribute.Key("idemproxy.outcome")
	AttrReplayed = attribute.Key("idemproxy.replayed")
	AttrOperator = attribute.Key("idemproxy.operator")
)

// The events a request's server span can carry.
const (
	EventInDoubt             = "idemproxy.in_doubt"
	EventFingerprintMismatch = "idemproxy.fingerprint_mismatch"
	EventWait                = "idemproxy.wait"
	EventWaitEnd             = "idemproxy.wait_end"
)

// AttributeValueLengthLimit is how many characters of a span's string
// attribute are kept unless OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT say otherwise (the SDK keeps them
// whole): a client's headers (up to 64 KiB) would otherwise make a batch
// of spans larger than a collector accepts (4 MiB over gRPC by default),
// and the whole batch would be lost.
const AttributeValueLengthLimit = 1024

// Propagator reads and writes the W3C trace context (traceparent,
// tracestate) of requests.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Extract returns ctx carrying the trace context of a request's header h
// (traceparent, tracestate), its tracestate cut to the W3C's 512
// characters as the recommendation says (its members longer than 128
// characters first, then from the end): every span of the trace carries
// it, and a client's 16 KiB of it on each would make a batch of spans
// larger than a collector accepts, and the whole batch lost.
func Extract(ctx context.Context, h http.Header) context.Context {
	ctx = Propagator.Extract(ctx, propagation.HeaderCarrier(h))
	sc := trace.SpanContextFromContext(ctx)
	ts := sc.TraceState()
	if ts.Len() == 0 {
		return ctx
	}
	n := -1 // the header's length: members and the commas between them
	ts.Walk(func(k, v string) bool { n += len(k) + 1 + len(v) + 1; return true })
	if n <= maxTraceState {
		return ctx
	}
	var kept []string
	n = -1
	ts.Walk(func(k, v string) bool {
		m := len(k) + 1 + len(v)
		if m > maxTraceStateMember {
			return true
		}
		if n+1+m > maxTraceState {
			return false
		}
		kept, n = append(kept, k+"="+v), n+1+m
		return true
	})
	cut, err := trace.ParseTraceState(strings.Join(kept, ","))
	if err != nil { // cannot be: its members were parsed already
		cut = trace.TraceState{}
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(cut))
}

// The W3C's limits of a tracestate propagated: the whole header, and the
// members removed first when it must be cut.
const (
	maxTraceState       = 512
	maxTraceStateMember = 128
)

// Tracing holds the tracer provider from the first time tracing is turned
// on until Shutdown (a reload that turns it off keeps it for the spans of
// the requests in flight). The zero value (and nil) is off; Configure
// turns it on or off.
type Tracing struct {
	log *slog.Logger

	mu sync.Mutex // serialises Configure and Shutdown
	tp *sdktrace.TracerProvider
	// cur is the tracer while tracing is on, nil while off.
	cur atomic.Pointer[tracer]
}

type tracer struct{ trace.Tracer }

// New returns a Tracing that is off, logging to log (nil: discarded).
func New(log *slog.Logger) *Tracing {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Tracing{log: log}
}

// Tracer returns the tracer while tracing is on, nil while it is off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	if c := t.cur.Load(); c != nil {
		return c.Tracer
	}
	return nil
}

// On reports whether tracing is on.
func (t *Tracing) On() bool { return t != nil && t.cur.Load() != nil }

// Configure turns tracing on (enabled) or off. Turning it on the first
// time builds a tracer provider from the OTEL_* environment (CheckEnv's
// rules); OTEL_SDK_DISABLED=true keeps it off. Turning it off starts no
// more spans and flushes those buffered, in the background; the provider
// stays (until Shutdown), so that the requests in flight end and export
// their spans (a charge's span, which its replays link to, is not lost
// to a reload), and turning tracing on again takes it up. Configuring the
// state tracing is in already does nothing.
func (t *Tracing) Configure(enabled bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !enabled {
		if t.cur.Load() == nil {
			return nil
		}
		t.cur.Store(nil)
		tp := t.tp
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tp.ForceFlush(ctx); err != nil {
				t.log.Warn("tracing: flushing the last spans failed", "err", err)
			}
		}()
		t.log.Info("tracing off")
		return nil
	}
	if t.cur.Load() != nil {
		return nil
	}
	if t.tp != nil { // turned off by a reload, on again
		t.cur.Store(&tracer{t.tp.Tracer(ScopeName)})
		t.log.Info("tracing on again", "endpoint", endpoint(), "sampler", samplerName())
		return nil
	}
	if Disabled() {
		t.log.Warn("tracing.enabled is true, but OTEL_SDK_DISABLED=true: no traces")
		return nil
	}
	if err := CheckEnv(); err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	exp, proto, err := newExporter()
	if err != nil {
		return err
	}
	res, err := newResource()
	if err != nil {
		t.log.Warn("tracing: the OTEL_RESOURCE_ATTRIBUTES were partly ignored", "err", err)
	}
	otel.SetErrorHandler(errorHandler{t.log})
	limits := sdktrace.NewSpanLimits()
	if os.Getenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" && os.Getenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" {
		limits.AttributeValueLengthLimit = AttributeValueLengthLimit
	}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))
	t.cur.Store(&tracer{t.tp.Tracer(ScopeName)})
	t.log.Info("tracing on", "protocol", proto, "endpoint", endpoint(), "sampler", samplerName())
	return nil
}

// Shutdown flushes the buffered spans and turns tracing off, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tp == nil {
		return nil
	}
	tp := t.tp
	t.tp = nil
	t.cur.Store(nil)
	if err := tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing the last spans: %w", err)
	}
	return nil
}

// Disabled reports whether OTEL_SDK_DISABLED turns the SDK off.
func Disabled() bool {
	v, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")))
	return v
}

// CheckEnv reports every OTEL_* variable idemproxy reads whose value it
// cannot use: a protocol other than grpc or http/protobuf, an unknown
// sampler, a sampler argument that is not a ratio. nil when all are
// usable.
func CheckEnv() error {
	var errs []error
	if _, err := protocol(); err != nil {
		errs = append(errs, err)
	}
	switch s := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")); s {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
	case "traceidratio", "parentbased_traceidratio":
		if a := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG")); a != "" {
			if r, err := strconv.ParseFloat(a, 64); err != nil || r < 0 || r > 1 {
				errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", a))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not one of always_on, always_off, traceidratio, "+
			"parentbased_always_on, parentbased_always_off, parentbased_traceidratio", s))
	}
	return errors.Join(errs...)
}

// protocol returns the OTLP protocol the environment asks for:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else
// http/protobuf (the specification's default).
func protocol() (string, error) {
	name, v := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if v == "" {
		name, v = "OTEL_EXPORTER_OTLP_PROTOCOL", os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch v = strings.TrimSpace(v); v {
	case "":
		return "http/protobuf", nil
	case "grpc", "http/protobuf":
		return v, nil
	default:
		return "", fmt.Errorf("%s: %q is not supported (grpc or http/protobuf)", name, v)
	}
}

// newExporter returns the OTLP span exporter the environment asks for; the
// exporters read their endpoint, headers, timeout, compression and TLS
// settings from the OTEL_EXPORTER_OTLP_* variables themselves.
func newExporter() (sdktrace.SpanExporter, string, error) {
	proto, err := protocol()
	if err != nil {
		return nil, "", fmt.Errorf("tracing: %w", err)
	}
	ctx := context.Background()
	var exp sdktrace.SpanExporter
	if proto == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, "", fmt.Errorf("tracing: the %s exporter: %w", proto, err)
	}
	return exp, proto, nil
}

// newResource describes the process: service.name idemproxy (unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise) and its
// version.
func newResource() (*resource.Resource, error) {
	own := resource.NewSchemaless(semconv.ServiceName("idemproxy"))
	res, err := resource.Merge(resource.Default(), own)
	if err != nil {
		return resource.Default(), err
	}
	env, err := resource.New(context.Background(), resource.WithFromEnv())
	if merged, mErr := resource.Merge(res, env); mErr == nil {
		res = merged
	}
	return res, err
}

// endpoint is the collector's address for the start log: without the
// credentials or the query its URL may carry (the exporters use neither;
// authentication goes in OTEL_EXPORTER_OTLP_HEADERS).
func endpoint() string {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := os.Getenv(k); v != "" {
			u, err := url.Parse(v)
			if err != nil {
				return "(" + k + " is not a URL)"
			}
			u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
			return u.String()
		}
	}
	return "(the exporter's default: localhost)"
}

func samplerName() string {
	s := os.Getenv("OTEL_TRACES_SAMPLER")
	if s == "" {
		return "parentbased_always_on"
	}
	if a := os.Getenv("OTEL_TRACES_SAMPLER_ARG"); a != "" {
		return s + ":" + a
	}
	return s
}

// errorHandler logs the SDK's errors (an export that failed: the collector
// is down), at most one a minute.
type errorHandler struct{ log *slog.Logger }

var lastExportError atomic.Int64

func (h errorHandler) Handle(err error) {
	now := time.Now().UnixNano()
	last := lastExportError.Load()
	if now-last < int64(time.Minute) || !lastExportError.CompareAndSwap(last, now) {
		return
	}
	h.log.Warn("tracing: spans could not be exported (at most one such line a minute)", "err", err)
}

// Text returns s as a span's string may hold it: valid UTF-8, each invalid
// byte replaced by U+FFFD. OTLP's strings must be UTF-8: one string that is
// not (a path with %FF, a raw byte in a header) would make the exporter
// drop every span of its batch, a client's way to blind the traces.
func Text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// RecordError records err on span (an exception event) and sets the
// span's status to the error, both with err's message cleaned by Text: an
// error may quote what a peer sent (an upstream's reason phrase in
// ISO 8859-1), and one string that is not UTF-8 would cost the whole batch
// its spans.
func RecordError(span trace.Span, err error) {
	msg := err.Error()
	if utf8.ValidString(msg) {
		span.RecordError(err)
	} else {
		msg = Text(msg)
		span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(semconv.ExceptionType(errorType(err)), semconv.ExceptionMessage(msg)))
	}
	span.SetStatus(codes.Error, msg)
}

// SetError sets span's status to an error described by msg, cleaned by
// Text.
func SetError(span trace.Span, msg string) { span.SetStatus(codes.Error, Text(msg)) }

// errorType is the exception.type of err, as the SDK's RecordError names
// it.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// urlKey is the context key of WithURL's URL.
type urlKey struct{}

// WithURL returns ctx telling the traced transport to name its request's
// URL shown in the client span's url.full instead of the URL it sends: a
// lookup's URL holds the key, which the traces name only by its hash.
func WithURL(ctx context.Context, shown string) context.Context {
	return context.WithValue(ctx, urlKey{}, shown)
}

// URL returns the URL WithURL set in ctx, if any.
func URL(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(urlKey{}).(string)
	return u, ok
}

// Origin returns how a record keeps the span sc: "<trace ID>-<span ID>" in
// lower-case hex, or "" when sc was not sampled (a link to it would point
// at a span no backend has).
func Origin(sc trace.SpanContext) string {
	if !sc.IsSampled() || !sc.IsValid() {
		return ""
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	var b [49]byte
	hex.Encode(b[:32], tid[:])
	b[32] = '-'
	hex.Encode(b[33:], sid[:])
	return string(b[:])
}

// ParseOrigin returns the span context an Origin names; false for "" and
// anything else that is not one.
func ParseOrigin(s string) (trace.SpanContext, bool) {
	if len(s) != 49 || s[32] != '-' {
		return trace.SpanContext{}, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	if _, err := hex.Decode(tid[:], []byte(s[:32])); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(sid[:], []byte(s[33:])); err != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}
