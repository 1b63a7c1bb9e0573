package badger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

var _ store.ReconcileStore = (*Store)(nil)

// The lookup schedule lives on the records (record.NextLookup), so it
// survives restarts, and in an index of entries scheduleIndex + due time
// (8 bytes, big-endian ms) + record key, empty, with the record's expiry and
// UserMeta metaIndex: DueLookups reads the index in due order and stops at
// the first entry not yet due. The record is the truth: an entry whose record
// is gone, settled or rescheduled is stale and deleted when it comes due.
// Unscheduled, which runs rarely, scans the keys whose UserMeta says in
// flight or in doubt, reading only those values.

// scheduleIndex prefixes the index entries; record keys begin with a route
// name, never with a zero byte.
const scheduleIndex = "\x00rc/"

// metaIndex is the UserMeta of index entries.
const metaIndex byte = 4

func indexKey(due int64, key []byte) []byte {
	k := make([]byte, 0, len(scheduleIndex)+8+len(key))
	k = append(k, scheduleIndex...)
	k = binary.BigEndian.AppendUint64(k, uint64(due))
	return append(k, key...)
}

// reindex moves key's index entry from the due time old to new (0: none).
func reindex(txn *wtxn, key []byte, old, new int64, expiresAt uint64) error {
	if old == new {
		return nil
	}
	if old != 0 {
		if err := txn.Delete(indexKey(old, key)); err != nil {
			return err
		}
	}
	if new == 0 {
		return nil
	}
	e := bdg.NewEntry(indexKey(new, key), nil).WithMeta(metaIndex)
	e.ExpiresAt = expiresAt
	return txn.SetEntry(e)
}

// inDoubt reports whether rec is in doubt at now (ms): marked so, or in
// flight with a lapsed lease.
func inDoubt(rec *record, now int64) bool {
	return rec.State == store.StateInDoubt || (rec.State == store.StateInFlight && rec.Lease <= now)
}

// settleDoubt stores a lapsed in-flight record as in doubt, as Get already
// reports it. Its token stays: the original request may still commit.
func settleDoubt(rec *record) {
	rec.State = store.StateInDoubt
	rec.Lease = 0
}

// change is what a changeDoubt callback does with the record.
type change int

const (
	keep   change = iota // leave the record as it is
	write                // store the changed record
	remove               // delete the record
)

// changeDoubt applies fn to the in-doubt record under key inside one
// transaction, keeping the record's expiry and moving its index entry. It
// returns notInDoubt when there is no in-doubt record, and fn's error.
func (s *Store) changeDoubt(ctx context.Context, op, key string, notInDoubt error, fn func(rec *record, now int64) (change, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.update(func(txn *wtxn) error {
		k := []byte(key)
		rec, exp, err := get(txn, k)
		if err != nil {
			return err
		}
		now := s.now().UnixMilli()
		if rec == nil || !inDoubt(rec, now) {
			return notInDoubt
		}
		old := rec.NextLookup
		c, err := fn(rec, now)
		if err != nil || c == keep {
			return err
		}
		if c == remove {
			if err := reindex(txn, k, old, 0, exp); err != nil {
				return err
			}
			return txn.Delete(k)
		}
		if rec.State == store.StateInFlight {
			settleDoubt(rec)
		}
		if err := reindex(txn, k, old, rec.NextLookup, exp); err != nil {
			return err
		}
		return putAt(txn, k, rec, exp)
	})
	if err != nil && !isDomain(err) {
		return fmt.Errorf("badger: %s: %w", op, err)
	}
	return err
}

func isDomain(err error) bool {
	for _, d := range []error{store.ErrNotInDoubt, store.ErrLookupBusy, store.ErrNotDue, store.ErrNotOwner} {
		if errors.Is(err, d) {
			return true
		}
	}
	return false
}

// ScheduleLookup implements store.ReconcileStore.
func (s *Store) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	err := s.changeDoubt(ctx, "schedule lookup", key, store.ErrNotInDoubt, func(rec *record, now int64) (change, error) {
		if rec.NextLookup != 0 {
			return keep, nil
		}
		rec.NextLookup = now + after.Milliseconds()
		return write, nil
	})
	if errors.Is(err, store.ErrNotInDoubt) {
		return nil
	}
	return err
}

