package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/store"
)

// AccessLog writes the access log: one line per handled request, with
// level INFO and message "request", in the format of the process's slog
// handler ("json" as slog.JSONHandler writes it, "text" as
// slog.TextHandler does). It encodes its fixed fields itself: slog's
// generic path (attributes, floats through encoding/json) cost several
// percent of the CPU of a proxied request. Its methods are safe for
// concurrent use when its writer's are; each line is one Write.
type AccessLog struct {
	w    io.Writer
	text bool
	now  func() time.Time // tests pin the time
}

// NewAccessLog returns an access log that writes to w in format, "json"
// or "text".
func NewAccessLog(w io.Writer, format string) (*AccessLog, error) {
	switch format {
	case "json", "text":
		return &AccessLog{w: w, text: format == "text", now: time.Now}, nil
	}
	return nil, errors.New("access log: format " + strconv.Quote(format) + " is not json or text")
}

var lineBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// entry is one access log line's fields; zero upstream and an empty key
// hash are left out.
type entry struct {
	route, method, path, outcome string
	status                       int
	duration, upstream           time.Duration
	keyHash                      string
	reason                       string // why the proxy refused it (overloaded: "client", "budget"); empty: left out
	traceID                      string // the request's trace, when its span is sampled; empty: left out
}

func (l *AccessLog) write(e entry) {
	bp := lineBuffers.Get().(*[]byte)
	b := (*bp)[:0]
	t := l.now()
	if l.text {
		b = append(b, "time="...)
		b = t.AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
		b = append(b, " level=INFO msg=request"...)
		b = textField(b, "route", e.route)
		b = textField(b, "method", e.method)
		b = textField(b, "path", e.path)
		b = textField(b, "outcome", e.outcome)
		b = append(b, " status="...)
		b = strconv.AppendInt(b, int64(e.status), 10)
		b = append(b, " duration_ms="...)
		b = strconv.AppendFloat(b, millis(e.duration), 'g', -1, 64)
		if e.upstream > 0 {
			b = append(b, " upstream_ms="...)
			b = strconv.AppendFloat(b, millis(e.upstream), 'g', -1, 64)
		}
		if e.keyHash != "" {
			b = textField(b, "key_hash", e.keyHash)
		}
		if e.reason != "" {
			b = textField(b, "reason", e.reason)
		}
		if e.traceID != "" {
			b = textField(b, "trace_id", e.traceID)
		}
	} else {
		b = append(b, `{"time":"`...)
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","level":"INFO","msg":"request"`...)
		b = jsonField(b, "route", e.route)
		b = jsonField(b, "method", e.method)
		b = jsonField(b, "path", e.path)
		b = jsonField(b, "outcome", e.outcome)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(e.status), 10)
		b = append(b, `,"duration_ms":`...)
		b = strconv.AppendFloat(b, millis(e.duration), 'f', -1, 64)
		if e.upstream > 0 {
			b = append(b, `,"upstream_ms":`...)
			b = strconv.AppendFloat(b, millis(e.upstream), 'f', -1, 64)
		}
		if e.keyHash != "" {
			b = jsonField(b, "key_hash", e.keyHash)
		}
		if e.reason != "" {
			b = jsonField(b, "reason", e.reason)
		}
		if e.traceID != "" {
			b = jsonField(b, "trace_id", e.traceID)
		}
		b = append(b, '}')
	}
	b = append(b, '\n')
	l.w.Write(b)
	if cap(b) <= 4<<10 { // an odd huge line is not kept
		*bp = b
		lineBuffers.Put(bp)
	}
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func jsonField(b []byte, name, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendJSONString(b, v)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaped as slog's JSON
// handler does: quotes, backslashes and control characters; invalid UTF-8
// becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func textField(b []byte, name, v string) []byte {
	b = append(b, ' ')
	b = append(b, name...)
	b = append(b, '=')
	if textNeedsQuoting(v) {
		return strconv.AppendQuote(b, v)
	}
	return append(b, v...)
}

// textNeedsQuoting reports whether slog's text handler would quote s:
// empty, a space, '=', a quote or a control character below U+0020, or a
// rune that is not printable. DEL (0x7f) is not quoted: slog takes its
// safe bytes from encoding/json, which writes DEL as it is.
func textNeedsQuoting(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == '=' || c == '"' {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

// finish counts a handled request and writes its access log line.
func (p *Proxy) finish(a *attempt) {
	d := time.Since(a.start)
	a.series.requests.of(string(a.outcome)).Inc()
	a.observeDuration(a.series.duration.of(string(a.outcome)), d.Seconds())
	a.endSpan()
	ctx := context.Background()
	if p.access == nil && !p.log.Enabled(ctx, slog.LevelInfo) {
		return // the access log is off (-log-level warn or above): build nothing
	}
	e := entry{route: a.routeName(), method: a.in.Method, path: a.loggedPath(), outcome: string(a.outcome),
		status: a.status, duration: d, upstream: a.upstream, reason: a.reason}
	if a.storeKey != "" {
		e.keyHash = store.KeyHash(a.storeKey)
	}
	if a.span != nil {
		if sc := a.span.SpanContext(); sc.IsSampled() {
			e.traceID = sc.TraceID().String()
		}
	}
	if p.access != nil {
		p.access.write(e)
		return
	}
	attrs := append(make([]slog.Attr, 0, 10), // on the stack: room for every attribute
		slog.String("route", e.route),
		slog.String("method", e.method),
		slog.String("path", e.path),
		slog.String("outcome", e.outcome),
		slog.Int("status", e.status),
		slog.Float64("duration_ms", millis(e.duration)))
	if e.upstream > 0 {
		attrs = append(attrs, slog.Float64("upstream_ms", millis(e.upstream)))
	}
	if e.keyHash != "" {
		attrs = append(attrs, slog.String("key_hash", e.keyHash))
	}
	if e.reason != "" {
		attrs = append(attrs, slog.String("reason", e.reason))
	}
	if e.traceID != "" {
		attrs = append(attrs, slog.String("trace_id", e.traceID))
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
