package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Duplicates that wait (concurrent: wait) for the request holding their
// key are coalesced per key on this replica: one poller reads the key's
// record for all of them, with the backoff one waiter had (5 ms doubling
// to 100 ms), and hands every waiter the record it finds settled. N waiters
// on one key cost the store one read per poll, not N. When the request
// holding the key is this replica's own, its settle (settleErr) wakes the
// poller at once; when it is another replica's, the poll finds its settle.

// maxPollDelay is the longest wait between two reads of a key waited on.
const maxPollDelay = 100 * time.Millisecond

// waiters are the keys waited on now. The zero value is ready to use.
type waiters struct {
	mu     sync.Mutex
	keys   map[string]*keyWait
	active atomic.Int32 // len(keys): a settle with none skips the lock
}

// keyWait is the wait of one key: its waiters and its poller's result.
type keyWait struct {
	n    int                // waiters (under waiters.mu)
	stop context.CancelFunc // ends the poll once no waiter is left
	wake chan struct{}      // buffered: a local settle of the key
	done chan struct{}      // closed once rec and err are set
	rec  *store.Record
	err  error
}

// waitSettled waits until the record under key, seen in flight as rec, is
// no longer in flight (nil when released), the deadline until passes (rec
// then) or ctx ends. The poll's reads carry ctx's values (its span) but
// not its end: they stop when no waiter is left.
func (p *Proxy) waitSettled(ctx context.Context, key string, rec *store.Record, until time.Time) (*store.Record, error) {
	kw := p.waiters.join(ctx, key, p.store)
	defer p.waiters.leave(key, kw)
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-kw.done:
		return kw.rec, kw.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return rec, nil
	}
}

// join counts a waiter of key, starting its poller for the first one.
func (w *waiters) join(ctx context.Context, key string, st store.Store) *keyWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	if kw == nil {
		if w.keys == nil {
			w.keys = map[string]*keyWait{}
		}
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		kw = &keyWait{stop: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
		w.keys[key] = kw
		w.active.Store(int32(len(w.keys)))
		go w.poll(pctx, key, kw, st)
	}
	kw.n++
	return kw
}

// leave uncounts a waiter of kw; the last one stops its poller.
func (w *waiters) leave(key string, kw *keyWait) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw.n--; kw.n == 0 {
		kw.stop()
		w.forget(key, kw)
	}
}

// forget removes kw as key's wait (under w.mu): a waiter that comes later
// starts a poll of its own.
func (w *waiters) forget(key string, kw *keyWait) {
	if w.keys[key] == kw {
		delete(w.keys, key)
		w.active.Store(int32(len(w.keys)))
	}
}

// settled wakes the poller of key, if any waits on it: a request of this
// replica has just settled it.
func (w *waiters) settled(key string) {
	if w.active.Load() == 0 {
		return
	}
	w.mu.Lock()
	kw := w.keys[key]
	w.mu.Unlock()
	if kw != nil {
		select {
		case kw.wake <- struct{}{}:
		default: // a wake is pending already
		}
	}
}

// poll reads key until its record is not in flight, the read fails or ctx
// ends (no waiter is left), and hands the result to kw's waiters.
func (w *waiters) poll(ctx context.Context, key string, kw *keyWait, st store.Store) {
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, maxPollDelay) {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kw.wake:
			t.Stop()
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		rec, err := st.Get(rctx, key)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil || rec == nil || rec.State != store.StateInFlight {
			w.mu.Lock()
			kw.rec, kw.err = rec, err
			close(kw.done)
			w.forget(key, kw)
			w.mu.Unlock()
			return
		}
	}
}
