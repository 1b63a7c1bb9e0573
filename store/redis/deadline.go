package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A reservation carries a deadline: the Redis time after which the reserve
// script refuses it. A Reserve that gave up (op_timeout, a stalled Redis)
// answers 503 and releases its key in the background, but the command may
// still sit in Redis' socket buffer and run after that release, leaving a
// reservation nobody holds (and, when its lease ends, a key in doubt for
// its whole TTL). With the deadline, a reservation that runs after the
// caller stopped waiting is refused; one that runs before is followed by
// the release, which is sent only after the caller stopped waiting.

// errReserveLate is the reserve script's answer to a reservation that
// reached Redis after its deadline.
var errReserveLate = errors.New("the reservation reached redis after its caller gave up")

// lateReply is the error the reserve script returns past the deadline.
const lateReply = "IDEMPROXY_LATE"

// clockResample is how long a measured offset to Redis' clock is used.
const clockResample = 30 * time.Second

// redisClock is the offset of Redis' clock (TIME) to the local one, and
// how uncertain it is (half the round trip of the measurement).
type redisClock struct {
	mu        sync.Mutex
	offset    time.Duration
	uncertain time.Duration
	at        time.Time
}

// deadline returns the Redis time, in Unix milliseconds, by which a
// command sent now under ctx must have run for its caller to still be
// waiting: ctx's deadline on Redis' clock, minus the uncertainty of the
// offset.
func (s *Store) deadline(ctx context.Context) (int64, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(s.opTimeout)
	}
	off, unc, err := s.clock.get(ctx, s.client, s.opTimeout)
	if err != nil {
		return 0, err
	}
	return dl.Add(off - unc).UnixMilli(), nil
}

func (c *redisClock) get(ctx context.Context, client goredis.UniversalClient, opTimeout time.Duration) (time.Duration, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < clockResample {
		return c.offset, c.uncertain, nil
	}
	t0 := time.Now()
	rt, err := client.Time(ctx).Result()
	t1 := time.Now()
	if err != nil {
		if !c.at.IsZero() {
			return c.offset, c.uncertain, nil // the reserve itself will tell
		}
		return 0, 0, fmt.Errorf("read the redis clock: %w", err)
	}
	rtt := t1.Sub(t0)
	// A slow sample (Redis busy or stalling) is imprecise: keep a good one
	// we have, and use a first one only if it leaves room before the
	// deadline.
	if !c.at.IsZero() && rtt > opTimeout/4 && rtt > 2*c.uncertain {
		c.at = t1.Add(-clockResample + time.Second) // try again in a second
		return c.offset, c.uncertain, nil
	}
	c.offset = rt.Sub(t0.Add(rtt / 2))
	c.uncertain = rtt/2 + time.Millisecond // TIME is read in whole ms by the scripts
	c.at = t1
	return c.offset, c.uncertain, nil
}
