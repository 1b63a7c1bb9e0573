// Package logsink is the process's one writer to stderr: log lines and
// access-log lines go through it in order, the access log buffered.
package logsink

import (
	"io"
	"sync"
	"time"
)

// AccessFlushDelay bounds how long an access log line waits in the sink's
// buffer before it is written.
const AccessFlushDelay = 50 * time.Millisecond

// accessBufferSize is the buffer of access log lines; a full one is
// written at once.
const accessBufferSize = 32 << 10

// Sink is the process's log output. Lines written through it go out at
// once, after any access log lines still buffered (so the order holds);
// access log lines, written through lines(), are buffered and written
// together at most AccessFlushDelay later, saving a write system call per
// request. A process killed (kill -9, OOM) loses the access lines of its
// last AccessFlushDelay, never another line.
type Sink struct {
	mu    sync.Mutex
	w     io.Writer
	buf   []byte
	timer *time.Timer // armed while buf holds lines
}

func New(w io.Writer) *Sink {
	s := &Sink{w: w, buf: make([]byte, 0, accessBufferSize)}
	s.timer = time.AfterFunc(time.Hour, s.Flush)
	s.timer.Stop()
	return s
}

// Write writes p at once, after the buffered access lines.
func (s *Sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return s.w.Write(p)
}

// lines returns the writer of the access log: each Write is one whole
// line, buffered.
func (s *Sink) Lines() io.Writer { return bufferedLines{s} }

type bufferedLines struct{ s *Sink }

func (b bufferedLines) Write(p []byte) (int, error) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf)+len(p) > cap(s.buf) {
		s.flushLocked()
		if len(p) > cap(s.buf) {
			return s.w.Write(p)
		}
	}
	if len(s.buf) == 0 {
		s.timer.Reset(AccessFlushDelay)
	}
	s.buf = append(s.buf, p...)
	return len(p), nil
}

// Flush writes the buffered access lines.
func (s *Sink) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
}

func (s *Sink) flushLocked() {
	if len(s.buf) == 0 {
		return
	}
	s.timer.Stop()
	s.w.Write(s.buf) // a log that cannot be written is not worth stopping for
	s.buf = s.buf[:0]
}
