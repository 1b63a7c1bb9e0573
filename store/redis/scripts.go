package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts share one preamble: now is the Redis server time in Unix
// milliseconds. Numbers are written with string.format('%d'), so they are
// stored as plain integers and never in exponent notation.
const nowMillis = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// The record layout.
//
// A record is one Redis string: the record packed with MessagePack
// (Redis' cmsgpack) as seven values, 1 (the layout's version), state,
// token, fingerprint, created (Unix ms, Redis time), lease end (Unix ms; 0
// when none) and the response JSON ("" when none), and an eighth, the
// reservation's origin span (store.Reservation.Origin), only when it has
// one: a record without one is packed as before origins were kept. Each
// change of a record is then one write, SET ... PX ttl, where the hash
// that earlier releases wrote took two or three (HSET, HDEL, PEXPIRE).
// decodePacked (packed.go) reads it.
//
// Records that earlier releases wrote are hashes (fields st, tok, fp, cr,
// le, resp, and the lookup fields of reconcile.go); every script reads
// both, and changes a hash as earlier releases did. A hash this release
// writes has one more field, og, the origin, when there is one (earlier
// releases read the fields they know and keep the others). The records of a
// reconciliation (lookups) stay hashes: a packed record that a lookup
// changes is turned into one first (reconcile.go), a rare path.
//
// With Options.RecordLayout layoutHash, the store writes what the release
// before the packed layout wrote, with the same commands (its scripts are
// the ...HashScript ones below; testdata/hash-records.txt and
// testdata/hash-changes.txt hold the commands), so that replicas of that
// release, sharing the Redis during a rolling upgrade or after a rollback,
// read every record written. It still reads packed records, and a commit
// or in-doubt mark of a packed one rewrites it as a hash (DEL, then the
// hash's HSET and PEXPIRE). The layout is chosen once, in New: the scripts
// of a request are the same whatever it is, and cost no more round trips.

// packRecord is the Lua that packs a record; its arguments are Lua
// expressions for the state, token, fingerprint, created, lease end,
// response and origin (nil or empty: none, and no eighth value).
func packRecord(st, tok, fp, cr, le, resp, og string) string {
	return "cmsgpack.pack(1, " + st + ", " + tok + ", " + fp + ", " + cr + ", " + le + ", " + resp + ") .. packOrigin(" + og + ")"
}

// packOrigin is the Lua function packRecord's scripts define: the packed
// origin, or an empty string for none.
const packOrigin = `
local function packOrigin(og)
  if og and og ~= '' then return cmsgpack.pack(og) end
  return ''
end
`

// recordReply is the tail shared by reserveScript and getScript: the
// record, its PTTL and the server time; v is the GET of the key (a string,
// or the error table of a hash).
const recordReply = `
if type(v) == 'string' then
  return {0, v, redis.call('PTTL', KEYS[1]), now}
end
local f = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fp', 'cr', 'le', 'resp', 'og')
return {0, f[1], f[2], f[3], f[4], f[5], f[6], f[7], redis.call('PTTL', KEYS[1]), now}
`

// reserveScript creates an in-flight record when the key is free.
//
//	KEYS[1] record key
//	ARGV    token, fingerprint, lease ms, ttl ms, deadline (Unix ms, Redis
//	        clock; optional), origin ('' or missing: none)
//
// Past the deadline it changes nothing and returns the error IDEMPROXY_LATE:
// its caller has stopped waiting (see deadline.go).
//
// It returns {1} when the caller owns the key: it created the record (SET
// NX: one write), or it is a live in-flight reservation carrying the
// caller's token (the caller's own, applied before a reply that was lost;
// go-redis retries commands after network errors, and this check is what
// makes that retry safe). Otherwise it returns the record (see
// recordReply) and changes nothing.
var reserveScript = goredis.NewScript(nowMillis + reserveBody)

