package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// Batching.
//
// The writes of the proxy's requests (Reserve, Commit, Release and
// MarkInDoubt) go through one batcher per Store, which runs one thing at a
// time while the database answers promptly. A write made while nothing
// runs is run at once by its caller, with the single statements, as if
// there were no batcher. Writes made while something runs wait in a queue;
// when it is done, everything queued (up to maxBatch) goes to the database
// as one statement, the batch statement of
// queries.go: one round trip, one transaction, one commit (one WAL flush,
// one wait for a synchronous standby) for all of them. There is no timer: a
// batch is what queued while the previous write was at the database. When
// what runs has been at the database for stallAfter (a row lock another
// session holds), the queued writes of other keys go in a batch of their
// own, up to maxRunning at once: a key's stalled write stalls its own
// batch, not the replica's writes. A queued write of a key at the database
// waits for it.
//
// Each write gets its own answer: a reservation whether it took the key
// and otherwise the record it found, a fenced write whether it changed the
// caller's record (ErrNotOwner otherwise). The outcome of the batch as a
// whole is that of one statement:
//
//   - It succeeded: every write in it is applied, or not, as its own answer
//     says.
//   - The server refused it with an error (a value it cannot take, a
//     deadlock with another proxy's batch, statement_timeout or a cancel
//     request: an ERROR, never sent once the commit is done): the
//     statement was rolled back, nothing of it is applied, and each caller
//     runs its write alone, so that only the write at fault fails (one
//     key's row locked past the timeout, a batch of large answers that
//     together outlast it).
//   - Anything else (the connection lost, a commit the synchronous standby
//     did not confirm, a reply after the deadline): the
//     outcome is unknown or not acknowledged as asked, and every caller in
//     the batch gets the error, as a single write would. The proxy answers
//     503, and takes back a reservation that may have been applied.
//
// A caller whose context ends stops waiting at once, with its context's
// error; its write may still be applied, as with a reply lost on the
// network. A queued write whose caller has gone is not sent. Writes of one
// key in one batch would change one row twice in one statement, which
// PostgreSQL does not order: only the first write of each key goes into a
// batch, the others wait for the next one.

// maxBatch bounds the writes of one batch.
const maxBatch = 128

// maxBatchBytes bounds the answers (bodies and headers) of the commits of
// one batch: a batch must take about as long as one of its writes alone,
// well inside statement_timeout, and 128 answers of max_stored_body_bytes
// (1 MiB by default) would not. A commit larger than it goes alone in its
// batch.
const maxBatchBytes = 1 << 20

// maxRunning is how many writes run alone and batches of one Store may be
// at the database at once. Normally one is: the next batch is what queued
// while it ran, and with two in flight the bench's database CPU per request
// doubled or tripled (batches half as large, twice the transactions) for no
// steady gain in requests per second on a 2-core machine. Another starts
// only when every one at the database has been there stallAfter (a row
// lock held by another session, a slow commit): one key's wait then stalls
// its own batch, not every write of the replica.
const maxRunning = 4

// stallAfter is how long the writes at the database may take before the
// writes queued behind them go in a batch of their own: far beyond a
// batch's round trip and commit, short enough that a row lock held
// elsewhere costs the other keys a fraction of a second.
const stallAfter = 100 * time.Millisecond

// maxQueued bounds the writes waiting for a batch: enough for every
// running batch's successor to be full. A write that finds the queue full
// runs alone, as if there were no batcher, unless a write of its key is
// at the database or queued: it queues behind it (past the bound, by
// writes of keys already there, each with its caller waiting).
const maxQueued = maxRunning * maxBatch

// The kinds of batched writes.
const (
	opReserve = iota
	opCommit
	opRelease
	opMarkInDoubt
)

// op is one write waiting for a batch.
type op struct {
	kind       int
	ctx        context.Context
	key, token string
	// opReserve.
	fingerprint string
	lease, ttl  int64 // microseconds; ttl also for opCommit and opMarkInDoubt
	epoch       string
	origin      string
	// opCommit.
	meta string
	body []byte

	done chan struct{} // closed when the fields below are set
	// err is the batch's error, which is the write's.
	err error
	// alone: the batch did not settle the write; its caller runs it
	// alone.
	alone bool
	// changed: the fenced write changed the caller's record; reserved: the
	// reservation took the key, else rec is the live record it found (nil:
	// none seen, alone is set).
	changed, reserved bool
	rec               *store.Record
}

// batcher queues the writes of a Store and runs them in batches.
type batcher struct {
	s  *Store
	mu sync.Mutex
	// running are the writes run alone and the batches at the database,
	// and when each started; while one started less than stallAfter ago,
	// or maxRunning run, writes queue.
	running map[*run]time.Time
	// busy counts the writes at the database by key: a queued write of a
	// busy key waits for it (one row changed by two batches at once would
	// wait for itself, and a key whose row is locked elsewhere would stall
	// a second batch).
	busy map[string]int
	// The queue: each key's writes in the order they came (pending), and
	// the keys whose first write may go in the next batch, in the order
	// that write came (ready: not busy, each once). queued counts the
	// writes of pending.
	pending map[string][]*op
	ready   []string
	queued  int
	// timer, when set, dispatches again once the running writes count as
	// stalled.
	timer *time.Timer
	// noAlone makes every write go through a batch, even one made while
	// nothing runs (tests); serial runs one thing at a time whatever
	// stalls (tests that hold the queue behind one write).
	noAlone, serial bool
}

