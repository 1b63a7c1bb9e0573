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
