-- getScript of the release before the packed layout (issue 28), as it
-- was (git show bd69a95:store/redis/scripts.go): nowMillis, then the
-- EXISTS check, then recordReply. Tests run it to read records the way
-- a replica of that release does.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {1}
end
local f = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fp', 'cr', 'le', 'resp')
return {0, f[1], f[2], f[3], f[4], f[5], f[6], redis.call('PTTL', KEYS[1]), now}
