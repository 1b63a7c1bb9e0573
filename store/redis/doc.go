// Package redis is the shared idemproxy store: replicas that may receive the
// same idempotency key use one Redis (a single node, Sentinel or Cluster,
// through go-redis' universal client) and so agree on who owns a key.
//
// # Data layout
//
// Every proxy key is one Redis HASH under KeyPrefix + key (the proxy's keys
// look like "route/scopehash/key"), with the fields:
//
//	st    state: in_flight, completed or in_doubt
//	tok   owner token of the reservation
//	fp    request fingerprint
//	cr    creation time, Unix milliseconds (Redis server clock)
//	le    lease expiry, Unix milliseconds (Redis server clock); in_flight only
//	resp  the committed answer, JSON of proxy.Response; completed only
//
// The hash carries a PEXPIRE (the record's TTL), so Redis itself forgets old
// records and no sweeper is needed; no record ever lives without a TTL.
// A record never spans more than one key, so it works unchanged on Redis
// Cluster.
//
// # Why Lua scripts
//
// Reserve, Commit, Release and MarkInDoubt are each one Lua script, so the
// read of the current state and the write that depends on it are atomic on
// the server: of N concurrent reservations, on one replica or many, exactly
// one creates the record, and commit, release and mark-in-doubt are
// compare-and-set on the owner token (fencing), so an owner whose lease ran
// out can never touch a newer owner's record. The scripts read the time with
// redis.call('TIME'), so leases are judged by one clock, Redis', however
// skewed the replicas' clocks are. An in-flight record whose lease has passed
// is reported as in_doubt; that state is derived when the record is read, not
// written, so no process has to be alive to make it happen. Get is a
// read-only script for the same reason: it needs the server time.
//
// Scripts need Redis 5 or later (effects replication of scripts that call
// TIME before writing).
package redis