// UnscheduleLookup implements store.ReconcileStore.
func (s *Store) UnscheduleLookup(ctx context.Context, key string) error {
	err := s.changeDoubt(ctx, "unschedule lookup", key, store.ErrNotInDoubt, func(rec *record, now int64) (change, error) {
		rec.NextLookup = 0
		return write, nil
	})
	if errors.Is(err, store.ErrNotInDoubt) {
		return nil
	}
	return err
}

// ClaimLookup implements store.ReconcileStore.
func (s *Store) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error {
	return s.changeDoubt(ctx, "claim lookup", key, store.ErrNotInDoubt, func(rec *record, now int64) (change, error) {
		switch {
		case rec.LookupToken != "" && rec.LookupLease > now:
			return keep, store.ErrLookupBusy
		case !force && (rec.NextLookup == 0 || rec.NextLookup > now):
			return keep, store.ErrNotDue
		}
		rec.LookupToken = token
		rec.LookupLease = now + lease.Milliseconds()
		return write, nil
	})
}

// ResolveLookup implements store.ReconcileStore.
func (s *Store) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) error {
	return s.changeDoubt(ctx, "resolve lookup", key, store.ErrNotOwner, func(rec *record, now int64) (change, error) {
		if rec.LookupToken != token {
			return keep, store.ErrNotOwner
		}
		settleDoubt(rec)
		rec.LookupToken, rec.LookupLease = "", 0
		switch {
		case res.Release:
			return remove, nil
		case res.Applied != nil:
			rec.State = store.StateCompleted
			rec.Response = res.Applied
			rec.NextLookup = 0
		default:
			rec.NextLookup = now + res.RetryAfter.Milliseconds()
		}
		return write, nil
	})
}

// DueLookups implements store.ReconcileStore: it reads the index in due
// order, and deletes the stale entries it meets.
func (s *Store) DueLookups(ctx context.Context, limit int) ([]string, error) {
	var keys []string
	var stale [][]byte
	now := s.now().UnixMilli()
	err := s.view(func(txn *bdg.Txn) error {
		prefix := []byte(scheduleIndex)
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false, Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix) && len(keys) < limit; it.Next() {
			ik := it.Item().KeyCopy(nil)
			rest := ik[len(prefix):]
			if len(rest) <= 8 {
				stale = append(stale, ik)
				continue
			}
			due, k := int64(binary.BigEndian.Uint64(rest[:8])), rest[8:]
			if due > now {
				break
			}
			rec, _, err := get(txn, k)
			if errors.Is(err, errCorrupt) {
				// One undecodable record must not stop every lookup:
				// it is never looked up, and its entry goes.
				s.log.Error("in-doubt record cannot be decoded; not reconciled", "err", err)
				stale = append(stale, ik)
				continue
			}
			if err != nil {
				return err
			}
			switch {
			case rec == nil || !inDoubt(rec, now) || rec.NextLookup != due:
				stale = append(stale, ik)
			case rec.LookupToken == "" || rec.LookupLease <= now:
				keys = append(keys, string(k))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("badger: due lookups: %w", err)
	}
	for chunk := range slices.Chunk(stale, staleChunk) {
		err := s.update(func(txn *wtxn) error {
			for _, ik := range chunk {
				if err := txn.Delete(ik); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("badger: due lookups: delete stale index entries: %w", err)
		}
	}
	return keys, nil
}

// staleChunk is the most stale index entries deleted in one write. A write
// must fit in one Badger transaction, which holds some hundreds of entries
// of the longest keys (its limits follow from the memtable size): the
// stale entries met by one DueLookups, a few thousand after an operator
// released as many in-doubt keys, take several writes.
const staleChunk = 128

// Unscheduled implements store.ReconcileStore.
func (s *Store) Unscheduled(ctx context.Context, prefix string, limit int) ([]string, error) {
	var keys []string
	now := s.now().UnixMilli()
	err := s.view(func(txn *bdg.Txn) error {
		p := []byte(prefix)
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false, Prefix: p})
		defer it.Close()
		for it.Seek(p); it.ValidForPrefix(p) && len(keys) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			if m := item.UserMeta(); m != metaInDoubt && m != metaInFlight {
				continue
			}
			rec, _, err := get(txn, item.Key())
			if errors.Is(err, errCorrupt) {
				s.log.Error("in-doubt record cannot be decoded; not reconciled", "err", err)
				continue
			}
			if err != nil {
				return err
			}
			if rec != nil && inDoubt(rec, now) && rec.NextLookup == 0 {
				keys = append(keys, string(item.KeyCopy(nil)))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("badger: scan in-doubt records: %w", err)
	}
	return keys, nil
}
