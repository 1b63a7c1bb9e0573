package badger

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/internal/batch"
)

// Group commit.
//
// Every mutation of the store is a closure handed to s.update, which queues
// it for the store's single writer goroutine. The writer takes everything
// that is queued (up to maxBatchOps) and applies it in one Badger
// transaction: one commit, and with SyncWrites one append to the
// reservation log (wal.go) of every write the batch's closures made
// (recorded through wtxn, the transaction they are given), then one
// fdatasync of the log for the whole batch, if any write in it asked for
// one (reservations do; commits, releases and in-doubt marks do not: see
// Options.SyncWrites; they are answered before it, once appended).
// Closures of one batch run one after the other in the same
// transaction, so each sees the writes of those before it (two reservations
// of one key in one batch: the second finds the first), and since there is
// only one writer, transactions never conflict. Readers (Get) keep using
// concurrent read transactions.
//
// Each caller gets its own closure's error. A closure that fails may have
// written part of its changes into the transaction; the batch is then rerun
// without it in a fresh transaction (closures must therefore be safe to run
// again, as they were under the conflict retries before). A batch whose
// commit fails fails every caller in it: none of their writes happened.

// maxBatchOps bounds the closures applied in one transaction.
const maxBatchOps = 256

// errClosed is returned by update after Close.
var errClosed error = &fault{errors.New("badger: store is closed")}

// errStalled is returned by update when its batch was not applied within
// the writer's wait.
var errStalled error = &fault{errors.New("badger: the writer did not apply the write in time")}

// defaultWriteWait bounds how long update waits for its batch: far beyond
// a sync on a loaded disk, short enough that a stuck Badger answers 503s.
const defaultWriteWait = 10 * time.Second

// op is one queued mutation and the channel its result is sent on.
type op struct {
	fn   func(txn *wtxn) error
	sync bool // its batch must be synced before it is answered
	// then, when set, makes the op asynchronous: nobody waits on done,
	// and the writer calls then with the op's result instead (on its own
	// goroutine: then must be quick, and must not wait for the writer).
	then func(error)
	done chan error // buffered: the writer never blocks on it
}

// answer hands o its result. An asynchronous op goes back to the pool
// here, since nobody waits for it.
func (o *op) answer(err error) {
	if then := o.then; then != nil {
		o.fn, o.then = nil, nil
		opPool.Put(o)
		then(err)
		return
	}
	o.done <- err
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan error, 1)} }}

// timerPool holds the stopped timers of update's waits, one a mutation
// otherwise (three allocations each). Since Go 1.23 a stopped timer's
// channel holds no stale tick, so that Reset reuses one safely.
var timerPool sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	t.Stop()
	timerPool.Put(t)
}

// writer serialises the store's mutations into batched transactions.
type writer struct {
	db         *bdg.DB
	q          *batch.Queue[*op]
	syncWrites bool
	// wait bounds how long update waits for its batch to be applied.
	wait time.Duration

	// exclusive is held from a batch's commit to its sync; whatever else
	// writes to the database (value-log GC) holds it too, and a checkpoint
	// of the log cuts its segment under it.
	exclusive sync.Mutex

	// commit commits a batch's transaction and sync makes it durable;
	// tests replace them to fail a batch or count syncs.
	commit func(txn *bdg.Txn) error
	sync   func() error

	// wal, when set (SyncWrites), is the reservation log (wal.go): each
	// batch's mutations, recorded by rec, are appended to it after the
	// commit, and sync fdatasyncs it instead of syncing Badger.
	wal *wal
	rec walRecorder
	// applied and appliedBuf are the entry that sets appliedKey in each
	// batch's transaction, and its value (reused: no allocation).
	applied    bdg.Entry
	appliedBuf [8]byte
}

// wtxn is the writer's transaction: Badger's, whose writes are recorded
// for the reservation log when there is one. The closures of a batch write
// through it only, and it offers no write but the recorded ones (Set,
// SetEntry, Delete): Badger's transaction is a field only the writer uses
// (to commit, and to set the batch's applied mark, which the log's record
// carries as its sequence number), never embedded, so a new write path
// cannot bypass the log unseen (TestWtxnRecordsEveryWrite).
type wtxn struct {
	txn *bdg.Txn
	rec *walRecorder // nil without a log
	// seq is the sequence number the batch's log record will carry (with
	// a log): putAt stamps it into every record it writes.
	seq uint64
}

