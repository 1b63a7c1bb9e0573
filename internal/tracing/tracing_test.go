package tracing_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/internal/testenv/otlptest"
	"github.com/idemproxy/idemproxy/internal/tracing"
)

func TestOriginRoundTrip(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	got := tracing.Origin(sampled)
	if want := "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"; got != want {
		t.Fatalf("Origin(sampled) = %q, want %q", got, want)
	}
	back, ok := tracing.ParseOrigin(got)
	if !ok || back.TraceID() != tid || back.SpanID() != sid || !back.IsSampled() {
		t.Errorf("ParseOrigin(%q) = %v, %v; want the same trace and span, sampled", got, back, ok)
	}
	if o := tracing.Origin(sampled.WithTraceFlags(0)); o != "" {
		t.Errorf("Origin(not sampled) = %q, want \"\": a link would name a span no backend has", o)
	}
	if o := tracing.Origin(trace.SpanContext{}); o != "" {
		t.Errorf("Origin(invalid) = %q, want \"\"", o)
	}
	for _, bad := range []string{"", "x", strings.Repeat("0", 32) + "-" + strings.Repeat("0", 16),
		"4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7", "4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7",
		"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7x"} {
		if _, ok := tracing.ParseOrigin(bad); ok {
			t.Errorf("ParseOrigin(%q) ok, want refused", bad)
		}
	}
}

func TestCheckEnv(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // "" for usable
	}{
		{map[string]string{}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not supported (grpc or http/protobuf)`},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "thrift"`},
		{map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}, ""},
		{map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1%"}, `OTEL_TRACES_SAMPLER_ARG: "1%" is not a ratio`},
		{map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, `OTEL_TRACES_SAMPLER: "sometimes" is not one of`},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "udp", "OTEL_TRACES_SAMPLER": "sometimes"}, `"udp" is not supported`},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
			t.Setenv(k, tc.env[k])
		}
		err := tracing.CheckEnv()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckEnv(%v) = %v, want nil", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckEnv(%v) = %v, want an error containing %q", tc.env, err, tc.want)
		}
	}
}

// TestConfigureExports turns tracing on against a real receiver over each
// protocol, and checks that a span arrives with the process's service name.
func TestConfigureExports(t *testing.T) {
	for _, tc := range []struct {
		name    string
		recv    func(testing.TB) *otlptest.Receiver
		service string // OTEL_SERVICE_NAME; "" leaves the default
		want    string
	}{
		{"http", otlptest.NewHTTP, "", "idemproxy"},
		{"grpc", otlptest.NewGRPC, "", "idemproxy"},
		{"http named", otlptest.NewHTTP, "payments-sidecar", "payments-sidecar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.recv(t)
			r.Setenv(t)
			t.Setenv("OTEL_SERVICE_NAME", tc.service)
			tr := tracing.New(nil)
			if tr.On() || tr.Tracer() != nil {
				t.Fatal("a new Tracing is on, want off")
			}
			if err := tr.Configure(true); err != nil {
				t.Fatal(err)
			}
			if !tr.On() {
				t.Fatal("Configure(true): off, want on")
			}
			_, span := tr.Tracer().Start(context.Background(), "probe")
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tr.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := r.WaitFor(t, 10*time.Second, "probe span", func(s []otlptest.Span) bool { return len(otlptest.Find(s, otlptest.Named("probe"))) > 0 })
			got := otlptest.Find(spans, otlptest.Named("probe"))[0]
			if got.Service != tc.want || got.Scope != tracing.ScopeName {
				t.Errorf("service, scope = %q, %q; want %q, %q", got.Service, got.Scope, tc.want, tracing.ScopeName)
			}
			if tr.On() {
				t.Error("after Shutdown: on, want off")
			}
		})
	}
}

