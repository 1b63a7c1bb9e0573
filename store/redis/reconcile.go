package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

var _ store.ReconcileStore = (*Store)(nil)

// The lookup schedule lives on each record's hash ('nl': the next lookup,
// 'lt' and 'll': the lookup lease's token and end, Redis time in ms), and in
// one sorted set per key prefix, <prefix>reconcile, of record keys scored by
// their next lookup. The record is the truth and the set an index: the
// scripts below change only the record (one key, so never cross-slot on a
// Cluster), and the set is updated after them. DueLookups checks each due
// entry against its record: a stale entry (a record that expired, settled or
// was released) is removed, but only if its score is still the one read, so
// that a schedule written meanwhile is never lost. An entry lost between a
// script and its set update (a crash) leaves a record with a next lookup
// but no entry; Unscheduled finds those too.

// doubtPreamble reads the record's fields and whether it is in doubt: marked
// so, or in flight with a lapsed lease. settle() stores the latter as
// in_doubt, as Get already reports it; its owner token stays.
//
// A record in the packed layout (scripts.go) has no lookup fields: settle()
// first turns it into the hash layout, keeping its TTL, so that the
// lookup's fields can be written beside it.
const doubtPreamble = nowMillis + `
local v = redis.pcall('GET', KEYS[1])
local f, p
if type(v) == 'string' then
  p = {cmsgpack.unpack(v)}
  f = {p[2], p[6] ~= 0 and string.format('%d', p[6]) or false, false, false, false}
else
  f = redis.call('HMGET', KEYS[1], 'st', 'le', 'nl', 'lt', 'll')
end
local doubt = f[1] == 'in_doubt' or (f[1] == 'in_flight' and tonumber(f[2]) <= now)
local function settle()
  if p then
    local pttl = redis.call('PTTL', KEYS[1])
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'st', p[2], 'tok', p[3], 'fp', p[4], 'cr', string.format('%d', p[5]))
    if p[6] ~= 0 then redis.call('HSET', KEYS[1], 'le', string.format('%d', p[6])) end
    if p[7] ~= '' then redis.call('HSET', KEYS[1], 'resp', p[7]) end
    if p[8] and p[8] ~= '' then redis.call('HSET', KEYS[1], 'og', p[8]) end
    if pttl > 0 then redis.call('PEXPIRE', KEYS[1], pttl) end
    p = nil
  end
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

// unscheduleScript removes the next lookup of an in-doubt record and
// returns it (0: none).
var unscheduleScript = goredis.NewScript(doubtPreamble + `
if not doubt or not f[3] then return 0 end
redis.call('HDEL', KEYS[1], 'nl')
return tonumber(f[3])
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
// (retry). It returns {-1} when the record is not in doubt under the
// token, {0, ll} when it is settled (ll: the lease end, the set's score for
// a claimed record), and {nl} for retry.
var resolveScript = goredis.NewScript(doubtPreamble + `
if not doubt or f[4] ~= ARGV[1] then return {-1} end
local ll = tonumber(f[5]) or 0
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
  return {0, ll}
end
settle()
redis.call('HDEL', KEYS[1], 'lt', 'll')
if ARGV[2] == 'applied' then
  redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[3])
  redis.call('HDEL', KEYS[1], 'nl')
  return {0, ll}
end
local nl = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'nl', string.format('%d', nl))
return {nl}
`)

// dueScript returns the server time and up to ARGV[1] members of the
// schedule KEYS[1] due now, with their scores: {now, m1, s1, m2, s2, ...}.
var dueScript = goredis.NewScript(nowMillis + `
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
table.insert(r, 1, string.format('%d', now))
return r
`)

// zremIfScript removes ARGV[1] from the schedule KEYS[1] if its score is
// still ARGV[2].
var zremIfScript = goredis.NewScript(`
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
`)

// scheduleKey is the sorted set of the prefix's lookups. Record keys always
// hold a '/', this one does not.
func (s *Store) scheduleKey() string { return s.prefix + "reconcile" }

// index puts key in the schedule at nl (ms); nl <= 0 does nothing.
func (s *Store) index(ctx context.Context, key string, nl int64) error {
	if nl <= 0 {
		return nil
	}
	if err := s.client.ZAdd(ctx, s.scheduleKey(), goredis.Z{Score: float64(nl), Member: key}).Err(); err != nil {
		return fmt.Errorf("redis store: lookup schedule: %w", err)
	}
	return nil
}

