package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// listHold is how long a key that DueLookups returned is kept from other
// Stores' DueLookups, so that replicas polling at once share the due keys
// instead of all trying the same ones. It only spreads the work: a key
// listed by a replica that then died is listed again after it, and
// ClaimLookup is what lets one lookup run.
const listHold = 10 * time.Second

// ScheduleLookup implements store.ReconcileStore.
func (s *Store) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	return s.exec(ctx, "schedule lookup", s.sql.schedule, key, micros(max(after, 0)))
}

// UnscheduleLookup implements store.ReconcileStore.
func (s *Store) UnscheduleLookup(ctx context.Context, key string) error {
	return s.exec(ctx, "unschedule lookup", s.sql.unschedule, key)
}

// exec runs an unfenced statement on key.
func (s *Store) exec(ctx context.Context, op, sql, key string, args ...any) error {
	if err := checkKey(key); err != nil {
		if errors.Is(err, errUnstorable) {
			return nil // no record to change
		}
		return err
	}
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, sql, append([]any{key}, args...)...)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres store: %s: %w", op, err)
	}
	return nil
}

// ClaimLookup implements store.ReconcileStore with one fenced UPDATE; when
// it changes nothing, a read of the record tells why.
func (s *Store) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error {
	if err := checkKey(key); err != nil {
		if errors.Is(err, errUnstorable) {
			return store.ErrNotInDoubt
		}
		return err
	}
	if token == "" || lease <= 0 {
		return errors.New("postgres store: claim lookup: empty token or lease")
	}
	var claimed, inDoubt, busy bool
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		tag, err := c.Exec(ctx, s.sql.claim, key, token, micros(lease), force)
		if err != nil {
			return err
		}
		if claimed = tag.RowsAffected() == 1; claimed {
			return nil
		}
		err = c.QueryRow(ctx, s.sql.claimState, key).Scan(&inDoubt, &busy)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("postgres store: claim lookup: %w", err)
	case claimed:
		return nil
	case !inDoubt:
		return store.ErrNotInDoubt
	case busy:
		return store.ErrLookupBusy
	default:
		return store.ErrNotDue
	}
}

// ResolveLookup implements store.ReconcileStore: one statement fenced by
// the lookup token.
func (s *Store) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) error {
	switch {
	case res.Release:
		return s.fenced(ctx, "resolve lookup", nil, s.sql.resolveRelease, key, token)
	case res.Applied != nil:
		meta, err := encodeMeta(*res.Applied)
		if err != nil {
			return fmt.Errorf("postgres store: resolve lookup: encode response: %w", err)
		}
		return s.fenced(ctx, "resolve lookup", nil, s.sql.resolveApplied, key, token, meta, body(*res.Applied))
	default:
		return s.fenced(ctx, "resolve lookup", nil, s.sql.resolveRetry, key, token, micros(max(res.RetryAfter, 0)))
	}
}

// DueLookups implements store.ReconcileStore through the partial index on
// next_lookup. The keys it returns are skipped by other Stores' DueLookups
// for a while (see listHold); rows another Store is listing at this moment
// are skipped (SKIP LOCKED), not waited for.
func (s *Store) DueLookups(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	var keys []string
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, s.sql.due, limit, s.instance, micros(listHold))
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres store: due lookups: %w", err)
	}
	return keys, nil
}

// Unscheduled implements store.ReconcileStore through the partial index of
// records in flight or in doubt without a next lookup: its size is the
// number of requests in flight plus the unscheduled doubts, not the table's.
func (s *Store) Unscheduled(ctx context.Context, prefix string, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	var keys []string
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, s.sql.unscheduled, prefix, limit)
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres store: find unscheduled in-doubt records: %w", err)
	}
	return keys, nil
}
