package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts share one preamble: now is the Redis server time in Unix
// milliseconds. Numbers are written with string.format('%d'), so they are
// stored as plain integers and never in exponent notation.
const nowMillis = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// recordReply is the tail shared by reserveScript and getScript: the record's
// fields, its PTTL and the server time.
const recordReply = `
local f = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fp', 'cr', 'le', 'resp')
return {0, f[1], f[2], f[3], f[4], f[5], f[6], redis.call('PTTL', KEYS[1]), now}
`

// reserveScript creates an in-flight record when the key is free.
//
//	KEYS[1] record key
//	ARGV    token, fingerprint, lease ms, ttl ms, deadline (Unix ms, Redis
//	        clock; optional)
//
// Past the deadline it changes nothing and returns the error IDEMPROXY_LATE:
// its caller has stopped waiting (see deadline.go).
//
// It returns {1} when the caller owns the key: the record was created, or it
// is a live in-flight reservation carrying the caller's token (the caller's
// own, applied before a reply that was lost; go-redis retries commands after
// network errors, and this check is what makes that retry safe). Otherwise it
// returns {0, st, tok, fp, cr, le, resp, pttl, now} and changes nothing.
var reserveScript = goredis.NewScript(nowMillis + reserveBody)

// reserveEpochScript is reserveScript that first checks the epoch marker
// (epoch.go): KEYS[2] is the marker, ARGV[6] the ID of the epoch the
// replica trusts. A marker missing or different changes nothing and
// returns the error IDEMPROXY_EPOCH: not one reservation lands on a store
// that forgot its keys, even between two checks of the watcher (a
// FLUSHALL keeps the connections open). Single node and Sentinel only: on
// a Cluster the two keys are in different slots.
var reserveEpochScript = goredis.NewScript(nowMillis + `
if (redis.call('HGET', KEYS[2], 'eid') or '') ~= ARGV[6] then
  return redis.error_reply('IDEMPROXY_EPOCH the epoch marker is not the one this replica trusts')
end
` + reserveBody)

// reserveBody is the body of reserveScript, after the preamble.
const reserveBody = `
if ARGV[5] and now > tonumber(ARGV[5]) then
  return redis.error_reply('IDEMPROXY_LATE reservation past its deadline')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'st', 'in_flight', 'tok', ARGV[1], 'fp', ARGV[2],
    'cr', string.format('%d', now), 'le', string.format('%d', now + tonumber(ARGV[3])))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1}
end
local own = redis.call('HMGET', KEYS[1], 'st', 'tok', 'le')
if own[1] == 'in_flight' and own[2] == ARGV[1] and tonumber(own[3]) > now then
  return {1}
end
` + recordReply

// getScript reads a record; see recordReply. It returns {1} when there is
// none.
var getScript = goredis.NewScript(nowMillis + `
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {1}
end
` + recordReply)

// commitScript stores the answer of the caller's reservation.
//
//	KEYS[1] record key
//	ARGV    token, response JSON, ttl ms
//
// It returns 1 on success and 0 when the record does not carry token. The
// record may be in_flight, or in_doubt because its lease ran out or it was
// marked so: the answer is now known, and storing it is better than keeping
// the doubt. A completed record carrying the token is left as it is and 1 is
// returned: that is a retried commit whose first reply was lost, and a
// replayed answer must never change.
//
// Its first write is the HDEL, which Redis runs even above maxmemory: a
// script that has written is let finish, so the HSET after it is too. A full
// Redis (maxmemory-policy noeviction) thus still refuses new reservations,
// whose first write is an HSET, but stores the answers of requests already
// forwarded, instead of leaving their keys in doubt for the whole TTL.
var commitScript = goredis.NewScript(`
local f = redis.call('HMGET', KEYS[1], 'st', 'tok')
if f[2] ~= ARGV[1] then
  return 0
end
if f[1] == 'completed' then
  return 1
end
redis.call('HDEL', KEYS[1], 'le')
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

// releaseScript deletes the caller's record.
//
//	KEYS[1] record key
//	ARGV    token
//
// It returns 1 on success and 0 when the record does not carry token.
var releaseScript = goredis.NewScript(`
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// markInDoubtScript turns the caller's record in doubt.
//
//	KEYS[1] record key
//	ARGV    token, ttl ms
//
// It returns 1 on success and 0 when the record does not carry token. A
// completed record is left as it is (and 1 returned): a known answer is never
// downgraded to a doubt.
var markInDoubtScript = goredis.NewScript(`
local f = redis.call('HMGET', KEYS[1], 'st', 'tok')
if f[2] ~= ARGV[1] then
  return 0
end
if f[1] == 'completed' then
  return 1
end
redis.call('HSET', KEYS[1], 'st', 'in_doubt')
redis.call('HDEL', KEYS[1], 'le')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)
