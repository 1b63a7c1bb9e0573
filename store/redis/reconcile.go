package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/proxy"
)

var _ proxy.ReconcileStore = (*Store)(nil)

// The lookup schedule lives on each record's hash ('nl': the next lookup,
// 'lt' and 'll': the lookup lease's token and end, Redis time in ms), and in
// one sorted set per key prefix, <prefix>reconcile, of record keys scored by
// their next lookup. The record is the truth and the set an index: the
// scripts below change only the record (one key, so never cross-slot on a
// Cluster), and the set is updated after them. A stale entry (a record that
// expired, settled or was released) is removed when it comes due; an entry
// lost between a script and its set update is found again by Unscheduled,
// which scans the prefix.

// doubtPreamble reads the record's fields and whether it is in doubt: marked
// so, or in flight with a lapsed lease. settle() stores the latter as
// in_doubt, as Get already reports it; its owner token stays.
const doubtPreamble = nowMillis + `
local f = redis.call('HMGET', KEYS[1], 'st', 'le', 'nl', 'lt', 'll')
local doubt = f[1] == 'in_doubt' or (f[1] == 'in_flight' and tonumber(f[2]) <= now)
local function settle()
  if f[1] == 'in_flight' then
    redis.call('HSET', KEYS[1], 'st', 'in_doubt')
    redis.call('HDEL', KEYS[1], 'le')
  end
end
`

// scheduleScript sets the next lookup of an in-doubt record unless it has
// one. ARGV: after ms. It returns the record's next lookup, or 0 when the
// record is not in doubt.
var scheduleScript = goredis.NewScript(doubtPreamble + `
if not doubt then return 0 end
if f[3] then return tonumber(f[3]) end
settle()
local nl = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'nl', string.format('%d', nl))
return nl
`)

// unscheduleScript removes the next lookup of an in-doubt record.
var unscheduleScript = goredis.NewScript(doubtPreamble + `
if not doubt then return 0 end
redis.call('HDEL', KEYS[1], 'nl')
return 1
`)

// claimScript takes the lookup lease. ARGV: token, lease ms, force (1/0).
// It returns {1, ll} claimed until ll, {0} not in doubt, {2, ll} another lease is live,
// {3, nl} not due (nl 0: not scheduled).
var claimScript = goredis.NewScript(doubtPreamble + `
if not doubt then return {0} end
if f[4] and tonumber(f[5]) > now then return {2, tonumber(f[5])} end
if ARGV[3] ~= '1' and ((not f[3]) or tonumber(f[3]) > now) then
  return {3, f[3] and tonumber(f[3]) or 0}
end
settle()
local ll = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lt', ARGV[1], 'll', string.format('%d', ll))
return {1, ll}
`)

// resolveScript settles a claimed lookup. ARGV: token, mode (applied,
// release, retry), then the response JSON (applied) or the delay ms
// (retry). It returns -1 when the record is not in doubt under the token, 0
// when it is settled, and the next lookup for retry.
var resolveScript = goredis.NewScript(doubtPreamble + `
if not doubt or f[4] ~= ARGV[1] then return -1 end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
  return 0
end
settle()
redis.call('HDEL', KEYS[1], 'lt', 'll')
if ARGV[2] == 'applied' then
  redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[3])
  redis.call('HDEL', KEYS[1], 'nl')
  return 0
end
local nl = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'nl', string.format('%d', nl))
return nl
`)

// dueScript returns up to ARGV[1] members of the schedule KEYS[1] due now.
var dueScript = goredis.NewScript(nowMillis + `
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
`)

// scheduleKey is the sorted set of the prefix's lookups. Record keys always
// hold a '/', this one does not.
func (s *Store) scheduleKey() string { return s.prefix + "reconcile" }

// index puts key in the schedule at nl (ms), or removes it for nl <= 0.
func (s *Store) index(ctx context.Context, key string, nl int64) error {
	var err error
	if nl > 0 {
		err = s.client.ZAdd(ctx, s.scheduleKey(), goredis.Z{Score: float64(nl), Member: key}).Err()
	} else {
		err = s.client.ZRem(ctx, s.scheduleKey(), key).Err()
	}
	if err != nil {
		return fmt.Errorf("redis store: lookup schedule: %w", err)
	}
	return nil
}

func (s *Store) runInt(ctx context.Context, op string, script *goredis.Script, key string, args ...any) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	n, err := script.Run(ctx, s.client, []string{s.prefix + key}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis store: %s: %w", op, err)
	}
	return n, nil
}

// ScheduleLookup implements proxy.ReconcileStore.
func (s *Store) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	nl, err := s.runInt(ctx, "schedule lookup", scheduleScript, key, millis(after))
	if err != nil || nl == 0 {
		return err
	}
	return s.index(ctx, key, nl)
}

// UnscheduleLookup implements proxy.ReconcileStore.
func (s *Store) UnscheduleLookup(ctx context.Context, key string) error {
	if _, err := s.runInt(ctx, "unschedule lookup", unscheduleScript, key); err != nil {
		return err
	}
	return s.index(ctx, key, 0)
}

