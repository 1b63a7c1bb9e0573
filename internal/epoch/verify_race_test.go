package epoch

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// hookStore runs after() once, right after a read of the marker returns:
// what happens between Check's read and its step.
type hookStore struct {
	*memStore
	after func()
}

func (s *hookStore) Epoch(ctx context.Context) (*store.Epoch, error) {
	m, err := s.memStore.Epoch(ctx)
	if f := s.after; f != nil {
		s.after = nil
		f()
	}
	return m, err
}

// TestCheckNeverTrustsAMarkerReadBeforeAVerifiedLoss: Check reads an operator's acceptance;
// before it applies it, the store forgets again and a new connection's
// Verify turns the replica lost. Check then sets OK on the acceptance it
// read: the replica trusts an epoch the store no longer has (on a Redis
// Cluster, where reservations do not check the marker, it reserves on the
// empty store until its next check).
func TestCheckNeverTrustsAMarkerReadBeforeAVerifiedLoss(t *testing.T) {
	ms := &memStore{}
	hs := &hookStore{memStore: ms}
	now := time.Now()
	w := New(Options{Store: hs, Interval: time.Second, Grace: 0, Now: func() time.Time { return now }})
	if err := w.Check(context.Background()); err != nil || w.Err() != nil {
		t.Fatal(err, w.Err())
	}
	if _, _, err := Accept(context.Background(), ms, "op", "", now.Add(time.Second), 0); err != nil {
		t.Fatal(err)
	}
	hs.after = func() {
		ms.mu.Lock()
		ms.m = nil // the store forgets again
		ms.mu.Unlock()
		if err := w.Verify(nil); err == nil {
			t.Error("Verify(nil) on a trusted epoch returned nil")
		}
	}
	if err := w.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := w.Status(); st.State == OK {
		t.Fatalf("after Verify saw the store empty, Check left the replica OK on %s (the store has no marker)", st.Epoch.ID)
	}
}
