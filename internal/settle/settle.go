// Package settle retries, in the background, the store writes that settle
// a key once its request was answered: a commit, a release or an in-doubt
// mark that failed (a stalled store, a failed batch, a store being
// reopened). Giving up at once would leave the key in flight and then in
// doubt for its whole TTL, although its outcome is known.
//
// One Settler, made by the program, owns every such retry, whoever asks for
// it (the proxy, a store backend): one backoff, one shape of log line, and
// one place that waits for the retries, or cuts them off at a deadline,
// when the program stops. An owner that stops on its own (a store closing)
// takes a Group, whose jobs it stops and waits for without touching the
// others'.
//
// A retry never outlives the reservation it settles (Job.Until, its
// lease): past it, the key reads in doubt, and another request may hold
// it. A retry that finds the key taken over (store.ErrNotOwner) stops at
// once; one that cannot be written leaves the key in flight, in doubt when
// its lease ends, and never released.
//
// The settles waiting to retry are bounded (MaxRetrying, for the Settler
// New makes and all its Groups): each holds a goroutine and a timer, and a
// store that fails every write for a lease's length must not grow them
// without end. Past the bound a failed settle is not retried: it is left
// to its lease, as one whose lease ends before it could be written (the
// key in flight, then in doubt, never released, never charged twice), and
// counted (RegisterMetrics).
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/store"
)

// The backoff between attempts: the first retry waits FirstDelay, each
// next one twice as long as the one before, up to MaxDelay, and never past
// the job's Until.
const (
	FirstDelay = 50 * time.Millisecond
	MaxDelay   = time.Second
)

// MaxRetrying bounds the settles that wait to retry at once, in a Settler
// New makes and its Groups together; a settle that fails beyond it is left
// to its lease (see the package doc). With a retry's goroutine and timer
// at a few KiB, the bound holds them to some tens of MiB, while a replica
// settles far fewer than this in one lease unless its store is down.
const MaxRetrying = 10_000

// AttemptTimeout bounds one attempt (and no retry's attempt runs past the
// job's Until).
const AttemptTimeout = 5 * time.Second

// A Job is one store write that settles a key.
type Job struct {
	// Key is the store key settled; the log names its hash only.
	Key string
	// Operation names the write in the log: "commit", "release",
	// "mark_in_doubt".
	Operation string
	// Until is when retrying stops: the end of the reservation's lease.
	Until time.Time
	// Attempt makes the write once, within ctx.
	Attempt func(ctx context.Context) error
	// Done, when set, is called once the job ends: with nil after an
	// attempt succeeded, with the last error otherwise.
	Done func(err error)
	// Attrs are further log attributes (key-value pairs: the route).
	Attrs []any
	// StopAtClose ends the job's retries as soon as the program starts
	// to close, instead of at Until or the shutdown's deadline: for a
	// write whose Until is far off (the release of a reservation never
	// forwarded, retried until its TTL ends), which would otherwise hold
	// the shutdown for its whole deadline while the store is down.
	StopAtClose bool
}

// Settler runs Jobs in the background and keeps count of them. The zero
// value is not usable: New and Group make Settlers.
type Settler struct {
	log    *slog.Logger
	parent *Settler // counts this Group's jobs too; nil for New's
	ctx    context.Context
	cancel context.CancelFunc
	// closing ends when this Settler, or one above it, starts to close:
	// the jobs with StopAtClose end then.
	closing     context.Context
	stopClosing context.CancelFunc

	mu     sync.Mutex
	closed bool // no new jobs
	jobs   sync.WaitGroup

	// counts is New's Settler's, shared by its Groups.
	counts *counts
}

// counts are the retries of a Settler and its Groups: those waiting now,
// the bound on them, and the settles left to their leases, by reason.
type counts struct {
	limit    int64
	retrying atomic.Int64
	leftCap  atomic.Uint64 // past limit: never retried
	leftEnd  atomic.Uint64 // retried until the lease ended
	leftStop atomic.Uint64 // retrying when the program stopped
}

// New returns a Settler that logs to log (nil discards).
func New(log *slog.Logger) *Settler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	closing, stopClosing := context.WithCancel(context.Background())
	return &Settler{log: log, ctx: ctx, cancel: cancel, closing: closing, stopClosing: stopClosing,
		counts: &counts{limit: MaxRetrying}}
}