// unindex removes key from the schedule if its score is still score.
func (s *Store) unindex(ctx context.Context, key string, score int64) error {
	if score <= 0 {
		return nil
	}
	if err := zremIfScript.Run(ctx, s.client, []string{s.scheduleKey()}, key, score).Err(); err != nil {
		return fmt.Errorf("redis store: lookup schedule: %w", err)
	}
	return nil
}

func (s *Store) runInt(ctx context.Context, op string, script *goredis.Script, key string, args ...any) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	n, err := s.pipe.run(ctx, true, script, []string{s.prefix + key}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis store: %s: %w", op, err)
	}
	return n, nil
}

// ScheduleLookup implements store.ReconcileStore.
func (s *Store) ScheduleLookup(ctx context.Context, key string, after time.Duration) error {
	nl, err := s.runInt(ctx, "schedule lookup", scheduleScript, key, millis(after))
	if err != nil || nl == 0 {
		return err
	}
	return s.index(ctx, key, nl)
}

// UnscheduleLookup implements store.ReconcileStore.
func (s *Store) UnscheduleLookup(ctx context.Context, key string) error {
	nl, err := s.runInt(ctx, "unschedule lookup", unscheduleScript, key)
	if err != nil {
		return err
	}
	return s.unindex(ctx, key, nl)
}

// ClaimLookup implements store.ReconcileStore.
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
	rctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	v, err := s.pipe.run(rctx, true, claimScript, []string{s.prefix + key}, token, millis(lease), f).Int64Slice()
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
		return store.ErrNotInDoubt // DueLookups drops its entry
	case 2:
		if len(v) > 1 {
			s.index(ctx, key, v[1]) // due again when that lease ends
		}
		return store.ErrLookupBusy
	default:
		if len(v) > 1 {
			s.index(ctx, key, v[1]) // the record's schedule is the truth
		}
		return store.ErrNotDue
	}
}

// ResolveLookup implements store.ReconcileStore.
func (s *Store) ResolveLookup(ctx context.Context, key, token string, res store.LookupResult) error {
	args := []any{token}
	switch {
	case res.Release:
		args = append(args, "release", "")
	case res.Applied != nil:
		b, err := encodeResponse(*res.Applied)
		if err != nil {
			return fmt.Errorf("redis store: resolve lookup: encode response: %w", err)
		}
		args = append(args, "applied", string(b))
	default:
		args = append(args, "retry", millis(res.RetryAfter))
	}
	if err := checkKey(key); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	v, err := s.pipe.run(rctx, true, resolveScript, []string{s.prefix + key}, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("redis store: resolve lookup: %w", err)
	}
	switch {
	case len(v) == 0 || v[0] < 0:
		return store.ErrNotOwner
	case v[0] == 0 && len(v) > 1:
		return s.unindex(ctx, key, v[1])
	default:
		return s.index(ctx, key, v[0])
	}
}

