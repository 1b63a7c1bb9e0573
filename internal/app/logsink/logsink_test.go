package logsink

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLogSinkOrderAndFlush(t *testing.T) {
	var out syncBuffer
	s := New(&out)
	access := s.Lines()
	access.Write([]byte("access 1\n"))
	access.Write([]byte("access 2\n"))
	if got := out.String(); got != "" {
		t.Errorf("access lines written at once: %q, want them buffered", got)
	}
	// Another line goes out at once, after the access lines before it.
	s.Write([]byte("warn\n"))
	if got, want := out.String(), "access 1\naccess 2\nwarn\n"; got != want {
		t.Errorf("after a warning: got %q, want %q", got, want)
	}
	// A buffered line goes out by itself within the flush delay.
	access.Write([]byte("access 3\n"))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasSuffix(out.String(), "access 3\n") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got, want := out.String(), "access 1\naccess 2\nwarn\naccess 3\n"; got != want {
		t.Errorf("after the flush delay: got %q, want %q", got, want)
	}
	// Flush (at exit) writes what is left.
	access.Write([]byte("access 4\n"))
	s.Flush()
	if !strings.HasSuffix(out.String(), "access 3\naccess 4\n") {
		t.Errorf("after Flush: got %q", out.String())
	}
}

func TestLogSinkFullBuffer(t *testing.T) {
	var out syncBuffer
	s := New(&out)
	line := strings.Repeat("x", 1000) + "\n"
	n := 0
	for len(out.String()) == 0 {
		s.Lines().Write([]byte(line))
		n++
		if n > accessBufferSize {
			t.Fatal("a full buffer was never written")
		}
	}
	if got := len(out.String()); got > accessBufferSize || got%len(line) != 0 {
		t.Errorf("wrote %d bytes at once, want whole lines within %d", got, accessBufferSize)
	}
	// A line larger than the buffer goes out whole, after the others.
	s.Flush()
	before := len(out.String())
	huge := strings.Repeat("y", 2*accessBufferSize) + "\n"
	s.Lines().Write([]byte(huge))
	if got := out.String()[before:]; got != huge {
		t.Errorf("huge line: wrote %d bytes, want %d", len(got), len(huge))
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