// reserveEpochScript is reserveScript that first checks the epoch marker
// (epoch.go): KEYS[2] is the marker, ARGV[7] the ID of the epoch the
// replica trusts. A marker missing or different changes nothing and
// returns the error IDEMPROXY_EPOCH: not one reservation lands on a store
// that forgot its keys, even between two checks of the watcher (a
// FLUSHALL keeps the connections open). Single node and Sentinel only: on
// a Cluster the two keys are in different slots.
var reserveEpochScript = goredis.NewScript(nowMillis + epochCheck + reserveBody)

// epochCheck refuses a reservation when the epoch marker (KEYS[2]) is not
// the one the replica trusts (ARGV[7]).
const epochCheck = `
if (redis.call('HGET', KEYS[2], 'eid') or '') ~= ARGV[7] then
  return redis.error_reply('IDEMPROXY_EPOCH the epoch marker is not the one this replica trusts')
end
`

// reserveBody is the body of reserveScript, after the preamble.
var reserveBody = lateCheck + packOrigin + `
if redis.call('SET', KEYS[1], ` + packRecord("'in_flight'", "ARGV[1]", "ARGV[2]", "now", "now + tonumber(ARGV[3])", "''", "ARGV[6]") + `, 'NX', 'PX', ARGV[4]) then
  return {1}
end
` + reserveTail

// reserveHashScript and reserveHashEpochScript are reserveScript and
// reserveEpochScript for the hash layout (layoutHash): a free key gets
// the in-flight hash the release before the packed layout wrote, with its
// commands (EXISTS, HSET, PEXPIRE), and the field og for an origin.
var (
	reserveHashScript      = goredis.NewScript(nowMillis + reserveHashBody)
	reserveHashEpochScript = goredis.NewScript(nowMillis + epochCheck + reserveHashBody)
)

// reserveHashBody is the body of reserveHashScript, after the preamble.
var reserveHashBody = lateCheck + `
if redis.call('EXISTS', KEYS[1]) == 0 then
  local f = {'st', 'in_flight', 'tok', ARGV[1], 'fp', ARGV[2],
    'cr', string.format('%d', now), 'le', string.format('%d', now + tonumber(ARGV[3]))}
  if ARGV[6] and ARGV[6] ~= '' then
    f[#f + 1], f[#f + 2] = 'og', ARGV[6]
  end
  redis.call('HSET', KEYS[1], unpack(f))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1}
end
` + reserveTail

// lateCheck refuses a reservation past its deadline (ARGV[5]).
const lateCheck = `
if ARGV[5] and now > tonumber(ARGV[5]) then
  return redis.error_reply('IDEMPROXY_LATE reservation past its deadline')
end
`

// reserveTail is the end of a reservation that found the key taken: {1}
// for the caller's own live reservation, else the record.
const reserveTail = `
local v = redis.pcall('GET', KEYS[1])
local st, tok, le
if type(v) == 'string' then
  local _
  _, st, tok, _, _, le = cmsgpack.unpack(v)
else
  local own = redis.call('HMGET', KEYS[1], 'st', 'tok', 'le')
  st, tok, le = own[1], own[2], tonumber(own[3])
end
if st == 'in_flight' and tok == ARGV[1] and le > now then
  return {1}
end
` + recordReply