// Group returns a Settler whose jobs are also s's: closing s closes the
// Group, and s waits for the Group's jobs; closing the Group stops and
// waits for its own jobs only.
func (s *Settler) Group() *Settler {
	ctx, cancel := context.WithCancel(s.ctx)
	closing, stopClosing := context.WithCancel(s.closing)
	return &Settler{log: s.log, parent: s, ctx: ctx, cancel: cancel, closing: closing, stopClosing: stopClosing,
		counts: s.counts}
}

// RegisterMetrics registers s's metrics on reg: the settles waiting to
// retry, and those left to their leases, by reason. They are read when
// scraped; a nil s reads zero.
func RegisterMetrics(reg prometheus.Registerer, s *Settler) {
	c := &counts{}
	if s != nil {
		c = s.counts
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_settle_retries_waiting",
		Help: "Commits, releases and in-doubt marks that failed and wait to be retried (at most " + fmt.Sprint(MaxRetrying) + ").",
	}, func() float64 { return float64(c.retrying.Load()) }))
	for reason, n := range map[string]*atomic.Uint64{"retry_cap": &c.leftCap, "lease_ended": &c.leftEnd, "shutdown": &c.leftStop} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idemproxy_settle_left_to_lease_total",
			Help:        "Settles that were not written, their keys left in flight and in doubt when their leases end, by reason.",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(n.Load()) }))
	}
}

// startRetry counts a settle waiting to retry, unless MaxRetrying of them
// wait already.
func (c *counts) startRetry() bool {
	if c.retrying.Add(1) > c.limit {
		c.retrying.Add(-1)
		return false
	}
	return true
}

// enter counts a new job, and reports false once s (or a Settler above
// it) takes no more.
func (s *Settler) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || (s.parent != nil && !s.parent.enter()) {
		return false
	}
	s.jobs.Add(1)
	return true
}

func (s *Settler) leave() {
	s.jobs.Done()
	if s.parent != nil {
		s.parent.leave()
	}
}

// Settle takes err, the result of the first attempt of j, which the caller
// made itself. On a failure other than store.ErrNotOwner, it retries j in
// the background while j.Until is ahead, and reports whether it does. When
// it does not, it logs how the key was left and calls j.Done.
func (s *Settler) Settle(j Job, err error) (retrying bool) {
	switch {
	case err == nil:
		s.end(j, nil)
		return false
	case errors.Is(err, store.ErrNotOwner):
		s.takenOver(j, 1)
		s.end(j, err)
		return false
	case !time.Now().Before(j.Until):
		s.counts.leftEnd.Add(1)
		s.gaveUp(j, 1, err)
		s.end(j, err)
		return false
	case !s.enter(): // closed: the program stops
		s.counts.leftStop.Add(1)
		s.gaveUp(j, 1, err)
		s.end(j, err)
		return false
	case !s.counts.startRetry():
		s.leave()
		s.counts.leftCap.Add(1)
		s.log.Error("store failed to settle a key, and too many settles wait to retry; it will be in doubt when its lease ends",
			s.attrs(j, 1, err, "waiting", s.counts.limit)...)
		s.end(j, err)
		return false
	}
	s.log.Warn("settling a key failed; retrying while the lease holds", s.attrs(j, 1, err, "until", j.Until)...)
	go s.retry(j, err)
	return true
}

