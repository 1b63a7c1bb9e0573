package settle_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
)

var errStalled = errors.New("store stalled")

// syncBuffer is a log destination safe for the settler's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newSettler() (*settle.Settler, *syncBuffer) {
	var buf syncBuffer
	return settle.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))), &buf
}

// ended returns a Job.Done that reports the job's final error on a channel.
func ended() (func(error), <-chan error) {
	c := make(chan error, 1)
	return func(err error) { c <- err }, c
}

func wait(t *testing.T, c <-chan error) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the job never ended")
		return nil
	}
}

// TestSettle: how a failed first attempt is followed up, by what the
// retries find.
func TestSettle(t *testing.T) {
	for _, tt := range []struct {
		name      string
		first     error
		until     time.Duration
		attempts  []error // the retries' results, the last one repeated
		retrying  bool
		wantErr   error
		wantTries int // attempts made by the settler
		wantLog   string
	}{
		{"success at once", nil, time.Minute, nil, false, nil, 0, ""},
		{"taken over at once", store.ErrNotOwner, time.Minute, nil, false, store.ErrNotOwner, 0, "taken over"},
		{"lease over", errStalled, -time.Second, nil, false, errStalled, 0, "in doubt when its lease ends"},
		{"settled on retry", errStalled, time.Minute, []error{errStalled, nil}, true, nil, 2, "key settled on retry"},
		{"taken over on retry", errStalled, time.Minute, []error{store.ErrNotOwner}, true, store.ErrNotOwner, 1, "taken over"},
		{"fails until the lease ends", errStalled, 300 * time.Millisecond, []error{errStalled}, true, errStalled, -1, "in doubt when its lease ends"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, log := newSettler()
			var tries atomic.Int32
			done, end := ended()
			j := settle.Job{Key: "pay/-/k", Operation: "commit", Until: time.Now().Add(tt.until), Done: done,
				Attempt: func(ctx context.Context) error {
					n := int(tries.Add(1))
					if _, ok := ctx.Deadline(); !ok {
						t.Error("an attempt without a deadline")
					}
					return tt.attempts[min(n, len(tt.attempts))-1]
				}}
			if got := s.Settle(j, tt.first); got != tt.retrying {
				t.Errorf("Settle = %v, want %v", got, tt.retrying)
			}
			if err := wait(t, end); !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("the job ended with %v, want %v", err, tt.wantErr)
			}
			if n := int(tries.Load()); tt.wantTries >= 0 && n != tt.wantTries || tt.wantTries < 0 && n == 0 {
				t.Errorf("%d retries, want %d", n, tt.wantTries)
			}
			s.Close(context.Background())
			if !strings.Contains(log.String(), tt.wantLog) {
				t.Errorf("log %q, want it to say %q", log, tt.wantLog)
			}
			if tt.first != nil && !strings.Contains(log.String(), "key_hash="+store.KeyHash("pay/-/k")) ||
				strings.Contains(log.String(), "pay/-/k") {
				t.Errorf("log %q, want the key's hash, never the key", log)
			}
		})
	}
}

// stuck returns a Job whose attempts fail until ctx is cancelled, and a
// channel closed at its first retry.
func stuck(key string) (settle.Job, <-chan struct{}, <-chan error) {
	retried := make(chan struct{})
	var once sync.Once
	done, end := ended()
	return settle.Job{Key: key, Operation: "release", Until: time.Now().Add(time.Hour), Done: done,
		Attempt: func(ctx context.Context) error {
			once.Do(func() { close(retried) })
			<-ctx.Done()
			return ctx.Err()
		}}, retried, end
}

// TestCloseCutsOffAtTheDeadline: Close waits for the retries under way
// until its context ends, then stops them (an attempt under way is
// cancelled) and returns once they have; no job is taken after it.
func TestCloseCutsOffAtTheDeadline(t *testing.T) {
	s, log := newSettler()
	j, retried, end := stuck("k")
	if !s.Settle(j, errStalled) {
		t.Fatal("not retried")
	}
	<-retried
	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan struct{})
	go func() { s.Close(ctx); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a retry was under way and its context had not ended")
	case <-end:
		t.Fatal("the retry ended before Close's context did")
	default:
	}
	cancel()
	<-closed
	if err := wait(t, end); err == nil {
		t.Error("the cut-off retry ended without an error")
	}
	if !strings.Contains(log.String(), "shutting down") {
		t.Errorf("log %q, want it to say the retry was stopped", log)
	}
	j2, _, _ := stuck("k2")
	if s.Settle(j2, errStalled) || s.Go(j2) {
		t.Error("a job was taken after Close")
	}
}

