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
// time. A write made while nothing runs is run at once by its caller, with
// the single statements, as if there were no batcher. Writes made while
// something runs wait in a queue; when it is done, everything queued (up to
// maxBatch) goes to the database as one statement, the batch statement of
// queries.go: one round trip, one transaction, one commit (one WAL flush,
// one wait for a synchronous standby) for all of them. There is no timer: a
// batch is what queued while the previous write was at the database.
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

// maxRunning is how many writes or batches of one Store may be at the
// database at once. One: with two, the bench's database CPU per request
// doubled or tripled (batches half as large, twice the transactions) for
// no steady gain in requests per second on a 2-core machine.
const maxRunning = 1

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
	// running is the number of writes run alone and batches at the
	// database; while it is maxRunning, writes queue.
	running int
	queue   []*op
	// noAlone makes every write go through a batch, even one made while
	// nothing runs (tests).
	noAlone bool
}

// enter reports whether o's caller runs it alone now: nothing runs. The
// caller then calls leave when done. Otherwise o is queued, and the caller
// waits for it.
func (b *batcher) enter(o *op) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running < maxRunning && len(b.queue) == 0 && !b.noAlone {
		b.running++
		return true
	}
	o.done = make(chan struct{})
	b.queue = append(b.queue, o)
	if b.running < maxRunning {
		b.running++
		go b.loop(b.take())
	}
	return false
}

// leave ends a write run alone, and runs what queued meanwhile.
func (b *batcher) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.running--
		return
	}
	go b.loop(b.take())
}

// take removes the next batch from the queue, with b.mu held: up to
// maxBatch writes of distinct keys, and answers of up to maxBatchBytes
// (or one write), in the order they were queued. The others stay, in
// their order.
func (b *batcher) take() []*op {
	batch := make([]*op, 0, min(len(b.queue), maxBatch))
	keys := make(map[string]bool, cap(batch))
	rest := b.queue[:0]
	size := 0
	for _, o := range b.queue {
		n := len(o.body) + len(o.meta)
		if len(batch) < maxBatch && !keys[o.key] && (len(batch) == 0 || size+n <= maxBatchBytes) {
			keys[o.key] = true
			batch = append(batch, o)
			size += n
			continue
		}
		rest = append(rest, o)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return batch
}

// loop runs batch, then the batches queued meanwhile, until the queue is
// empty.
func (b *batcher) loop(batch []*op) {
	for {
		b.s.runBatch(batch)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		batch = b.take()
		b.mu.Unlock()
	}
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
