//go:build unix

package main

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestCountSpans: the receiver's wire-format walk counts the spans of
// official OTLP messages, and those of kind server, gzip-compressed or not.
func TestCountSpans(t *testing.T) {
	span := func(kind tracepb.Span_SpanKind) *tracepb.Span {
		return &tracepb.Span{
			TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8), Name: "POST /charges", Kind: kind,
			Attributes: []*commonpb.KeyValue{{Key: "idemproxy.route", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "charges"}}}},
			Events:     []*tracepb.Span_Event{{Name: "idemproxy.wait"}},
		}
	}
	scope := func(spans ...*tracepb.Span) *tracepb.ScopeSpans {
		return &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: "idemproxy"}, Spans: spans}
	}
	res := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "idemproxy"}}}}}
	tests := []struct {
		name              string
		req               *coltracepb.ExportTraceServiceRequest
		spans, serverWant int64
	}{
		{"empty", &coltracepb.ExportTraceServiceRequest{}, 0, 0},
		{"one request's spans", &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
			Resource: res, ScopeSpans: []*tracepb.ScopeSpans{scope(span(tracepb.Span_SPAN_KIND_SERVER),
				span(tracepb.Span_SPAN_KIND_CLIENT), span(tracepb.Span_SPAN_KIND_CLIENT), span(tracepb.Span_SPAN_KIND_CLIENT))},
		}}}, 4, 1},
		{"two resources, scopes", &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
			{Resource: res, ScopeSpans: []*tracepb.ScopeSpans{scope(span(tracepb.Span_SPAN_KIND_SERVER)), scope(), scope(span(tracepb.Span_SPAN_KIND_INTERNAL))}},
			{ScopeSpans: []*tracepb.ScopeSpans{scope(span(tracepb.Span_SPAN_KIND_SERVER), span(tracepb.Span_SPAN_KIND_SERVER))}},
		}}, 4, 3},
	}
	for _, tt := range tests {
		b, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		var zipped bytes.Buffer
		zw := gzip.NewWriter(&zipped)
		zw.Write(b)
		zw.Close()
		for _, enc := range []string{"", "gzip"} {
			t.Run(tt.name+" "+enc, func(t *testing.T) {
				body := b
				if enc == "gzip" {
					body = zipped.Bytes()
				}
				r := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/x-protobuf")
				if enc != "" {
					r.Header.Set("Content-Encoding", enc)
				}
				spans, server, n, err := readExport(r)
				if err != nil {
					t.Fatalf("readExport: %v", err)
				}
				if spans != tt.spans || server != tt.serverWant || n != int64(len(body)) {
					t.Errorf("got %d spans, %d server, %d bytes; want %d, %d, %d", spans, server, n, tt.spans, tt.serverWant, len(body))
				}
			})
		}
	}
	t.Run("not OTLP", func(t *testing.T) {
		if _, _, err := countSpans([]byte{0x0a, 0x05, 0x01}); err == nil {
			t.Error("countSpans of a truncated message: got no error")
		}
	})
}