// retry retries j until it succeeds, the key is taken over, j.Until
// passes or s is aborted. Its first attempt failed with err.
func (s *Settler) retry(j Job, err error) {
	defer s.leave()
	defer s.counts.retrying.Add(-1)
	attempt := 1
	defer s.recover(j, &attempt, &err)
	for delay := FirstDelay; ; delay = min(2*delay, MaxDelay) {
		wait := time.NewTimer(min(delay, max(time.Until(j.Until), 0)))
		var closing <-chan struct{} // nil: never
		if j.StopAtClose {
			closing = s.closing.Done()
		}
		select {
		case <-s.ctx.Done():
		case <-closing:
		case <-wait.C:
		}
		if s.ctx.Err() != nil || j.StopAtClose && s.closing.Err() != nil {
			wait.Stop()
			s.counts.leftStop.Add(1)
			s.log.Error("settling stopped: shutting down; the key will be in doubt when its lease ends",
				s.attrs(j, attempt, err)...)
			s.end(j, err)
			return
		}
		attempt++
		ctx, cancel := context.WithTimeout(s.ctx, min(AttemptTimeout, max(time.Until(j.Until), time.Millisecond)))
		err = j.Attempt(ctx)
		cancel()
		switch {
		case err == nil:
			s.log.Info("key settled on retry", s.attrs(j, attempt, nil)...)
		case errors.Is(err, store.ErrNotOwner):
			s.takenOver(j, attempt)
		case !time.Now().Before(j.Until):
			s.counts.leftEnd.Add(1)
			s.gaveUp(j, attempt, err)
		default:
			continue
		}
		s.end(j, err)
		return
	}
}

// Go makes one attempt of j in the background (j.Until is not used), and
// reports whether it could start it: it cannot once s is closed, and the
// caller then makes the attempt itself (Once) if it must. The attempt is
// not cut off by Close or Abort: it is one write, bounded by
// AttemptTimeout, and what it would leave behind (a reservation that may
// exist, in flight and then in doubt) is worse than the wait. A failure is
// logged at debug level only: Go is for writes that may find nothing to do
// (the release of a reservation that may not exist).
func (s *Settler) Go(j Job) bool {
	if !s.enter() {
		return false
	}
	go func() {
		defer s.leave()
		s.Once(j)
	}()
	return true
}

// Once makes one attempt of j in the caller's goroutine, as Go does in the
// background, a panic included.
func (s *Settler) Once(j Job) {
	attempt := 1
	var err error
	defer s.recover(j, &attempt, &err)
	ctx, cancel := context.WithTimeout(context.Background(), AttemptTimeout)
	err = j.Attempt(ctx)
	cancel()
	if err != nil {
		s.log.Debug("settling a key in the background failed", s.attrs(j, attempt, err)...)
	}
	s.end(j, err)
}

// recover turns a panicking attempt into a log line: in the background
// nothing else would catch it, and the whole process would go.
func (s *Settler) recover(j Job, attempt *int, err *error) {
	if p := recover(); p != nil {
		s.log.Error("settling a key panicked; it will be in doubt when its lease ends",
			append(s.attrs(j, *attempt, *err), "panic", fmt.Sprint(p))...)
		s.end(j, fmt.Errorf("settle: panic: %v", p))
	}
}

func (s *Settler) takenOver(j Job, attempt int) {
	s.log.Warn("reservation was taken over before it settled; left to its new owner", s.attrs(j, attempt, nil)...)
}

// gaveUp logs that j was not written: the reservation stays in flight and
// turns in doubt when its lease ends, never released, never charged twice.
func (s *Settler) gaveUp(j Job, attempt int, err error) {
	s.log.Error("store failed to settle a key; it will be in doubt when its lease ends", s.attrs(j, attempt, err)...)
}

func (s *Settler) end(j Job, err error) {
	if j.Done != nil {
		j.Done(err)
	}
}

// attrs are the attributes of every line about j: key_hash, operation,
// attempt (the attempts made), err when there is one, then j.Attrs and
// more.
func (s *Settler) attrs(j Job, attempt int, err error, more ...any) []any {
	a := make([]any, 0, 8+len(j.Attrs)+len(more))
	a = append(a, "key_hash", store.KeyHash(j.Key), "operation", j.Operation, "attempt", attempt)
	if err != nil {
		a = append(a, "err", err)
	}
	a = append(a, j.Attrs...)
	return append(a, more...)
}

// Close stops taking jobs and waits for those under way until ctx ends;
// then it stops them (an attempt under way has its context cancelled) and
// waits for them to return. Their keys are left in flight, in doubt when
// their leases end. Closing again waits again.
func (s *Settler) Close(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopClosing()
	done := make(chan struct{})
	go func() {
		s.jobs.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.cancel()
		<-done
	}
	// Every job has ended, and none can start: the context is let go,
	// which a Group's parent holds until then.
	s.cancel()
}

// Abort stops taking jobs and stops those under way at once, without
// waiting for them (Close does).
func (s *Settler) Abort() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
}
