// Package otlptest is a real OTLP trace receiver for tests: an OTLP/HTTP
// endpoint (POST /v1/traces, protobuf, gzip or not) and an OTLP/gRPC one
// (opentelemetry.proto.collector.trace.v1.TraceService/Export), each
// decoding the official protobuf messages (go.opentelemetry.io/proto/otlp)
// into Spans a test can wait for and inspect.
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/idemproxy/idemproxy/internal/tracing"
)

// Span is a received span, flattened with its resource's service name.
type Span struct {
	Service  string
	Resource map[string]any // the resource's attributes, service.name included
	Scope    string
	Name     string
	Kind     tracepb.Span_SpanKind
	TraceID  string // lower-case hex
	SpanID   string
	ParentID string // "" for a root span
	Attrs    map[string]any
	Events   []Event
	Links    []Link
	Status   tracepb.Status_StatusCode
	Start    time.Time
	End      time.Time
}

// Event is a span's event.
type Event struct {
	Name  string
	Attrs map[string]any
}

// Link is a span's link to another span.
type Link struct {
	TraceID, SpanID string
	Attrs           map[string]any
}

// Attr returns the attribute key of s as a string ("" when absent), for
// got/want messages.
func (s Span) Attr(key string) string {
	v, ok := s.Attrs[key]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// HasEvent reports whether s has an event named name.
func (s Span) HasEvent(name string) bool {
	return slices.ContainsFunc(s.Events, func(e Event) bool { return e.Name == name })
}

// LinksTo reports whether s has a link to the span o (its trace and span
// IDs).
func (s Span) LinksTo(o Span) bool {
	return slices.ContainsFunc(s.Links, func(l Link) bool { return l.TraceID == o.TraceID && l.SpanID == o.SpanID })
}

func (s Span) String() string {
	var events []string
	for _, e := range s.Events {
		events = append(events, e.Name)
	}
	var links []string
	for _, l := range s.Links {
		links = append(links, l.TraceID+"-"+l.SpanID)
	}
	return fmt.Sprintf("%s %q kind=%v trace=%s span=%s parent=%s attrs=%v events=%v links=%v",
		s.Service, s.Name, s.Kind, s.TraceID, s.SpanID, s.ParentID, s.Attrs, events, links)
}

// Receiver collects the spans exported to it.
type Receiver struct {
	// Endpoint is what OTEL_EXPORTER_OTLP_ENDPOINT is set to for it:
	// "http://127.0.0.1:port".
	Endpoint string
	// Protocol is its OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf" or
	// "grpc".
	Protocol string

	mu       sync.Mutex
	spans    []Span
	requests int
	changed  chan struct{} // closed and replaced at every export
}

// Env returns the environment variables that send a process's spans here,
// quickly (a 50 ms batch delay), as "KEY=value" strings.
func (r *Receiver) Env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.Endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=" + r.Protocol,
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=50",
	}
}

// Setenv sets Env in the test's own environment (for a tracer provider
// built in the test process); t must not be parallel.
func (r *Receiver) Setenv(t testing.TB) {
	t.Helper()
	for _, kv := range r.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Tracing points the exporter's environment at r (Setenv) and returns a
// Tracing switched on, as tracing: {enabled: true} switches the proxy's,
// shut down (its last spans exported) when the test ends.
func (r *Receiver) Tracing(t testing.TB) *tracing.Tracing {
	t.Helper()
	r.Setenv(t)
	tr := tracing.New(nil)
	if err := tr.Configure(true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return tr
}

// NewHTTP starts an OTLP/HTTP receiver, closed when the test ends.
func NewHTTP(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{Protocol: "http/protobuf", changed: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP trace export", http.StatusNotFound)
			return
		}
		if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&msg)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.Endpoint = srv.URL
	return r
}

// NewGRPC starts an OTLP/gRPC receiver, stopped when the test ends.
func NewGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listen: %v", err)
	}
	r := &Receiver{Protocol: "grpc", Endpoint: "http://" + ln.Addr().String(), changed: make(chan struct{})}
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, grpcService{r: r})
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return r
}

type grpcService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(msg *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		resource := attrs(rs.GetResource().GetAttributes())
		service := fmt.Sprint(resource["service.name"])
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Service: service, Resource: resource, Scope: ss.GetScope().GetName(), Name: s.GetName(), Kind: s.GetKind(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Attrs: attrs(s.GetAttributes()),
					Status: s.GetStatus().GetCode(),
					Start:  time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano()))}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), Attrs: attrs(e.GetAttributes())})
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()),
						SpanID: hex.EncodeToString(l.GetSpanId()), Attrs: attrs(l.GetAttributes())})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.requests++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	default:
		return nil
	}
}

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Exports returns how many export requests arrived.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// WaitFor waits up to timeout for the spans received to satisfy done, and
// returns them; it fails the test with what arrived when they do not.
func (r *Receiver) WaitFor(t testing.TB, timeout time.Duration, what string, done func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, changed := slices.Clone(r.spans), r.changed
		r.mu.Unlock()
		if done(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			var b strings.Builder
			for _, s := range spans {
				b.WriteString("\n  " + s.String())
			}
			t.Fatalf("otlptest: after %v, no %s among the %d spans received:%s", timeout, what, len(spans), b.String())
			return nil
		}
	}
}

// Find returns the spans of spans for which match is true.
func Find(spans []Span, match func(Span) bool) []Span {
	var out []Span
	for _, s := range spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// Named matches spans by name.
func Named(name string) func(Span) bool { return func(s Span) bool { return s.Name == name } }

// WithAttr matches spans whose attribute key, as Attr prints it, is value.
func WithAttr(key, value string) func(Span) bool {
	return func(s Span) bool { _, ok := s.Attrs[key]; return ok && s.Attr(key) == value }
}

// OfKind matches spans of kind k.
func OfKind(k tracepb.Span_SpanKind) func(Span) bool {
	return func(s Span) bool { return s.Kind == k }
}

// All matches the spans every one of match matches.
func All(match ...func(Span) bool) func(Span) bool {
	return func(s Span) bool {
		for _, m := range match {
			if !m(s) {
				return false
			}
		}
		return true
	}
}

// ChildrenOf returns the spans of spans whose parent is parent.
func ChildrenOf(spans []Span, parent Span) []Span {
	return Find(spans, func(s Span) bool { return s.ParentID == parent.SpanID && s.TraceID == parent.TraceID })
}
