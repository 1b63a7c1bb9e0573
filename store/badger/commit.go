package badger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/internal/settle"
	"github.com/idemproxy/idemproxy/store"
)

// Commits that do not wait.
//
// A commit needs no sync of its own (its loss leaves the key in doubt,
// never charged twice: Options.SyncWrites), so what its caller waits for
// is only the writer's round trip, on the path of every answer. Commit
// skips that wait when the store itself made the reservation it settles:
// the completed record is put in memory (pending), where Reserve and Get
// find it at once, and queued for the writer, whose batch writes it to
// Badger; once applied it leaves memory. Since the writer applies
// mutations in the order they were queued, a write queued after the
// commit (an admin release, say) finds it applied. A commit whose batch
// fails stays in memory and is written again by the settler
// (Options.Settler) while the reservation's lease holds (under a Guard,
// on the store the Guard has open: Guard.lostCommit); past the lease it is
// dropped and the key reads in doubt, as after
// a failed synchronous commit. Badger locks its directory, so this
// process's memory is the only other reader there is.
//
// The store knows which reservations it made (owned) from Reserve until
// they are settled; any other commit (a store reopened by the Guard, an
// owner the store does not know) takes the synchronous path, which reads
// the record; so do commits of answers larger than maxAsyncBody.

// maxAsyncBody is the largest answer body committed without waiting. A
// pending commit's body outlives its request (and the request's share of
// server.max_buffered_bytes) while the writer is behind: the writer's
// queue and batch hold up to 2 x maxBatchOps of them, plus those whose
// callers wait for room in the queue (at most the requests in flight), so
// this bounds that memory to a few tens of MiB even with the writer
// stuck. A larger answer's commit waits for the writer, as its request
// holds its bytes.
const maxAsyncBody = 64 << 10

// memo is what the store knows of its keys without reading Badger.
type memo struct {
	mu      sync.Mutex
	owned   map[string]record         // in-flight records this store wrote, not settled yet
	pending map[string]*pendingCommit // committed, not yet applied
	// sweepAt is the size of owned at which reservations whose lease
	// ended (never settled: the store failed them) are forgotten.
	sweepAt int
}

// pendingCommit is a completed record on its way to Badger.
type pendingCommit struct {
	rec       *record
	expiresAt uint64
}

func newMemo() memo {
	return memo{owned: map[string]record{}, pending: map[string]*pendingCommit{}, sweepAt: minSweep}
}

// minSweep is the least size of owned that is swept.
const minSweep = 1024

// own records a reservation the store just made, at now (unix ms).
func (m *memo) own(key string, r record, now int64) {
	m.mu.Lock()
	m.owned[key] = r
	if len(m.owned) >= m.sweepAt {
		for k, o := range m.owned {
			if o.Lease <= now {
				delete(m.owned, k)
			}
		}
		m.sweepAt = max(minSweep, 2*len(m.owned))
	}
	m.mu.Unlock()
}

// disown forgets the reservation under key if it carries token ("" for
// any).
func (m *memo) disown(key, token string) {
	m.mu.Lock()
	if r, ok := m.owned[key]; ok && (token == "" || r.Token == token) {
		delete(m.owned, key)
	}
	m.mu.Unlock()
}

// committed returns the pending commit under key, nil if there is none.
func (m *memo) committed(key string) *pendingCommit {
	m.mu.Lock()
	pc := m.pending[key]
	m.mu.Unlock()
	return pc
}

// settled removes pc from memory, unless another commit replaced it.
func (m *memo) settled(key string, pc *pendingCommit) {
	m.mu.Lock()
	if m.pending[key] == pc {
		delete(m.pending, key)
	}
	m.mu.Unlock()
}

// Commit implements store.Store. A commit of a reservation this store made
// returns once it is visible to Reserve and Get, before Badger has it
// (see above); any other is applied before Commit returns.
func (s *Store) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	s.mem.mu.Lock()
	r, ok := s.mem.owned[key]
	if !ok || r.Token != token || now.UnixMilli() >= r.Lease || len(resp.Body) > maxAsyncBody {
		s.mem.mu.Unlock()
		return s.commitNow(ctx, key, token, resp, ttl)
	}
	delete(s.mem.owned, key)
	lease := time.UnixMilli(r.Lease)
	r.State, r.Lease, r.Response = store.StateCompleted, 0, &resp
	pc := &pendingCommit{rec: &r, expiresAt: expiry(now, ttl)}
	s.mem.pending[key] = pc
	s.mem.mu.Unlock()
	c := &asyncCommit{s: s, lostCommit: lostCommit{key: key, token: token, resp: resp, ttl: ttl, lease: lease}, pc: pc}
	if err := s.w.updateAsync(c.apply, c.done); err != nil {
		s.mem.settled(key, pc)
		return fmt.Errorf("badger: commit: %w", err)
	}
	return nil
}

// commitNow is the synchronous commit: read, check the owner, write.
func (s *Store) commitNow(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	return s.transition(ctx, "commit", key, token, func(rec *record) time.Duration {
		rec.State = store.StateCompleted
		rec.Lease = 0
		rec.Response = &resp
		return ttl
	})
}

// lostCommit is a commit that was answered but could not be written:
// whoever takes it over writes it again until lease.
type lostCommit struct {
	key, token string
	resp       store.Response
	ttl        time.Duration
	lease      time.Time // the reservation's lease: retried until then
}

// asyncCommit is one commit on its way to Badger.
type asyncCommit struct {
	lostCommit
	s  *Store
	pc *pendingCommit
}

// apply writes the completed record if the stored one still carries the
// token (an operator may have released the key meanwhile).
func (c *asyncCommit) apply(txn *wtxn) error {
	k := []byte(c.key)
	cur, _, err := get(txn, k)
	if err != nil {
		return err
	}
	if cur == nil || cur.Token != c.token {
		return store.ErrNotOwner
	}
	if cur.State == store.StateCompleted {
		return nil // the first answer stays
	}
	cur.State, cur.Lease, cur.Response = store.StateCompleted, 0, c.pc.rec.Response
	return putAt(txn, k, cur, c.pc.expiresAt)
}

// done is called by the writer with the result of apply's batch. A failed
// write is handed to the settler, which writes it again while the lease
// holds; it stays in memory meanwhile.
func (c *asyncCommit) done(err error) {
	s := c.s
	if err == nil {
		s.mem.settled(c.key, c.pc)
		return
	}
	if s.lost != nil && !errors.Is(err, store.ErrNotOwner) {
		// The Guard has it written again, on a reopened store if this one
		// failed: this store's memory ends with it.
		s.mem.settled(c.key, c.pc)
		s.lost(c.lostCommit, err)
		return
	}
	s.settling.Settle(settle.Job{Key: c.key, Operation: "commit", Until: c.lease, Attempt: c.rewrite,
		Done: func(error) { s.mem.settled(c.key, c.pc) }}, err)
}

// rewrite queues apply again and waits for its batch, within ctx. A write
// whose wait ends with ctx may still be applied later; apply is safe to
// run again.
func (c *asyncCommit) rewrite(ctx context.Context) error {
	result := make(chan error, 1)
	if err := c.s.w.updateAsyncCtx(ctx, c.apply, func(err error) { result <- err }); err != nil {
		return err
	}
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
