package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// maxSweepBatches bounds the DELETEs of one sweep, so that a backlog is
// worked off over several intervals instead of holding a connection.
const maxSweepBatches = 20

// sweepLoop deletes expired records every interval until Close.
func (s *Store) sweepLoop(interval time.Duration) {
	defer s.stopped.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.sweepFails.Add(1)
			s.log.Warn("postgres store: delete expired records", "err", err)
		}
		cancel()
	}
}

// Sweep deletes expired records, in batches of Options.SweepBatch through
// the index on expires_at, until a batch comes back short or a bound on the
// batches per sweep is reached, and returns how many it deleted. Rows that
// another process is sweeping or writing are skipped (SKIP LOCKED). The
// background sweeper calls it every Options.SweepInterval.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for range maxSweepBatches {
		var n int64
		err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
			tag, err := c.Exec(ctx, s.sql.sweep, s.sweepBatch)
			n = tag.RowsAffected()
			return err
		})
		total += n
		s.swept.Add(n)
		if err != nil {
			return total, fmt.Errorf("postgres store: sweep: %w", err)
		}
		if n < int64(s.sweepBatch) {
			break
		}
	}
	return total, nil
}
