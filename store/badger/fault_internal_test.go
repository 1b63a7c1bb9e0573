package badger

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// TestOnlyFaultsReopenTheStore: the Guard reopens the store (close, log
// replay, every request 503 meanwhile) only for an error typed as the
// store's own fault. An error nobody listed, as a check added elsewhere
// returns (a client's cancellation under a sentinel of its own, a refused
// value), is answered as it is and leaves the store open; a fault of
// Badger's reopens it.
func TestOnlyFaultsReopenTheStore(t *testing.T) {
	t.Parallel()
	errClientGone := errors.New("proxy: the client went away") // wraps no context error
	errTooLarge := errors.New("value too large")
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"a new sentinel for a cancelled request", fmt.Errorf("reserve: %w", errClientGone)},
		{"a cancellation under a sentinel of its own", fmt.Errorf("%w (%v)", errClientGone, context.Canceled)},
		{"a validation error", fmt.Errorf("badger: commit: %w: 9 MB", errTooLarge)},
		{"a damaged record", fmt.Errorf("decode record: %w", corrupt(errors.New("truncated")))},
		{"fencing", fmt.Errorf("badger: commit: %w", store.ErrNotOwner)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := openGuardInternal(t)
			if err := g.do(func(*Store) error { return tc.err }); err != tc.err {
				t.Fatalf("do = %v, want the operation's own error %v", err, tc.err)
			}
			if g.broken.Load() || g.Reopens() != 0 {
				t.Fatalf("the store was marked broken (reopens %d) by a caller's error: %v", g.Reopens(), tc.err)
			}
			if _, err := g.Reserve(context.Background(), "pay/-/after", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Errorf("Reserve after the error = %v, want the store serving", err)
			}
		})
	}
	t.Run("a fault of the store", func(t *testing.T) {
		g := openGuardInternal(t)
		err := g.do(func(s *Store) error {
			return s.update(func(txn *wtxn) error { panic("nil memtable") }) // Badger panicking in a batch
		})
		if !isFault(err) {
			t.Fatalf("do = %v, want a fault", err)
		}
		waitReopen(t, g, 1)
	})
}