// TestConfigureOffFlushes checks that turning tracing off (a reload) sends
// the spans still buffered, and that it can be turned on again.
func TestConfigureOffFlushes(t *testing.T) {
	r := otlptest.NewHTTP(t)
	r.Setenv(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // only a flush sends them
	tr := tracing.New(nil)
	for round, name := range []string{"first", "second"} {
		if err := tr.Configure(true); err != nil {
			t.Fatal(err)
		}
		_, span := tr.Tracer().Start(context.Background(), name)
		span.End()
		if err := tr.Configure(false); err != nil {
			t.Fatal(err)
		}
		if tr.Tracer() != nil {
			t.Fatalf("round %d: Configure(false) left a tracer", round)
		}
		r.WaitFor(t, 10*time.Second, name+" span", func(s []otlptest.Span) bool { return len(otlptest.Find(s, otlptest.Named(name))) > 0 })
	}
}

// TestSpanEndedAfterOffIsExported: a span started while tracing was on
// (a request in flight during the reload that turns it off) is exported
// when it ends, and no new span starts while off.
func TestSpanEndedAfterOffIsExported(t *testing.T) {
	r := otlptest.NewHTTP(t)
	r.Setenv(t)
	tr := tracing.New(nil)
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	if err := tr.Configure(true); err != nil {
		t.Fatal(err)
	}
	_, inFlight := tr.Tracer().Start(context.Background(), "in flight")
	_, ended := tr.Tracer().Start(context.Background(), "ended")
	ended.End()
	if err := tr.Configure(false); err != nil {
		t.Fatal(err)
	}
	// Turning off has flushed the spans that had ended.
	r.WaitFor(t, 10*time.Second, "the span ended before tracing was turned off", func(s []otlptest.Span) bool {
		return len(otlptest.Find(s, otlptest.Named("ended"))) > 0
	})
	inFlight.End()
	r.WaitFor(t, 10*time.Second, "the span ended after tracing was turned off", func(s []otlptest.Span) bool {
		return len(otlptest.Find(s, otlptest.Named("in flight"))) > 0
	})
	if tr.Tracer() != nil {
		t.Error("off: a tracer, want none")
	}
}

func TestSDKDisabled(t *testing.T) {
	r := otlptest.NewHTTP(t)
	r.Setenv(t)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	tr := tracing.New(nil)
	if err := tr.Configure(true); err != nil {
		t.Fatal(err)
	}
	if tr.On() {
		t.Error("OTEL_SDK_DISABLED=true: tracing on, want off")
	}
}

func TestConfigureRefusesAnUnknownProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	tr := tracing.New(nil)
	err := tr.Configure(true)
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("Configure(true) = %v, want an error naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
	if tr.On() {
		t.Error("after a refused Configure: on, want off")
	}
}

func TestNilTracingIsOff(t *testing.T) {
	var tr *tracing.Tracing
	if tr.On() || tr.Tracer() != nil {
		t.Error("a nil Tracing is on")
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of nil = %v", err)
	}
}

// TestStartLogLeavesCredentialsOut: the "tracing on" line names the
// collector without the credentials or query its URL may carry (which the
// exporters do not use, but an operator may have written).
func TestStartLogLeavesCredentialsOut(t *testing.T) {
	r := otlptest.NewHTTP(t)
	r.Setenv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", strings.Replace(r.Endpoint, "http://", "http://otel:s3cret@", 1)+"/?api_key=k3y")
	var log bytes.Buffer
	tr := tracing.New(slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	if err := tr.Configure(true); err != nil {
		t.Fatal(err)
	}
	got := log.String()
	if !strings.Contains(got, "tracing on") || !strings.Contains(got, strings.TrimPrefix(r.Endpoint, "http://")) {
		t.Errorf("log = %q, want the tracing on line with the collector's address", got)
	}
	for _, secret := range []string{"s3cret", "k3y"} {
		if strings.Contains(got, secret) {
			t.Errorf("log = %q, holds %q", got, secret)
		}
	}
}

// TestExtractCutsTraceState: a caller's tracestate past the W3C's 512
// characters loses its members longer than 128 characters, then members
// from its end, as the recommendation says; a shorter one is kept whole.
func TestExtractCutsTraceState(t *testing.T) {
	member := func(k string, n int) string { return k + "=" + strings.Repeat("v", n-len(k)-1) }
	var fifty []string // 10 members of 50 characters: 509 with the commas
	for i := range 10 {
		fifty = append(fifty, member(fmt.Sprintf("k%d", i), 50))
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"short", "a=1,b=2", "a=1,b=2"},
		{"at the limit", strings.Join(fifty, ","), strings.Join(fifty, ",")},
		{"long members first", member("big", 129) + "," + strings.Join(fifty, ","), strings.Join(fifty, ",")},
		{"then from the end", strings.Join(fifty, ",") + "," + member("z", 20), strings.Join(fifty, ",")},
		{"both", member("big", 200) + "," + strings.Join(fifty[:9], ",") + "," + member("y", 100), strings.Join(fifty[:9], ",")},
	} {
		h := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "Tracestate": {tc.in}}
		sc := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
		if !sc.IsValid() || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("%s: span context %v, want the caller's", tc.name, sc)
		}
		if got := sc.TraceState().String(); got != tc.want {
			t.Errorf("%s: tracestate (%d characters) = %q, want %q", tc.name, len(got), got, tc.want)
		}
	}
}