// Get reads k in the transaction, the batch's writes before it included.
// Badger's failure to read is a fault of the store (fault.go); a key that
// is not there is bdg.ErrKeyNotFound, as from Badger.
func (t *wtxn) Get(k []byte) (*bdg.Item, error) {
	item, err := t.txn.Get(k)
	if err != nil && !errors.Is(err, bdg.ErrKeyNotFound) {
		return nil, asFault(err)
	}
	return item, err
}

// SetEntry sets e in the transaction and records it.
func (t *wtxn) SetEntry(e *bdg.Entry) error {
	if err := t.txn.SetEntry(e); err != nil {
		return asFault(err)
	}
	if t.rec != nil {
		t.rec.set(e.Key, e.Value, e.UserMeta, e.ExpiresAt)
	}
	return nil
}

// Set sets k to v, without UserMeta or expiry, and records it.
func (t *wtxn) Set(k, v []byte) error { return t.SetEntry(bdg.NewEntry(k, v)) }

// Delete deletes k in the transaction and records it.
func (t *wtxn) Delete(k []byte) error {
	if err := t.txn.Delete(k); err != nil {
		return asFault(err)
	}
	if t.rec != nil {
		t.rec.del(k)
	}
	return nil
}

// newWriter starts the writer of db; with a log (l non-nil) batches are
// made durable by it, else by DB.Sync when syncWrites is set.
func newWriter(db *bdg.DB, syncWrites bool, l *wal) *writer {
	w := &writer{db: db, syncWrites: syncWrites, wait: defaultWriteWait,
		commit: func(txn *bdg.Txn) error { return txn.Commit() }, sync: db.Sync, wal: l}
	if l != nil {
		w.sync = l.sync
	}
	w.q = batch.New(maxBatchOps, w.apply)
	return w
}

// update runs fn in the next batch's read-write transaction and returns
// fn's error, or the batch's commit error. When the batch is not applied
// within w.wait (Badger stuck, say in a write stall on a failing disk), it
// returns errStalled rather than hang its caller: fn may still be applied
// later, as with any store error after which the caller cannot know.
func (w *writer) update(fn func(txn *wtxn) error, sync bool) error {
	o := opPool.Get().(*op)
	o.fn, o.sync = fn, sync
	timer := getTimer(w.wait)
	defer putTimer(timer)
	queued, closed := w.q.PutUntil(o, timer.C)
	if !queued {
		o.fn = nil
		opPool.Put(o)
		if closed {
			return errClosed
		}
		return errStalled
	}
	select {
	case err := <-o.done:
		o.fn = nil
		opPool.Put(o)
		return err
	case <-timer.C:
		// Abandoned: the writer still answers it on its buffered channel,
		// so it must not go back to the pool.
		return errStalled
	}
}

// updateAsyncWithin queues fn for the next batch and returns at once;
// then gets fn's error, or the batch's commit error, once the batch is
// applied. It returns an error, and then is never called, when fn could not
// be queued within wait or the writer is closed.
func (w *writer) updateAsyncWithin(fn func(txn *wtxn) error, then func(error), wait time.Duration) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	return w.queueAsync(fn, then, timer.C)
}

// queueAsync queues fn for the next batch, waiting at most until stop to
// queue it; see updateAsyncWithin.
func (w *writer) queueAsync(fn func(txn *wtxn) error, then func(error), stop <-chan time.Time) error {
	o := opPool.Get().(*op)
	o.fn, o.sync, o.then = fn, false, then
	queued, closed := w.q.PutUntil(o, stop)
	if !queued {
		o.fn, o.then = nil, nil
		opPool.Put(o)
		if closed {
			return errClosed
		}
		return errStalled
	}
	return nil
}

// close stops taking mutations and returns once the queued ones are
// applied.
func (w *writer) close() { w.q.Close() }

// apply applies batch in as few transactions as Badger's size limits
// allow, and answers every op in it.
func (w *writer) apply(batch []*op) {
	for len(batch) > 0 {
		batch = w.applyOnce(batch)
	}
}

