package badger

import (
	"context"
	"errors"
	"fmt"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/proxy"
)

var _ proxy.ReconcileStore = (*Store)(nil)

// The lookup schedule lives on the records (record.NextLookup), so it
// survives restarts. Finding due records scans the keys whose UserMeta says
// in flight or in doubt and reads only those values: the completed records,
// nearly all of them, are skipped without reading their values.

// inDoubt reports whether rec is in doubt at now (ms): marked so, or in
// flight with a lapsed lease.
func inDoubt(rec *record, now int64) bool {
	return rec.State == proxy.StateInDoubt || (rec.State == proxy.StateInFlight && rec.Lease <= now)
}

// settleDoubt stores a lapsed in-flight record as in doubt, as Get already
// reports it. Its token stays: the original request may still commit.
func settleDoubt(rec *record) {
	rec.State = proxy.StateInDoubt
	rec.Lease = 0
}

// changeDoubt applies fn to the in-doubt record under key inside one
// transaction, keeping the record's expiry; fn returns whether to write.
// It returns proxy.ErrNotInDoubt when there is no in-doubt record.
func (s *Store) changeDoubt(ctx context.Context, op, key string, fn func(rec *record, now int64) (bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.update(func(txn *bdg.Txn) error {
		k := []byte(key)
		rec, exp, err := get(txn, k)
		if err != nil {
			return err
		}
		now := s.now().UnixMilli()
		if rec == nil || !inDoubt(rec, now) {
			return proxy.ErrNotInDoubt
		}
		write, err := fn(rec, now)
		if err != nil || !write {
			return err
		}
		settleDoubt(rec)
		return putAt(txn, k, rec, exp)
	})
	if err != nil && !isDomain(err) {
		return fmt.Errorf("badger: %s: %w", op, err)
	}
	return err
}

func isDomain(err error) bool {
	for _, d := range []error{proxy.ErrNotInDoubt, proxy.ErrLookupBusy, proxy.ErrNotDue, proxy.ErrNotOwner} {
		if errors.Is(err, d) {
			return true
		}
	}
	return false
}

// ScheduleLookup implements proxy.ReconcileStore.
func (s *Store) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	err := s.changeDoubt(ctx, "schedule lookup", key, func(rec *record, now int64) (bool, error) {
		if rec.NextLookup != 0 {
			return false, nil
		}
		rec.NextLookup = now + after.Milliseconds()
		return true, nil
	})
	if errors.Is(err, proxy.ErrNotInDoubt) {
		return nil
	}
	return err
}

// UnscheduleLookup implements proxy.ReconcileStore.
func (s *Store) UnscheduleLookup(ctx context.Context, key string) error {
	err := s.changeDoubt(ctx, "unschedule lookup", key, func(rec *record, now int64) (bool, error) {
		rec.NextLookup = 0
		return true, nil
	})
	if errors.Is(err, proxy.ErrNotInDoubt) {
		return nil
	}
	return err
}

// ClaimLookup implements proxy.ReconcileStore.
func (s *Store) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error {
	return s.changeDoubt(ctx, "claim lookup", key, func(rec *record, now int64) (bool, error) {
		switch {
		case rec.LookupToken != "" && rec.LookupLease > now:
			return false, proxy.ErrLookupBusy
		case !force && (rec.NextLookup == 0 || rec.NextLookup > now):
			return false, proxy.ErrNotDue
		}
		rec.LookupToken = token
		rec.LookupLease = now + lease.Milliseconds()
		return true, nil
	})
}

// ResolveLookup implements proxy.ReconcileStore.
func (s *Store) ResolveLookup(ctx context.Context, key, token string, res proxy.LookupResult) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.update(func(txn *bdg.Txn) error {
		k := []byte(key)
		rec, exp, err := get(txn, k)
		if err != nil {
			return err
		}
		now := s.now().UnixMilli()
		if rec == nil || !inDoubt(rec, now) || rec.LookupToken != token {
			return proxy.ErrNotOwner
		}
		settleDoubt(rec)
		rec.LookupToken, rec.LookupLease = "", 0
		switch {
		case res.Release:
			return txn.Delete(k)
		case res.Applied != nil:
			rec.State = proxy.StateCompleted
			rec.Response = res.Applied
			rec.NextLookup = 0
		default:
			rec.NextLookup = now + res.RetryAfter.Milliseconds()
		}
		return putAt(txn, k, rec, exp)
	})
	if err != nil && !errors.Is(err, proxy.ErrNotOwner) {
		return fmt.Errorf("badger: resolve lookup: %w", err)
	}
	return err
}

// DueLookups implements proxy.ReconcileStore.
func (s *Store) DueLookups(ctx context.Context, limit int) ([]string, error) {
	return s.scanDoubt(ctx, limit, func(rec *record, now int64) bool {
		return rec.NextLookup != 0 && rec.NextLookup <= now && (rec.LookupToken == "" || rec.LookupLease <= now)
	})
}

// Unscheduled implements proxy.ReconcileStore.
func (s *Store) Unscheduled(ctx context.Context, limit int) ([]string, error) {
	return s.scanDoubt(ctx, limit, func(rec *record, now int64) bool { return rec.NextLookup == 0 })
}

// scanDoubt returns the keys of in-doubt records that match, at most limit.
func (s *Store) scanDoubt(ctx context.Context, limit int, match func(rec *record, now int64) bool) ([]string, error) {
	var keys []string
	now := s.now().UnixMilli()
	err := s.db.View(func(txn *bdg.Txn) error {
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid() && len(keys) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			if m := item.UserMeta(); m != metaInDoubt && m != metaInFlight {
				continue
			}
			rec, _, err := get(txn, item.Key())
			if err != nil {
				return err
			}
			if rec != nil && inDoubt(rec, now) && match(rec, now) {
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