// ClaimLookup implements proxy.ReconcileStore.
func (s *Store) ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if token == "" || lease <= 0 {
		return errors.New("redis store: claim lookup: empty token or lease")
	}
	f := "0"
	if force {
		f = "1"
	}
	rctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := claimScript.Run(rctx, s.client, []string{s.prefix + key}, token, millis(lease), f).Int64Slice()
	if err != nil {
		return fmt.Errorf("redis store: claim lookup: %w", err)
	}
	if len(v) == 0 {
		return errors.New("redis store: claim lookup: empty script reply")
	}
	switch v[0] {
	case 1:
		if len(v) > 1 {
			// Due again only if this lookup's lease lapses unresolved.
			return s.index(ctx, key, v[1])
		}
		return nil
	case 0:
		s.index(ctx, key, 0) // expired, settled or released: not due again
		return proxy.ErrNotInDoubt
	case 2:
		if len(v) > 1 {
			s.index(ctx, key, v[1]) // due again when that lease ends
		}
		return proxy.ErrLookupBusy
	default:
		if len(v) > 1 {
			s.index(ctx, key, v[1]) // the record's schedule is the truth
		}
		return proxy.ErrNotDue
	}
}

// ResolveLookup implements proxy.ReconcileStore.
func (s *Store) ResolveLookup(ctx context.Context, key, token string, res proxy.LookupResult) error {
	args := []any{token}
	switch {
	case res.Release:
		args = append(args, "release", "")
	case res.Applied != nil:
		b, err := json.Marshal(res.Applied)
		if err != nil {
			return fmt.Errorf("redis store: resolve lookup: encode response: %w", err)
		}
		args = append(args, "applied", string(b))
	default:
		args = append(args, "retry", millis(res.RetryAfter))
	}
	nl, err := s.runInt(ctx, "resolve lookup", resolveScript, key, args...)
	if err != nil {
		return err
	}
	if nl < 0 {
		return proxy.ErrNotOwner
	}
	return s.index(ctx, key, nl)
}

// DueLookups implements proxy.ReconcileStore.
func (s *Store) DueLookups(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	keys, err := dueScript.Run(ctx, s.client, []string{s.scheduleKey()}, limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redis store: due lookups: %w", err)
	}
	return keys, nil
}

// scanCount is the COUNT hint of the SCAN that Unscheduled runs.
const scanCount = 1000

// Unscheduled implements proxy.ReconcileStore. It scans every key under
// the prefix (SCAN, on every master of a Cluster) and reads the state of
// each (pipelined HMGET): a cost proportional to the number of records,
// which is why the reconciler runs it far less often than DueLookups.
func (s *Store) Unscheduled(ctx context.Context, limit int) ([]string, error) {
	var (
		mu   sync.Mutex // ForEachMaster runs scan on the masters at once
		keys []string
	)
	enough := func() bool { mu.Lock(); defer mu.Unlock(); return len(keys) >= limit }
	scan := func(ctx context.Context, c *goredis.Client) error {
		var cursor uint64
		for !enough() {
			batch, next, err := c.Scan(ctx, cursor, globEscape(s.prefix)+"*", scanCount).Result()
			if err != nil {
				return err
			}
			found, err := s.unscheduledIn(ctx, c, batch)
			if err != nil {
				return err
			}
			mu.Lock()
			keys = append(keys, found...)
			mu.Unlock()
			if cursor = next; cursor == 0 {
				break
			}
		}
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *goredis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("unexpected client %T", s.client)
	}
	if err != nil {
		return nil, fmt.Errorf("redis store: find unscheduled in-doubt records: %w", err)
	}
	return keys[:min(len(keys), limit)], nil
}

// unscheduledIn returns the keys of batch (full Redis keys) that hold
// in-doubt records without a next lookup, without the prefix. A lease is
// compared with this host's clock here; ScheduleLookup decides with Redis'.
func (s *Store) unscheduledIn(ctx context.Context, c *goredis.Client, batch []string) ([]string, error) {
	pipe := c.Pipeline()
	cmds := make([]*goredis.SliceCmd, 0, len(batch))
	for _, k := range batch {
		if k == s.scheduleKey() {
			continue
		}
		cmds = append(cmds, pipe.HMGet(ctx, k, "st", "le", "nl"))
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return nil, err
	}
	now := time.Now().UnixMilli()
	var out []string
	for _, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil || len(v) != 3 || v[2] != nil {
			continue
		}
		st := str(v[0])
		le, _ := strconv.ParseInt(str(v[1]), 10, 64)
		if st == string(proxy.StateInDoubt) || (st == string(proxy.StateInFlight) && le <= now) {
			out = append(out, strings.TrimPrefix(cmd.Args()[1].(string), s.prefix))
		}
	}
	return out, nil
}

// globEscape escapes the glob characters of a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