// applyOnce applies the longest prefix of batch that fits in one
// transaction and answers its ops; it returns the ops left for the next
// transaction. An op whose closure fails is answered with its error and
// the others are rerun without it, in a fresh transaction.
func (w *writer) applyOnce(batch []*op) []*op {
	for {
		txn := &wtxn{txn: w.db.NewTransaction(true)}
		if w.wal != nil {
			w.rec.reset() // a discarded transaction's entries go with it
			txn.rec, txn.seq = &w.rec, w.wal.seq
		}
		n, failed := 0, false
		for n < len(batch) {
			err := recovered(func() error { return batch[n].fn(txn) })
			if err == nil && n > 0 && w.wal != nil && w.rec.size() > walBatchBytes {
				break // the log's record would be too large: as full
			}
			if err == nil {
				n++
				continue
			}
			if errors.Is(err, bdg.ErrTxnTooBig) && n > 0 {
				break // full: commit those before it, without its half
			}
			failedOp := batch[n]
			batch = slices.Delete(batch, n, n+1)
			failedOp.answer(err)
			failed = true
			break
		}
		if !failed && n == len(batch) && w.wal != nil && w.rec.entries > 0 {
			// The sequence number the batch's record will carry (only this
			// goroutine appends), in Badger and not in the log: replay
			// skips the records Badger holds (replayWAL). Not in a batch
			// that writes nothing, which has no record.
			setApplied(&w.applied, w.appliedBuf[:], w.wal.seq)
			if err := txn.txn.SetEntry(&w.applied); errors.Is(err, bdg.ErrTxnTooBig) && n > 1 {
				n-- // full: the last closure goes to the next transaction
			} else if err != nil {
				txn.txn.Discard()
				for _, o := range batch {
					o.answer(asFault(fmt.Errorf("commit batch: %w", err)))
				}
				return nil
			}
		}
		if failed || n < len(batch) {
			// Discard whatever the failed or overflowing closure wrote.
			txn.txn.Discard()
			if failed {
				if len(batch) == 0 {
					return nil
				}
				continue
			}
			rest := batch[n:]
			for head := batch[:n]; len(head) > 0; {
				head = w.applyOnce(head)
			}
			return rest
		}
		w.exclusive.Lock()
		var err error
		if w.wal != nil && w.rec.entries > 0 {
			// Room in the log first: a segment that cannot be made (a full
			// disk), or a broken log, fails the batch before Badger applies
			// it. Applied but answered as failed, a reservation would hold
			// its key for its TTL though its request was never forwarded.
			err = w.wal.room(int64(w.rec.size()))
		}
		if err == nil {
			err = w.commitTxn(txn)
		}
		txn.txn.Discard()
		if err == nil && w.wal != nil && w.rec.entries > 0 {
			// Applied, but maybe not logged: on failure, fail them all.
			err = w.wal.append(&w.rec)
		}
		if err == nil && w.syncWrites && slices.ContainsFunc(batch, func(o *op) bool { return o.sync }) {
			// Applied and logged, in the page cache, where a process crash
			// cannot take them: the ops that asked for no sync (commits,
			// whose answers go to clients now) do not wait for it.
			batch = answerUnsynced(batch)
			if err = w.sync(); err != nil {
				err = fmt.Errorf("sync: %w", err) // applied, but maybe not on disk: fail them all
			}
		}
		w.exclusive.Unlock()
		// No ErrConflict to retry: the writer is the only writer, and
		// Open turns conflict detection off (WithDetectConflicts).
		if err != nil {
			// Badger's commit, the log or the sync failed: the store's fault.
			err = asFault(fmt.Errorf("commit batch: %w", err))
		}
		for _, o := range batch {
			o.answer(err)
		}
		return nil
	}
}

// answerUnsynced answers the ops of batch that need no sync with success
// and returns the others, in batch's array.
func answerUnsynced(batch []*op) []*op {
	rest := batch[:0]
	for _, o := range batch {
		if o.sync {
			rest = append(rest, o)
		} else {
			o.answer(nil) // o may be reused from here on
		}
	}
	clear(batch[len(rest):])
	return rest
}

// commitTxn commits txn, turning Badger's panics into errors.
func (w *writer) commitTxn(txn *wtxn) error {
	return recovered(func() error {
		// A read first: without a memtable (a rotation that failed)
		// it panics here, recoverably, where the commit would make
		// Badger's write goroutine log.Fatalf (y.AssertTrue). Not
		// every closure reads before it writes.
		if _, err := txn.Get(memtableProbe); err != nil && !errors.Is(err, bdg.ErrKeyNotFound) {
			return err
		}
		return w.commit(txn.txn)
	})
}

// memtableProbe is the key the writer reads before each commit; it is never
// written, so the read goes to the database (the memtable first).
var memtableProbe = []byte("\x00idemproxy:memtable-probe")

// recovered runs fn and turns a panic into its error. A Badger that failed
// to rotate its memtable (its directory removed, no file descriptors left)
// panics on a nil memtable in the next transaction; in the writer goroutine
// that panic would end the process, while as an error it fails only the
// batch's callers (and the Guard reopens the store).
func recovered(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = asFault(fmt.Errorf("badger: panic: %v", p))
		}
	}()
	return fn()
}