// run is one write run alone or one batch, at the database.
type run struct{ keys []string }

// enter reports whether o's caller runs it alone now: nothing runs, or
// the queue is full and no write of o's key is at the database or queued
// (a write runs after the earlier ones of its key: a release that ran
// alone before the reservation it takes back, still at the database,
// would find nothing to delete). The caller then calls leave with the
// returned run when done. Otherwise o is queued, and the caller waits for
// it.
func (b *batcher) enter(o *op) (*run, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if (len(b.running) == 0 && b.queued == 0 && !b.noAlone) ||
		(b.queued >= maxQueued && b.busy[o.key] == 0 && len(b.pending[o.key]) == 0) {
		return b.start([]string{o.key}), true
	}
	o.done = make(chan struct{})
	if b.pending == nil {
		b.pending = map[string][]*op{}
	}
	q := b.pending[o.key]
	if len(q) == 0 && b.busy[o.key] == 0 {
		b.ready = append(b.ready, o.key)
	}
	b.pending[o.key] = append(q, o)
	b.queued++
	b.dispatch()
	return nil, false
}

// leave ends a write run alone, and runs what queued meanwhile.
func (b *batcher) leave(r *run) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finish(r)
}

// start counts a run of keys at the database (b.mu held).
func (b *batcher) start(keys []string) *run {
	if b.running == nil {
		b.running, b.busy = map[*run]time.Time{}, map[string]int{}
	}
	r := &run{keys: keys}
	b.running[r] = time.Now()
	for _, k := range keys {
		b.busy[k]++
	}
	return r
}

// finish uncounts r and dispatches what queued (b.mu held).
func (b *batcher) finish(r *run) {
	delete(b.running, r)
	for _, k := range r.keys {
		if b.busy[k]--; b.busy[k] == 0 {
			delete(b.busy, k)
			if len(b.pending[k]) > 0 {
				b.ready = append(b.ready, k) // its next write's turn
			}
		}
	}
	b.dispatch()
}

// dispatch starts batches of the queue while nothing runs, or while every
// run has been at the database stallAfter, up to maxRunning; otherwise,
// with writes queued, it makes sure it is called again when the newest
// run counts as stalled (b.mu held).
func (b *batcher) dispatch() {
	for len(b.ready) > 0 && len(b.running) < maxRunning {
		newest := time.Time{}
		for _, at := range b.running {
			if at.After(newest) {
				newest = at
			}
		}
		if len(b.running) > 0 {
			if wait := stallAfter - time.Since(newest); b.serial || wait > 0 {
				if b.timer == nil && !b.serial {
					b.timer = time.AfterFunc(wait, func() {
						b.mu.Lock()
						defer b.mu.Unlock()
						b.timer = nil
						b.dispatch()
					})
				}
				return
			}
		}
		batch := b.take()
		if len(batch) == 0 {
			return // every queued key is busy: its run's finish dispatches
		}
		keys := make([]string, len(batch))
		for i, o := range batch {
			keys[i] = o.key
		}
		r := b.start(keys)
		go func() {
			b.s.runBatch(batch)
			b.leave(r)
		}()
	}
}

// take removes the next batch from the queue, with b.mu held: the first
// write of each ready key, up to maxBatch of them and answers of up to
// maxBatchBytes (or one write), in the order they came; the other writes
// of those keys wait for the batch. Its cost is the batch's size, not the
// queue's.
func (b *batcher) take() []*op {
	batch := make([]*op, 0, min(len(b.ready), maxBatch))
	size, n := 0, 0
	for _, k := range b.ready {
		o := b.pending[k][0]
		if len(batch) == maxBatch || (len(batch) > 0 && size+len(o.body)+len(o.meta) > maxBatchBytes) {
			break
		}
		batch = append(batch, o)
		size += len(o.body) + len(o.meta)
		n++
		if q := b.pending[k]; len(q) == 1 {
			delete(b.pending, k)
		} else {
			q[0] = nil
			b.pending[k] = q[1:]
		}
	}
	b.ready = b.ready[n:]
	b.queued -= n
	return batch
}

// wait waits until o is done or ctx ends, and returns ctx's error then.
func (o *op) wait(ctx context.Context) error {
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		select {
		case <-o.done: // done too: its answer is known
			return nil
		default:
		}
		return context.Cause(ctx)
	}
}

