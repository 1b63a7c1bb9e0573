package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"
)

// The access log's own encoder must write exactly the lines slog's
// handlers would: operators parse them with the same rules as every
// other line of the process.
func TestAccessLogMatchesSlog(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 13, 4, 5, 123456789, time.UTC)
	entries := []entry{
		{route: "charges", method: "POST", path: "/charges", outcome: "committed", status: 201,
			duration: 1234567 * time.Nanosecond, upstream: 456 * time.Microsecond, keyHash: "0123456789abcdef"},
		{route: "", method: "GET", path: "/", outcome: "passthrough", status: 200, duration: 0},
		{route: "a b", method: "PO=ST", path: `/x"y\z`, outcome: "bad_request", status: 400,
			duration: 3 * time.Hour, upstream: time.Microsecond},
		{route: "ünï", method: "\t\n\r\x01\x7f", path: "/\u2028\u2029/\xff/<&>", outcome: "x", status: 599,
			duration: 999 * time.Nanosecond, keyHash: "k"},
		{route: "\u00a0", method: "M", path: "/%2F%20", outcome: "\u200b", status: 0, duration: 17 * time.Millisecond},
		// A path sent as /charges%7F is logged decoded, with a DEL alone.
		{route: "", method: "POST", path: "/charges\x7f", outcome: "passthrough", status: 404, duration: time.Millisecond},
	}
	for _, format := range []string{"json", "text"} {
		for _, e := range entries {
			var got, want bytes.Buffer
			l, err := NewAccessLog(&got, format)
			if err != nil {
				t.Fatal(err)
			}
			l.now = func() time.Time { return at }
			l.write(e)

			var h slog.Handler = slog.NewJSONHandler(&want, nil)
			if format == "text" {
				h = slog.NewTextHandler(&want, nil)
			}
			r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
			r.AddAttrs(slog.String("route", e.route), slog.String("method", e.method), slog.String("path", e.path),
				slog.String("outcome", e.outcome), slog.Int("status", e.status), slog.Float64("duration_ms", millis(e.duration)))
			if e.upstream > 0 {
				r.AddAttrs(slog.Float64("upstream_ms", millis(e.upstream)))
			}
			if e.keyHash != "" {
				r.AddAttrs(slog.String("key_hash", e.keyHash))
			}
			if err := h.Handle(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("%s line for %+v:\n got %s\nwant %s", format, e, got.String(), want.String())
			}
		}
	}
	if _, err := NewAccessLog(&bytes.Buffer{}, "xml"); err == nil {
		t.Error("NewAccessLog(xml): no error")
	}
}

func BenchmarkAccessLog(b *testing.B) {
	e := entry{route: "charges", method: "POST", path: "/charges", outcome: "committed", status: 201,
		duration: 1234567 * time.Nanosecond, upstream: 456 * time.Microsecond, keyHash: "0123456789abcdef"}
	for _, format := range []string{"json", "text"} {
		b.Run(format, func(b *testing.B) {
			l, _ := NewAccessLog(discard{}, format)
			b.ReportAllocs()
			for b.Loop() {
				l.write(e)
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