// TestGroup: closing a Group stops and waits for its own jobs, not the
// others'; closing the Settler stops the Group's too.
func TestGroup(t *testing.T) {
	s, _ := newSettler()
	g1, g2 := s.Group(), s.Group()
	j1, r1, end1 := stuck("k1")
	j2, r2, end2 := stuck("k2")
	g1.Settle(j1, errStalled)
	g2.Settle(j2, errStalled)
	<-r1
	<-r2
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g1.Close(ctx)
	select {
	case <-end1:
	default:
		t.Error("the Group's Close returned before its job ended")
	}
	select {
	case err := <-end2:
		t.Errorf("another Group's job ended (%v) when one Group was closed", err)
	default:
	}
	if g1.Go(j1) {
		t.Error("a closed Group took a job")
	}
	s.Close(ctx)
	select {
	case <-end2:
	default:
		t.Error("the Settler's Close returned before its Group's job ended")
	}
	if g2.Go(j2) {
		t.Error("the Group of a closed Settler took a job")
	}
}

// TestGoAndOnce: one attempt in the background, or in the caller's
// goroutine; a panic is logged and ends the job, never the process.
func TestGoAndOnce(t *testing.T) {
	s, log := newSettler()
	done, end := ended()
	if !s.Go(settle.Job{Key: "k", Operation: "release", Done: done, Attempt: func(context.Context) error { return nil }}) {
		t.Fatal("Go refused a job")
	}
	if err := wait(t, end); err != nil {
		t.Errorf("Go's job ended with %v", err)
	}
	done, end = ended()
	s.Once(settle.Job{Key: "k", Operation: "release", Done: done, Attempt: func(context.Context) error { panic("boom") }})
	if err := wait(t, end); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("a panicking attempt ended with %v, want the panic", err)
	}
	done, end = ended()
	s.Settle(settle.Job{Key: "k", Operation: "commit", Until: time.Now().Add(time.Minute), Done: done,
		Attempt: func(context.Context) error { panic("boom") }}, errStalled)
	if err := wait(t, end); err == nil {
		t.Error("a panicking retry ended without an error")
	}
	s.Close(context.Background())
	if got := strings.Count(log.String(), "panicked"); got != 2 {
		t.Errorf("%d panics logged, want 2:\n%s", got, log)
	}
}

// TestStopAtCloseEndsAtClose: a job with StopAtClose, retrying toward an
// Until a day away (the release of a reservation never forwarded, kept
// until its TTL), ends as soon as its settler closes, where it held the
// shutdown for its whole deadline; a job without it is still retried
// until the deadline stops it. The proxy's jobs run on a Group, which the
// program closes with no deadline of its own (CI: TestStoreDownLogsBounded
// on 7244c3e, where only the root's close ended them).
func TestStopAtCloseEndsAtClose(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stop  bool
		group bool
	}{
		{"root, StopAtClose", true, false},
		{"group, StopAtClose", true, true},
		{"root, retried", false, false},
		{"group, retried", false, true},
	} {
		root := settle.New(nil)
		s := root
		if tc.group {
			s = root.Group()
		}
		failing := errors.New("connection refused")
		done := make(chan error, 1)
		j := settle.Job{Key: "k", Operation: "release", Until: time.Now().Add(24 * time.Hour), StopAtClose: tc.stop,
			Attempt: func(context.Context) error { return failing }, Done: func(err error) { done <- err }}
		if !s.Settle(j, failing) {
			t.Fatalf("%s: Settle refused the job", tc.name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.Close(ctx)
		if tc.stop && ctx.Err() != nil {
			t.Errorf("%s: Close waited for its deadline (%v); want it to return when the job ended", tc.name, ctx.Err())
		}
		if !tc.stop && ctx.Err() == nil {
			t.Errorf("%s: Close returned before its deadline; want the job retried until then", tc.name)
		}
		cancel()
		if err := <-done; !errors.Is(err, failing) {
			t.Errorf("%s: the job ended with %v, want its last error", tc.name, err)
		}
		root.Close(context.Background())
	}
}
