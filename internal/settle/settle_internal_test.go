package settle

import (
	"context"
	"testing"
)

// TestClosedGroupLetsGoOfItsParent: a Group's context is a child of its
// parent's, which holds it until it is cancelled. Groups come and go for
// the program's whole life (one per Badger store a Guard reopens), so a
// closed Group must cancel its context, also when its Close found no job
// to cut off, or every reopen leaves one behind in the parent.
func TestClosedGroupLetsGoOfItsParent(t *testing.T) {
	s := New(nil)
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"waited for", context.Background()},
		{"past its deadline", expired},
	} {
		for range 100 { // Close picks at random when both are ready
			g := s.Group()
			g.Close(tc.ctx)
			if g.ctx.Err() == nil {
				t.Fatalf("%s: the closed Group's context is still live in its parent", tc.name)
			}
		}
	}
}
