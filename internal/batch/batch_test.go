package batch

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestQueue: items queued while the handler is busy come in one batch, in
// order, bounded by max; Close handles what is queued and refuses more.
func TestQueue(t *testing.T) {
	var (
		mu      sync.Mutex
		batches [][]int
	)
	busy, release := make(chan struct{}), make(chan struct{})
	q := New(4, func(b []int) {
		if b[0] == 0 {
			close(busy)
			<-release
		}
		mu.Lock()
		batches = append(batches, slices.Clone(b))
		mu.Unlock()
	})
	q.Put(0)
	<-busy
	for i := 1; i <= 4; i++ {
		q.Put(i)
	}
	go func() { q.Put(5) }() // waits: the queue holds 4
	for deadline := time.Now().Add(5 * time.Second); q.Len() < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want 4", q.Len())
		}
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(batches)
		mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("batches %v, want 3", batches)
		}
	}
	q.Close()
	if q.Put(6) {
		t.Error("Put after Close queued an item")
	}
	want := [][]int{{0}, {1, 2, 3, 4}, {5}}
	if !slices.EqualFunc(batches, want, slices.Equal[[]int]) {
		t.Errorf("batches = %v, want %v", batches, want)
	}
}

// TestCloseWithAFullQueueReturnsPutsByTheirTimers: with the handler stuck
// and the queue full, a Close under way must not hold up PutUntil callers:
// the one waiting for room and those that come after Close began return
// (unqueued) instead of waiting for the write lock Close waits on.
func TestCloseWithAFullQueueReturnsPutsByTheirTimers(t *testing.T) {
	stuck, release := make(chan struct{}), make(chan struct{})
	q := New(2, func(b []int) {
		if b[0] == 0 {
			close(stuck)
			<-release
		}
	})
	defer close(release)
	q.Put(0)
	<-stuck
	q.Put(1)
	q.Put(2) // the queue is full
	hour := time.NewTimer(time.Hour)
	defer hour.Stop()
	waiting := make(chan bool)
	go func() { // waits for room, its timer far away
		queued, _ := q.PutUntil(3, hour.C)
		waiting <- queued
	}()
	for deadline := time.Now().Add(30 * time.Second); q.Len() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want 2", q.Len())
		}
	}
	time.Sleep(50 * time.Millisecond) // let the PutUntil above block on the full queue
	go q.Close()                      // waits for the stuck handler
	time.Sleep(50 * time.Millisecond)
	late := make(chan bool)
	go func() {
		timer := time.NewTimer(100 * time.Millisecond)
		defer timer.Stop()
		queued, _ := q.PutUntil(4, timer.C)
		late <- queued
	}()
	for name, ch := range map[string]chan bool{"the PutUntil waiting for room": waiting, "a PutUntil after Close began": late} {
		select {
		case queued := <-ch:
			if queued {
				t.Errorf("%s queued its item while the queue was closing", name)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not return in 30 s (Close holds it up)", name)
		}
	}
}
