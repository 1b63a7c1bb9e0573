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
	items chan T
	// mu guards closed and the count of puts under way (putting); a put
	// never holds it while it waits for room, so neither Close nor other
	// puts wait behind a put blocked on a full queue.
	mu      sync.RWMutex
	closed  bool
	putting sync.WaitGroup
	// closing is closed when Close begins: puts waiting for room give up.
	closing chan struct{}
	exited  chan struct{}
}

// New starts a queue whose handler gets batches of at most max items, in
// the order they were put. The handler runs on one goroutine, one batch at
// a time; it must not keep the slice.
func New[T any](max int, handle func([]T)) *Queue[T] {
	q := &Queue[T]{items: make(chan T, max), closing: make(chan struct{}), exited: make(chan struct{})}
	go q.loop(max, handle)
	return q
}

// Put queues item, waiting while the queue is full. It returns false, and
// queues nothing, once Close has begun (also when Close begins while it
// waits for room).
func (q *Queue[T]) Put(item T) bool {
	queued, _ := q.PutUntil(item, nil)
	return queued
}

// PutUntil is Put that gives up when stop fires first (the queue stays
// full because its handler is stuck). It reports whether item was queued,
// and whether the queue was closed. A nil stop waits for room or Close.
func (q *Queue[T]) PutUntil(item T, stop <-chan time.Time) (queued, closed bool) {
	if !q.begin() {
		return false, true
	}
	defer q.putting.Done()
	select {
	case q.items <- item:
		return true, false
	default:
	}
	select {
	case q.items <- item:
		return true, false
	case <-q.closing:
		return false, true
	case <-stop:
		return false, false
	}
}

// begin counts a put under way, unless Close has begun. Close waits for
// the puts it counted before it closes the channel they send on.
func (q *Queue[T]) begin() bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return false
	}
	q.putting.Add(1)
	return true
}

// Len returns the number of items waiting for the handler.
func (q *Queue[T]) Len() int { return len(q.items) }

// Close stops taking items and returns when every queued item has been
// handled; puts waiting for room when it begins return unqueued. Closing
// again just waits.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	first := !q.closed
	if first {
		q.closed = true
		close(q.closing)
	}
	q.mu.Unlock()
	if first {
		q.putting.Wait() // each returns at once: closing is closed
		close(q.items)
	}
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