// batchable reports whether PostgreSQL's text can hold every string value
// of a write: one it refuses would fail the whole batch, so it is run alone
// and fails alone.
func batchable(vals ...string) bool {
	for _, v := range vals {
		if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// runBatch runs the writes of batch as one statement and answers each.
func (s *Store) runBatch(batch []*op) {
	live := batch[:0]
	for _, o := range batch {
		if err := o.ctx.Err(); err != nil { // its caller has gone: not sent
			o.err = context.Cause(o.ctx)
			close(o.done)
			continue
		}
		live = append(live, o)
	}
	if len(live) == 0 {
		return
	}
	// Rows are locked in the order of their keys within each kind, so that
	// two batches of different proxies wait for each other rather than
	// deadlock, as far as one statement allows.
	slices.SortFunc(live, func(a, b *op) int { return strings.Compare(a.key, b.key) })
	byKey := make(map[string]*op, len(live))
	var (
		rKey, rTok, rFp, rEpoch []string
		rOrigin                 []string
		rLease, rTTL            []int64
		rDeadline               []time.Time
		cKey, cTok, cMeta       []string
		cBody                   [][]byte
		cTTL                    []int64
		dKey, dTok              []string
		mKey, mTok              []string
		mTTL                    []int64
	)
	for _, o := range live {
		byKey[o.key] = o
		switch o.kind {
		case opReserve:
			rKey, rTok, rFp, rEpoch = append(rKey, o.key), append(rTok, o.token), append(rFp, o.fingerprint), append(rEpoch, o.epoch)
			rLease, rTTL, rOrigin = append(rLease, o.lease), append(rTTL, o.ttl), append(rOrigin, o.origin)
		case opCommit:
			cKey, cTok, cMeta = append(cKey, o.key), append(cTok, o.token), append(cMeta, o.meta)
			cBody, cTTL = append(cBody, o.body), append(cTTL, o.ttl)
		case opRelease:
			dKey, dTok = append(dKey, o.key), append(dTok, o.token)
		case opMarkInDoubt:
			mKey, mTok, mTTL = append(mKey, o.key), append(mTok, o.token), append(mTTL, o.ttl)
		}
	}
	err := s.run(context.Background(), func(ctx context.Context, c *pgxpool.Conn) error {
		// A try again after a lost session starts from scratch.
		for _, o := range live {
			o.reserved, o.changed, o.rec, o.err = false, false, nil, nil
		}
		rDeadline = rDeadline[:0]
		if len(rKey) > 0 {
			// Each reservation's deadline, on the database's clock, is its
			// caller's (see clock.go).
			off, unc, err := s.clock.get(ctx, c, s.statementTimeout)
			if err != nil {
				return err
			}
			for _, o := range live {
				if o.kind == opReserve {
					rDeadline = append(rDeadline, s.callerDeadline(o.ctx).Add(off-unc))
				}
			}
		}
		rows, err := c.Query(ctx, s.sql.batch, nonNil(rKey), nonNil(rTok), nonNil(rFp), nonNil(rLease), nonNil(rTTL), nonNil(rDeadline), nonNil(rEpoch), nonNil(rOrigin),
			nonNil(cKey), nonNil(cTok), nonNil(cMeta), nonNil(cBody), nonNil(cTTL),
			nonNil(dKey), nonNil(dTok),
			nonNil(mKey), nonNil(mTok), nonNil(mTTL))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				key            string
				ok             bool
				st, tok, fp    *string
				cr, lease, exp *time.Time
				meta, respBody []byte
				origin         *string
			)
			if err := rows.Scan(&key, &ok, &st, &tok, &fp, &cr, &lease, &exp, &meta, &respBody, &origin); err != nil {
				return err
			}
			o := byKey[key]
			if o == nil {
				return errors.New("the batch answered for a key it was not given")
			}
			switch {
			case o.kind != opReserve:
				o.changed = ok
			case ok:
				o.reserved = true
			case st != nil:
				// A record that cannot be read fails its own caller only,
				// as Get would.
				o.rec, o.err = decodeRecord(*st, *tok, *fp, *cr, lease, *exp, meta, respBody, origin)
			}
		}
		return rows.Err()
	})
	var pgErr *pgconn.PgError
	// A cancelled statement (57014) is rolled back too: a cancelled wait
	// for the synchronous standby is a WARNING on a success, which run
	// turns into errUnreplicated, not a PgError.
	alone := err != nil && errors.As(err, &pgErr) && !terminated(err) && severity(pgErr) == "ERROR"
	for _, o := range live {
		switch {
		case alone:
			// The server refused the statement, which changed nothing:
			// each write is tried alone, so that only one at fault fails.
			o.alone = true
		case err != nil:
			o.err = err
		case o.err != nil: // its record could not be read
		case o.kind == opReserve && !o.reserved && o.rec == nil:
			// Not taken and no record seen (one committed after the
			// statement's snapshot, the deadline past, the epoch marker
			// changed): the single statements sort it out.
			o.alone = true
		}
		close(o.done)
	}
}

// severity is err's severity, untranslated when the server says it.
func severity(err *pgconn.PgError) string {
	if err.SeverityUnlocalized != "" {
		return err.SeverityUnlocalized
	}
	return err.Severity
}

// nonNil returns s, or an empty slice for nil: pgx sends a nil slice as
// NULL, and unnest(NULL) has no rows anyway, but an empty array says what
// is meant.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
