package proxy

import (
	"context"
	"log/slog"
	"time"
)

// finish counts a handled request and writes its access log line.
func (p *Proxy) finish(a *attempt) {
	d := time.Since(a.start)
	route := a.routeName()
	a.series.requests.of(string(a.outcome)).Inc()
	a.series.duration.of(string(a.outcome)).Observe(d.Seconds())
	ctx := context.Background()
	if !p.log.Enabled(ctx, slog.LevelInfo) {
		return // the access log is off (-log-level warn or above): build nothing
	}
	attrs := append(make([]slog.Attr, 0, 8), // on the stack: room for every attribute
		slog.String("route", route),
		slog.String("method", a.in.Method),
		slog.String("path", a.loggedPath()),
		slog.String("outcome", string(a.outcome)),
		slog.Int("status", a.status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000))
	if a.upstream > 0 {
		attrs = append(attrs, slog.Float64("upstream_ms", float64(a.upstream.Microseconds())/1000))
	}
	if a.storeKey != "" {
		attrs = append(attrs, slog.String("key_hash", keyHash(a.storeKey)))
	}
	p.log.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
}

// loggedPath is the request's path as the client sent it, also when it was
// matched in cleaned form.
func (a *attempt) loggedPath() string {
	if u := a.sentURL(); u != nil {
		return u.EscapedPath()
	}
	return a.in.URL.Path
}
