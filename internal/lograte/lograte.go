// Package lograte bounds how often a repeated warning or error is logged,
// so that a failure that hits every request (a full disk, a store that is
// down) does not write a line per request and fill the disk it complains
// about.
//
// Records are counted by level and message, never by their attributes
// (which hold keys, addresses, errors: unbounded). In each interval, which
// starts at a message's first record, the first Burst records of a message
// are logged; the rest are counted, and when the interval ends one record
// with the same level and message and the attribute suppressed=K (K the
// records left out) is logged in their place. So the lines of a message
// plus its suppressed counts always add up to its records.
//
// Records below Warn (the access log, start and reload lines, debug) are
// never limited.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultBurst    = 10
	DefaultInterval = 10 * time.Second
	// DefaultMaxMessages bounds the messages tracked at once; records of
	// further messages share one allowance (their summary's message is
	// OverflowMessage).
	DefaultMaxMessages = 1024
)

// OverflowMessage is the message of the summary of records counted
// together because too many distinct messages were being tracked.
const OverflowMessage = "repeated log messages suppressed"

// Options configures New. Zero values mean the defaults.
type Options struct {
	// Burst is how many records of one message are logged per interval.
	Burst int
	// Interval is the length of a message's counting window.
	Interval time.Duration
	// MaxMessages bounds the messages tracked at once.
	MaxMessages int
}

// Handler is an slog.Handler that limits the rate of repeated warnings and
// errors; see the package documentation.
type Handler struct {
	next slog.Handler
	st   *state
}

type key struct {
	level slog.Level
	msg   string
}

type state struct {
	burst    int
	interval time.Duration
	max      int

	mu      sync.Mutex
	entries map[key]*entry
}

// entry counts one message's records in its current window.
type entry struct {
	start      time.Time
	n          int          // records in the window
	suppressed int          // of which not logged, not yet reported
	timer      *time.Timer  // reports suppressed at the window's end
	h          slog.Handler // the handler of the last suppressed record
}

// New returns a Handler that passes records to next.
func New(next slog.Handler, o Options) *Handler {
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.MaxMessages <= 0 {
		o.MaxMessages = DefaultMaxMessages
	}
	return &Handler{next: next, st: &state{burst: o.Burst, interval: o.Interval, max: o.MaxMessages, entries: map[key]*entry{}}}
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// WithAttrs implements slog.Handler; the derived handler shares the counts.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), st: h.st}
}

// WithGroup implements slog.Handler; the derived handler shares the counts.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), st: h.st}
}

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	st, now := h.st, time.Now()
	k := key{r.Level, r.Message}
	st.mu.Lock()
	e := st.entries[k]
	var report *summary
	if e != nil && now.Sub(e.start) >= st.interval {
		report = st.endLocked(k, e) // the timer has not run yet
		e = nil
	}
	if e == nil {
		if len(st.entries) >= st.max {
			st.sweepLocked(now)
		}
		if len(st.entries) >= st.max {
			k = key{r.Level, OverflowMessage}
			e = st.entries[k]
		}
		if e == nil {
			e = &entry{start: now}
			st.entries[k] = e
		}
	}
	e.n++
	if e.n <= st.burst {
		st.mu.Unlock()
		report.log()
		return h.next.Handle(ctx, r)
	}
	e.suppressed++
	e.h = h.next
	if e.timer == nil {
		e.timer = time.AfterFunc(e.start.Add(st.interval).Sub(now), func() { st.expire(k, e) })
	}
	st.mu.Unlock()
	report.log()
	return nil
}

// summary is the record that reports a window's suppressed records.
type summary struct {
	h     slog.Handler
	level slog.Level
	msg   string
	n     int
	every time.Duration
}

func (s *summary) log() {
	if s == nil {
		return
	}
	r := slog.NewRecord(time.Now(), s.level, s.msg, 0)
	r.AddAttrs(slog.Int("suppressed", s.n), slog.Duration("interval", s.every))
	s.h.Handle(context.Background(), r)
}

// endLocked ends e's window and removes it; it returns the summary to log,
// nil when nothing was suppressed.
func (st *state) endLocked(k key, e *entry) *summary {
	if e.timer != nil {
		e.timer.Stop()
	}
	if st.entries[k] == e {
		delete(st.entries, k)
	}
	if e.suppressed == 0 {
		return nil
	}
	s := &summary{h: e.h, level: k.level, msg: k.msg, n: e.suppressed, every: st.interval}
	e.suppressed = 0
	return s
}

// expire ends e's window when its timer runs.
func (st *state) expire(k key, e *entry) {
	st.mu.Lock()
	s := st.endLocked(k, e)
	st.mu.Unlock()
	s.log()
}

// sweepLocked removes the entries whose window has ended without a
// suppressed record (those with one have a timer that removes them).
func (st *state) sweepLocked(now time.Time) {
	for k, e := range st.entries {
		if e.suppressed == 0 && now.Sub(e.start) >= st.interval {
			delete(st.entries, k)
		}
	}
}

// Flush logs the summaries of every window that has suppressed records
// now, at once, for a program that is about to exit.
func (h *Handler) Flush() {
	st := h.st
	st.mu.Lock()
	var out []*summary
	for k, e := range st.entries {
		if s := st.endLocked(k, e); s != nil {
			out = append(out, s)
		}
	}
	st.mu.Unlock()
	for _, s := range out {
		s.log()
	}
}
