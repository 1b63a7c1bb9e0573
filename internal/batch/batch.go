// Package batch is the queue behind the stores' group commit (Badger) and
// pipelining (Redis): callers put items, and one goroutine takes every item
// queued meanwhile, up to a bound, and handles them together.
package batch

import (
	"sync"
	"time"
)

// Queue hands the items put into it to its handler in batches. Its
// methods are safe for concurrent use.
type Queue[T any] struct {
	items  chan T
	mu     sync.RWMutex // held for reading while putting; Close takes it for writing
	closed bool
	exited chan struct{}
}

// New starts a queue whose handler gets batches of at most max items, in
// the order they were put. The handler runs on one goroutine, one batch at
// a time; it must not keep the slice.
func New[T any](max int, handle func([]T)) *Queue[T] {
	q := &Queue[T]{items: make(chan T, max), exited: make(chan struct{})}
	go q.loop(max, handle)
	return q
}

// Put queues item, waiting while the queue is full. It returns false, and
// queues nothing, once Close has begun.
func (q *Queue[T]) Put(item T) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return false
	}
	q.items <- item
	return true
}

// PutUntil is Put that gives up when stop fires first (the queue stays
// full because its handler is stuck). It reports whether item was queued,
// and whether the queue was closed.
func (q *Queue[T]) PutUntil(item T, stop <-chan time.Time) (queued, closed bool) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return false, true
	}
	select {
	case q.items <- item:
		return true, false
	case <-stop:
		return false, false
	}
}

// Len returns the number of items waiting for the handler.
func (q *Queue[T]) Len() int { return len(q.items) }

// Close stops taking items and returns when every queued item has been
// handled. Closing again just waits.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.items)
	}
	q.mu.Unlock()
	<-q.exited
}

func (q *Queue[T]) loop(max int, handle func([]T)) {
	defer close(q.exited)
	batch := make([]T, 0, max)
	for item := range q.items {
		batch = append(batch[:0], item)
	collect:
		for len(batch) < max {
			select {
			case item, ok := <-q.items:
				if !ok {
					break collect
				}
				batch = append(batch, item)
			default:
				break collect
			}
		}
		handle(batch)
		clear(batch)
	}
}
