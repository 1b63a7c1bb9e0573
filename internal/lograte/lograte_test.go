package lograte

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a concurrency-safe log output.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the JSON records written so far.
func (l *lines) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.buf.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// tally counts the records of msg written as themselves and those
// reported suppressed.
func tally(recs []map[string]any, msg string) (logged, suppressed int) {
	for _, r := range recs {
		if r["msg"] != msg {
			continue
		}
		if n, ok := r["suppressed"].(float64); ok {
			suppressed += int(n)
		} else {
			logged++
		}
	}
	return logged, suppressed
}

func newLogger(o Options) (*slog.Logger, *Handler, *lines) {
	out := &lines{}
	h := New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}), o)
	return slog.New(h), h, out
}

// TestRepeatedErrorsBounded: 1,000 identical errors from many goroutines,
// each with its own attributes, are logged Burst times; the rest are
// reported in one line whose count makes up the difference.
func TestRepeatedErrorsBounded(t *testing.T) {
	log, h, out := newLogger(Options{Interval: time.Hour})
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Go(func() {
			for i := range 100 {
				log.With("route", "charges").Error("store failed", "key_hash", fmt.Sprintf("%d-%d", g, i), "err", "disk full")
			}
		})
	}
	wg.Wait()
	logged, suppressed := tally(out.records(t), "store failed")
	if logged != DefaultBurst || suppressed != 0 {
		t.Errorf("before the window ends: %d lines, %d reported suppressed; want %d lines, none reported yet", logged, suppressed, DefaultBurst)
	}
	h.Flush()
	recs := out.records(t)
	logged, suppressed = tally(recs, "store failed")
	if logged != DefaultBurst || logged+suppressed != 1000 {
		t.Errorf("%d lines + %d suppressed, want %d lines and a sum of 1000", logged, suppressed, DefaultBurst)
	}
	if last := recs[len(recs)-1]; last["level"] != "ERROR" || last["suppressed"] != float64(1000-DefaultBurst) || last["route"] != "charges" {
		t.Errorf("summary line = %v, want level ERROR, suppressed %d and the logger's attributes", last, 1000-DefaultBurst)
	}
}

// TestWindowEndReportsSuppressed: when the interval ends, the suppressed
// count is logged without waiting for another record or a Flush, and the
// message is logged again in the next window.
func TestWindowEndReportsSuppressed(t *testing.T) {
	const every = 20 * time.Millisecond
	log, _, out := newLogger(Options{Burst: 2, Interval: every})
	for range 50 {
		log.Warn("upstream request failed")
	}
	accounted := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			logged, suppressed := tally(out.records(t), "upstream request failed")
			if logged+suppressed == want && suppressed > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d lines + %d suppressed, want them to add up to %d once the window ended", logged, suppressed, want)
			}
			time.Sleep(every)
		}
	}
	accounted(50)
	log.Warn("upstream request failed")
	accounted(51)
}

// TestLaterRecordReportsSuppressed: a record after the window ended, before
// its timer ran, reports the count first; nothing is counted twice.
func TestLaterRecordReportsSuppressed(t *testing.T) {
	log, h, out := newLogger(Options{Burst: 1, Interval: time.Hour})
	for range 5 {
		log.Error("store failed")
	}
	// End the window as if an hour had passed.
	h.st.mu.Lock()
	for _, e := range h.st.entries {
		e.start = e.start.Add(-time.Hour)
	}
	h.st.mu.Unlock()
	log.Error("store failed")
	h.Flush()
	recs := out.records(t)
	logged, suppressed := tally(recs, "store failed")
	if logged != 2 || suppressed != 4 {
		t.Errorf("%d lines + %d suppressed, want 2 + 4:\n%v", logged, suppressed, recs)
	}
	if len(recs) != 3 || recs[1]["suppressed"] != float64(4) {
		t.Errorf("records = %v, want the line, the count, the next window's line", recs)
	}
}

// TestWhatIsNotLimited: info and debug lines (the access log among them)
// are never limited, and each level and message has its own allowance.
func TestWhatIsNotLimited(t *testing.T) {
	log, h, out := newLogger(Options{Burst: 3, Interval: time.Hour})
	for range 100 {
		log.Info("request", "status", 503)
		log.Debug("redis: dial failed")
		log.Warn("store failed")
		log.Error("store failed")
		log.Error("another failure")
	}
	h.Flush()
	recs := out.records(t)
	for _, msg := range []string{"request", "redis: dial failed"} {
		if logged, suppressed := tally(recs, msg); logged != 100 || suppressed != 0 {
			t.Errorf("%s: %d lines, %d suppressed; want all 100, none suppressed", msg, logged, suppressed)
		}
	}
	count := map[string]int{}
	for _, r := range recs {
		if _, ok := r["suppressed"]; !ok {
			count[r["level"].(string)+" "+r["msg"].(string)]++
		}
	}
	for _, k := range []string{"WARN store failed", "ERROR store failed", "ERROR another failure"} {
		if count[k] != 3 {
			t.Errorf("%s: %d lines, want 3", k, count[k])
		}
	}
}

// TestManyMessagesBounded: messages that differ each time (an address in
// the text) cannot grow the counts without bound: past MaxMessages they
// share one allowance, reported under OverflowMessage.
func TestManyMessagesBounded(t *testing.T) {
	log, h, out := newLogger(Options{Burst: 2, Interval: time.Hour, MaxMessages: 4})
	for i := range 1000 {
		log.Warn(fmt.Sprintf("http: accept error from 10.0.%d.%d", i/256, i%256))
	}
	if n := len(h.st.entries); n > 4+1 {
		t.Errorf("%d messages tracked, want at most 5", n)
	}
	h.Flush()
	recs := out.records(t)
	_, suppressed := tally(recs, OverflowMessage)
	if logged := len(recs) - 1; logged != 4*1+2 || logged+suppressed != 1000 {
		t.Errorf("%d lines + %d suppressed, want 6 (4 messages, 2 of the rest) and a sum of 1000", logged, suppressed)
	}
}
