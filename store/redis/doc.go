// Package redis is the shared idemproxy store: replicas that may receive the
// same idempotency key use one Redis (a single node, Sentinel or Cluster,
// through go-redis' universal client) and so agree on who owns a key.
//
// # Topologies
//
// Options.Addrs with the other options chooses the client:
//
//   - One address: a single node. A Redis Cluster node at that address is
//     refused by Ping (most keys would fail with MOVED).
//   - Several addresses, or Options.ClusterMode: a Redis Cluster, the
//     addresses being seeds. ClusterMode is for a Cluster behind one
//     configuration endpoint (AWS ElastiCache with cluster mode enabled).
//   - Options.MasterName: Sentinel; Addrs are the Sentinels. Username and
//     Password are for the master, SentinelUsername and SentinelPassword
//     for the Sentinels.
//
// # TLS
//
// Options.TLS is used as given (for a private CA, set RootCAs). When its
// ServerName is empty, Go's TLS dialer verifies each connection against the
// host of the address it dials: the configured address for a single node,
// the address each node announces for a Cluster, the address the Sentinels
// report for a Sentinel master. A ServerName that is set applies to every
// node.
//
// # Settings that lose keys
//
// Every record has a TTL, so Redis' volatile-* eviction policies may evict
// live records just as the allkeys-* ones do, and a Redis without
// persistence forgets every record when it restarts; an evicted or
// forgotten record lets a retried request reach the upstream again (a
// double charge). The store reads both settings continuously (every
// interval of WatchSettings, in Ping, and on every new connection, on the
// node, the Sentinel master, or every Cluster master), and while one is
// seen that Options.AllowEviction or Options.AllowNoPersistence does not
// accept, Reserve and Ping fail with a *store.SettingError (wrapping
// errEvictionPolicy or errNoPersistence, and store.ErrUnsafeSettings)
// that names the setting and the fix; a rise of INFO stats evicted_keys
// calls Options.KeysEvicted. The checks read INFO, not CONFIG, which
// managed services often refuse (CONFIG GET save where it is allowed). An
// ACL user for the proxy therefore needs INFO besides the script and key
// commands; Options.SkipEvictionCheck turns the checks off where INFO is
// not available. With noeviction a full Redis refuses writes, and
// reservations fail with an error (a 503), never silently; commits of
// requests already forwarded still succeed (see commitScript). See
// settings.go.
//
// # Data layout
//
// Every proxy key is one Redis key under KeyPrefix + key (the proxy's keys
// look like "route/scopehash/key"): a string packing the record with
// MessagePack (layoutPacked, the default; see "The record layout" in
// scripts.go), or, as releases before it wrote and layoutHash writes, a
// HASH with the fields:
//
//	st    state: in_flight, completed or in_doubt
//	tok   owner token of the reservation
//	fp    request fingerprint
//	cr    creation time, Unix milliseconds (Redis server clock)
//	le    lease expiry, Unix milliseconds (Redis server clock); in_flight only
//	resp  the committed answer, JSON of store.Response; completed only
//
// Either layout is read whatever Options.RecordLayout says. The key
// carries an expiry (the record's TTL), so Redis itself forgets old
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