// DueLookups implements store.ReconcileStore: the due entries of the
// schedule, each checked against its record (pipelined HMGET); stale
// entries are removed, early ones moved to their record's next lookup.
func (s *Store) DueLookups(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := dueScript.Run(ctx, s.client, []string{s.scheduleKey()}, limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redis store: due lookups: %w", err)
	}
	if len(v) < 3 {
		return nil, nil
	}
	now, _ := strconv.ParseInt(v[0], 10, 64)
	type entry struct {
		key   string
		score int64
		cmd   *goredis.SliceCmd
	}
	pipe := s.client.Pipeline()
	var entries []entry
	for i := 1; i+1 < len(v); i += 2 {
		score, _ := strconv.ParseFloat(v[i+1], 64)
		entries = append(entries, entry{v[i], int64(score), pipe.HMGet(ctx, s.prefix+v[i], "st", "le", "nl", "lt", "ll")})
	}
	if err := execFields(ctx, pipe); err != nil {
		return nil, fmt.Errorf("redis store: due lookups: %w", err)
	}
	var keys []string
	for _, e := range entries {
		f, err := e.cmd.Result()
		if isWrongType(err) {
			f, err = packedFields(ctx, s.client, s.prefix+e.key, 5)
		}
		if err != nil || len(f) != 5 {
			continue
		}
		num := func(i int) int64 { n, _ := strconv.ParseInt(str(f[i]), 10, 64); return n }
		st, le, nl, ll := str(f[0]), num(1), num(2), num(4)
		doubt := st == string(store.StateInDoubt) || (st == string(store.StateInFlight) && le <= now)
		switch {
		case !doubt || nl == 0:
			err = s.unindex(ctx, e.key, e.score)
		case str(f[3]) != "" && ll > now:
			err = s.index(ctx, e.key, ll) // a lookup is running
		case nl > now:
			err = s.index(ctx, e.key, nl)
		default:
			keys = append(keys, e.key)
		}
		if err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// scanCount is the COUNT hint of the SCAN that Unscheduled runs.
const scanCount = 1000

// Unscheduled implements store.ReconcileStore. It scans every key under
// the key prefix and prefix (SCAN, on every master of a Cluster) and reads the state of
// each (pipelined HMGET): a cost proportional to the number of records,
// which is why the reconciler runs it far less often than DueLookups.
func (s *Store) Unscheduled(ctx context.Context, prefix string, limit int) ([]string, error) {
	var (
		mu   sync.Mutex // ForEachMaster runs scan on the masters at once
		keys []string
	)
	enough := func() bool { mu.Lock(); defer mu.Unlock(); return len(keys) >= limit }
	scan := func(ctx context.Context, c *goredis.Client) error {
		var cursor uint64
		for !enough() {
			batch, next, err := c.Scan(ctx, cursor, globEscape(s.prefix+prefix)+"*", scanCount).Result()
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
	if err := s.forEachNode(ctx, scan); err != nil {
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
		if k == s.scheduleKey() || k == s.epochKey() || k == s.keyspacesKey() {
			continue
		}
		cmds = append(cmds, pipe.HMGet(ctx, k, "st", "le", "nl"))
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	if err := execFields(ctx, pipe); err != nil {
		return nil, err
	}
	now := time.Now().UnixMilli()
	var out []string
	for _, cmd := range cmds {
		v, err := cmd.Result()
		if isWrongType(err) {
			v, err = packedFields(ctx, c, cmd.Args()[1].(string), 3)
		}
		if err != nil || len(v) != 3 {
			continue
		}
		st := str(v[0])
		le, _ := strconv.ParseInt(str(v[1]), 10, 64)
		if st != string(store.StateInDoubt) && (st != string(store.StateInFlight) || le > now) {
			continue
		}
		key := strings.TrimPrefix(cmd.Args()[1].(string), s.prefix)
		if v[2] == nil {
			out = append(out, key)
			continue
		}
		// Scheduled: make sure the schedule has it (a crash between a
		// script and its set update loses the entry).
		nl, _ := strconv.ParseInt(str(v[2]), 10, 64)
		if err := s.client.ZScore(ctx, s.scheduleKey(), key).Err(); errors.Is(err, goredis.Nil) {
			if err := s.index(ctx, key, nl); err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, err
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

// execFields runs a pipeline of HMGETs of records and returns the first
// error of a command other than a missing key or a record in the packed
// layout (WRONGTYPE), which its caller reads with packedFields.
func execFields(ctx context.Context, pipe goredis.Pipeliner) error {
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !errors.Is(err, goredis.Nil) && !isWrongType(err) {
			return err
		}
	}
	return nil
}

// isWrongType reports whether err is Redis' WRONGTYPE: an HMGET of a
// record in the packed layout (scripts.go).
func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// packedFields reads the record in the packed layout at the full key k and
// returns what an HMGET of its first n fields of st, le, nl, lt, ll
// returns: a packed record has no lookup fields (nil), and no lease end
// (nil) when its lease is 0.
func packedFields(ctx context.Context, c goredis.Cmdable, k string, n int) ([]any, error) {
	raw, err := c.Get(ctx, k).Result()
	if err != nil {
		return nil, err
	}
	p, err := decodePacked(raw)
	if err != nil {
		return nil, err
	}
	f := make([]any, n)
	f[0] = p.st
	if p.le != 0 {
		f[1] = strconv.FormatInt(p.le, 10)
	}
	return f, nil
}
