package badger

import (
	"context"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Commits.
//
// A commit needs no sync of its own (its loss in a power failure leaves the
// key in doubt, never charged twice: Options.SyncWrites), but its caller
// answers the client once it returns, so it returns only once its write is
// where a process crash (kill -9) cannot take it: committed to Badger (its
// memtable, whose own log is a shared mapping in the page cache) and, with
// SyncWrites, appended to the reservation log (the page cache too). The
// writer answers such a write right after the append, before the batch's
// fdatasync that the reservations in it wait for (writer.applyOnce). A
// commit whose batch fails returns the batch's error: the caller (the
// proxy's settler) retries it while the lease holds. Nothing of a commit is
// kept in memory only, where a crash would lose an answer a client got.

// Commit implements store.Store. It returns once the completed record is
// in Badger and, with SyncWrites, in the reservation log, neither yet
// synced (see above).
func (s *Store) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	return s.transition(ctx, "commit", key, token, func(rec *record) time.Duration {
		rec.State = store.StateCompleted
		rec.Lease = 0
		rec.Response = &resp
		return ttl
	})
}
