package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A reservation carries a deadline on the database's clock, after which
// the INSERT takes nothing. A Reserve that gave up (a frozen or stalled
// database, a long lock wait) answers 503, and the proxy releases its key
// in the background; but the statement may still run later, when the
// database wakes up, after that release, and leave a reservation nobody
// holds (in doubt, once its lease ends, for its whole TTL). With the
// deadline, a reservation that runs after its caller stopped waiting takes
// nothing; one that runs before is followed by the release. The server's
// own statement_timeout does not cover this: it counts from when the
// statement starts running, not from when it was sent.

// clockResample is how long a measured offset to the database's clock is
// used.
const clockResample = 30 * time.Second

// dbClock is the offset of the database's clock to the local one and how
// uncertain it is (half the round trip of the measurement).
type dbClock struct {
	mu        sync.Mutex
	offset    time.Duration
	uncertain time.Duration
	at        time.Time
}

// deadline returns the database time by which a statement sent now under
// ctx must run for its caller to still be waiting: ctx's deadline on the
// database's clock, less the offset's uncertainty.
// It also returns when the offset it used was measured, for
// dbClock.distrust.
func (s *Store) deadline(ctx context.Context, c *pgxpool.Conn) (time.Time, time.Time, error) {
	dl := s.callerDeadline(ctx)
	off, unc, err := s.clock.get(ctx, c, s.statementTimeout)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	k := &s.clock
	k.mu.Lock()
	at := k.at
	k.mu.Unlock()
	return dl.Add(off - unc), at, nil
}

// callerDeadline is when a call under ctx stops waiting, on the local
// clock: ctx's deadline, or StatementTimeout and the reply's grace from now.
func (s *Store) callerDeadline(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(s.statementTimeout + replyGrace)
}

// distrust drops the offset measured at at, so that the next get measures
// again: a reservation was refused as past its deadline while its caller
// was still waiting, so one of the clocks was stepped since (NTP after a
// pause or migration of a host). Keeping the offset would refuse every
// reservation until the next sample. An offset measured after at is kept.
func (k *dbClock) distrust(at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.at.Equal(at) {
		k.at = time.Time{}
	}
}

// get returns the offset and its uncertainty, measuring them on c when the
// last sample is older than clockResample.
func (k *dbClock) get(ctx context.Context, c *pgxpool.Conn, statementTimeout time.Duration) (time.Duration, time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.at.IsZero() && time.Since(k.at) < clockResample {
		return k.offset, k.uncertain, nil
	}
	var db time.Time
	t0 := time.Now()
	err := c.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db)
	t1 := time.Now()
	if err != nil {
		if !k.at.IsZero() {
			return k.offset, k.uncertain, nil // the reservation itself will tell
		}
		return 0, 0, fmt.Errorf("read the database's clock: %w", err)
	}
	rtt := t1.Sub(t0)
	// A slow sample (the database busy or stalling) is imprecise: keep a
	// good one we have, and try again in a second.
	if !k.at.IsZero() && rtt > statementTimeout/4 && rtt > 2*k.uncertain {
		k.at = t1.Add(-clockResample + time.Second)
		return k.offset, k.uncertain, nil
	}
	k.offset = db.Sub(t0.Add(rtt / 2))
	k.uncertain = rtt/2 + time.Millisecond
	k.at = t1
	return k.offset, k.uncertain, nil
}