// getScript reads a record; see recordReply. It returns {1} when there is
// none.
var getScript = goredis.NewScript(nowMillis + `
local v = redis.pcall('GET', KEYS[1])
if not v then
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
// A full Redis (maxmemory-policy noeviction) refuses a script's first write
// that may grow memory (the SET, or a hash's HSET), but lets a script that
// has written finish. When it refuses the SET, the script writes the
// PEXPIRE first (for a hash: its first write is the HDEL), so a full Redis
// still refuses new reservations but stores the answers of requests
// already forwarded, instead of leaving their keys in doubt for the whole
// TTL.
var commitScript = goredis.NewScript(packOrigin + `
local v = redis.pcall('GET', KEYS[1])
if not v then
  return 0
end
if type(v) == 'string' then
  local _, st, tok, fp, cr, _, _, og = cmsgpack.unpack(v)
  if tok ~= ARGV[1] then
    return 0
  end
  if st == 'completed' then
    return 1
  end
  local rec = ` + packRecord("'completed'", "tok", "fp", "cr", "0", "ARGV[2]", "og") + `
  local ok = redis.pcall('SET', KEYS[1], rec, 'PX', ARGV[3])
  if type(ok) == 'table' and ok.err then
    -- A full Redis refuses a first write that may grow memory; a script
    -- that has written is let finish.
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    redis.call('SET', KEYS[1], rec, 'PX', ARGV[3])
  end
  return 1
end
` + commitHashRecord)

// commitHashScript is commitScript for the hash layout (layoutHash): a
// hash is committed as the release before the packed layout did (HDEL,
// HSET, PEXPIRE), and a packed record is rewritten as the hash that
// release would have left: DEL, HSET, PEXPIRE. The DEL is the first write,
// so a full Redis lets the script finish, as it does commitScript.
var commitHashScript = goredis.NewScript(`
local v = redis.pcall('GET', KEYS[1])
if not v then
  return 0
end
if type(v) == 'string' then
  local _, st, tok, fp, cr, _, _, og = cmsgpack.unpack(v)
  if tok ~= ARGV[1] then
    return 0
  end
  if st == 'completed' then
    return 1
  end
  redis.call('DEL', KEYS[1])
  if og and og ~= '' then
    redis.call('HSET', KEYS[1], 'st', 'completed', 'tok', tok, 'fp', fp, 'cr', string.format('%d', cr), 'resp', ARGV[2], 'og', og)
  else
    redis.call('HSET', KEYS[1], 'st', 'completed', 'tok', tok, 'fp', fp, 'cr', string.format('%d', cr), 'resp', ARGV[2])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
` + commitHashRecord)

// commitHashRecord is the end of both commit scripts: the commit of a
// record in the hash layout, with the commands of the release before the
// packed layout.
const commitHashRecord = `
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
`

// releaseScript deletes the caller's record.
//
//	KEYS[1] record key
//	ARGV    token
//
// It returns 1 on success and 0 when the record does not carry token.
var releaseScript = goredis.NewScript(`
local v = redis.pcall('GET', KEYS[1])
local tok
if type(v) == 'string' then
  local _, _, t = cmsgpack.unpack(v)
  tok = t
elseif v then
  tok = redis.call('HGET', KEYS[1], 'tok')
end
if not tok or tok ~= ARGV[1] then
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
var markInDoubtScript = goredis.NewScript(packOrigin + `
local v = redis.pcall('GET', KEYS[1])
if not v then
  return 0
end
if type(v) == 'string' then
  local _, st, tok, fp, cr, _, _, og = cmsgpack.unpack(v)
  if tok ~= ARGV[1] then
    return 0
  end
  if st == 'completed' then
    return 1
  end
  redis.call('SET', KEYS[1], ` + packRecord("'in_doubt'", "tok", "fp", "cr", "0", "''", "og") + `, 'PX', ARGV[2])
  return 1
end
` + markHashRecord)

// markInDoubtHashScript is markInDoubtScript for the hash layout
// (layoutHash): a hash is marked as the release before the packed layout
// did (HSET, HDEL, PEXPIRE), and a packed record is rewritten as the hash
// that release would have left: DEL, HSET, PEXPIRE.
var markInDoubtHashScript = goredis.NewScript(`
local v = redis.pcall('GET', KEYS[1])
if not v then
  return 0
end
if type(v) == 'string' then
  local _, st, tok, fp, cr, _, _, og = cmsgpack.unpack(v)
  if tok ~= ARGV[1] then
    return 0
  end
  if st == 'completed' then
    return 1
  end
  redis.call('DEL', KEYS[1])
  if og and og ~= '' then
    redis.call('HSET', KEYS[1], 'st', 'in_doubt', 'tok', tok, 'fp', fp, 'cr', string.format('%d', cr), 'og', og)
  else
    redis.call('HSET', KEYS[1], 'st', 'in_doubt', 'tok', tok, 'fp', fp, 'cr', string.format('%d', cr))
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
` + markHashRecord)

// markHashRecord is the end of both in-doubt scripts: the mark of a record
// in the hash layout, with the commands of the release before the packed
// layout.
const markHashRecord = `
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
`
