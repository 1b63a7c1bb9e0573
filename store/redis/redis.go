package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

// Options configures a Store. The program fills it from its configuration,
// whose defaults and validation (package config) are the only ones: New
// applies no default of its own, and refuses an Options whose required
// fields are unset. The combinations it does not check (ClusterMode with
// MasterName, DB on a Cluster, Sentinel credentials without MasterName)
// are the caller's to rule out, as config.Validate does.
type Options struct {
	// Addrs are the Redis addresses (host:port); what they address depends
	// on the other fields:
	//
	//   - MasterName set: the Sentinel addresses.
	//   - ClusterMode set, or several addresses: a Redis Cluster; the
	//     addresses are seeds, from which the client learns every node.
	//   - Otherwise (one address): a single node. A single address is never
	//     taken for a Cluster: a Cluster behind one configuration endpoint
	//     (AWS ElastiCache with cluster mode enabled) needs ClusterMode, or
	//     Ping fails, naming it.
	Addrs []string
	// ClusterMode uses the Redis Cluster client even for a single address,
	// such as a configuration endpoint (AWS ElastiCache, cluster mode
	// enabled). It cannot be combined with MasterName.
	ClusterMode bool
	// MasterName is the Sentinel master name; empty: no Sentinel.
	MasterName string
	// Username and Password authenticate to Redis (ACL user, or just a
	// password); with Sentinel, to the master and replicas.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves (their requirepass or ACL user), which may differ from
	// the data nodes' credentials; empty: the Sentinels need no auth. Only
	// with MasterName.
	SentinelUsername, SentinelPassword string
	// DB is the database number; it must be 0 for a Redis Cluster.
	DB int
	// TLS configures TLS; nil means plain TCP. The caller builds it, for
	// example with RootCAs for a private CA. An empty ServerName is filled
	// in for every connection from the host of the address dialled (Go's
	// tls.DialWithDialer does this): the configured address for a single
	// node, the address each node announces on a Cluster, the address the
	// Sentinels report for a Sentinel master. A ServerName that is set is
	// used for every node, so every node's certificate must carry it.
	TLS *tls.Config
	// KeyPrefix is put in front of every proxy key. It must be set: New
	// returns an error when it is empty.
	KeyPrefix string
	// DialTimeout bounds connecting to Redis. It must be positive: New
	// returns an error otherwise.
	DialTimeout time.Duration
	// OpTimeout bounds every store operation, retries included, on top of the
	// caller's context. It must be positive: New returns an error otherwise.
	OpTimeout time.Duration
	// SkipEvictionCheck turns off the checks of the settings that lose
	// keys (see "The settings that lose keys" in settings.go): the
	// eviction policy, persistence, evictions, and the replicas WaitAuto
	// waits for. Only for a Redis that refuses or hides INFO and is known
	// to run with maxmemory-policy noeviction or without maxmemory: an
	// evicted record lets a retried request through a second time.
	SkipEvictionCheck bool
	// AllowEviction and AllowNoPersistence are the operator's opt-ins to
	// an eviction policy and to no persistence: with them, such a setting
	// is reported (Risks, a log line) but reservations are not refused.
	// Evictions seen still call KeysEvicted.
	AllowEviction, AllowNoPersistence bool
	// KeysEvicted, when set, is called with what was seen when a master's
	// evicted_keys rose: the store lost keys. Nil: nothing is called.
	KeysEvicted func(reason string)
	// Logger receives a line whenever a setting that loses keys is seen
	// or goes, and for evictions; nil discards them.
	Logger *slog.Logger
	// EpochSeen, when set, is called with the epoch marker (epoch.go) read
	// on every new connection, before the connection is used; an error
	// fails the connection, so that nothing is reserved on a store that
	// forgot its keys. On a Cluster the marker's slot may live on another
	// node: it is called with read false (and m nil) instead. It is also
	// called when a reservation found the marker changed
	// (Store.ExpectEpoch). Nil: nothing is called.
	EpochSeen func(m *store.Epoch, read bool) error
	// WaitReplicas, when positive, makes every write of a record (a
	// reservation, commit, release, in-doubt mark, and the lookups of
	// reconciliation) wait until that many replicas acknowledged it (Redis
	// WAIT, see pipeline.go); fewer within WaitTimeout fail the write with
	// errNotReplicated. Zero waits for none: Redis replicates
	// asynchronously, and a failover may lose the writes of the last
	// replication lag. Not on a Redis Cluster, where New refuses it. With
	// it, go-redis does not resend a command that failed on the network: a
	// resent script that finds its own write makes none, and a WAIT after
	// it, on a new connection, would count replicas that never got the
	// first one.
	WaitReplicas int
	// WaitAuto makes every write of a record wait for one replica
	// whenever the master reports one or more online (INFO replication:
	// connected and past the first sync; read by the settings checks:
	// CheckSettings, Ping, a new connection), and for none while it
	// reports none; it needs
	// WaitReplicas 0. On a Redis Cluster it waits for none.
	WaitAuto bool
	// WaitTimeout bounds each WAIT; it must be positive when WaitReplicas
	// is or WaitAuto is set, and adds to OpTimeout for the writes that
	// wait.
	WaitTimeout time.Duration
	// RecordLayout is the layout the store writes records in (see "The
	// record layout" in scripts.go); records of either layout are read,
	// whatever it is. The zero value is layoutPacked; New refuses any
	// other value than the two layouts.
	RecordLayout RecordLayout
}

// RecordLayout is the layout a Store writes its records in.
type RecordLayout string

const (
	// layoutPacked writes each record as one string packed with
	// MessagePack: one write command per change (SET ... PX). Releases
	// before it cannot read such records.
	layoutPacked RecordLayout = "packed"
	// layoutHash writes each record as a hash, with the commands of the
	// release before the packed layout (HSET, HDEL, PEXPIRE), so that
	// replicas of that release read every record written: for a rolling
	// upgrade from it, or before a rollback to it.
	layoutHash RecordLayout = "hash"
)

// recordScripts are the scripts that write a record in one layout.
type recordScripts struct {
	reserve, reserveEpoch, commit, markInDoubt *goredis.Script
}

var layouts = map[RecordLayout]recordScripts{
	"":           {reserveScript, reserveEpochScript, commitScript, markInDoubtScript},
	layoutPacked: {reserveScript, reserveEpochScript, commitScript, markInDoubtScript},
	layoutHash:   {reserveHashScript, reserveHashEpochScript, commitHashScript, markInDoubtHashScript},
}

// errEvictionPolicy is wrapped by the *store.SettingError of a Redis that
// may evict records: maxmemory is set and maxmemory-policy is not
// noeviction.
var errEvictionPolicy = fmt.Errorf("%w: redis may evict idempotency records", store.ErrUnsafeSettings)

// Store is a store.Store kept in Redis. It is safe for concurrent use, also
// by several processes sharing one Redis.
type Store struct {
	client    goredis.UniversalClient
	pipe      *pipeliner
	prefix    string
	opTimeout time.Duration
	// writeTimeout bounds the operations that write a record: OpTimeout,
	// plus WaitTimeout when they wait for replicas.
	writeTimeout time.Duration
	// single is set for a single-node client (neither Cluster nor
	// Sentinel), whose node must not be a Cluster node.
	single bool
	// masterName is Options.MasterName: the checks name the Sentinel
	// master by it (its client's address is not a node's).
	masterName string
	// settings is the view of the settings that lose keys; nil with
	// Options.SkipEvictionCheck.
	settings *settings
	clock    redisClock // for reservation deadlines (deadline.go)
	// expect is the epoch ID reservations check (ExpectEpoch); nil or
	// "": none.
	expect    atomic.Pointer[string]
	epochSeen func(m *store.Epoch, read bool) error
	// scripts write records in Options.RecordLayout.
	scripts recordScripts
}

var _ store.Store = (*Store)(nil)

// New returns a Store for opts. It does not connect: the first operation (or
// Ping) does, and every operation reconnects as needed, so a Store outlives
// Redis restarts and failovers.
func New(opts Options) (*Store, error) {
	switch {
	case len(opts.Addrs) == 0:
		return nil, errors.New("redis store: no address")
	case opts.KeyPrefix == "":
		return nil, errors.New("redis store: no key prefix")
	case opts.DialTimeout <= 0:
		return nil, fmt.Errorf("redis store: dial timeout %v is not positive", opts.DialTimeout)
	case opts.OpTimeout <= 0:
		return nil, fmt.Errorf("redis store: op timeout %v is not positive", opts.OpTimeout)
	case opts.WaitReplicas < 0:
		return nil, fmt.Errorf("redis store: wait replicas %d is negative", opts.WaitReplicas)
	case (opts.WaitReplicas > 0 || opts.WaitAuto) && opts.WaitTimeout <= 0:
		return nil, fmt.Errorf("redis store: wait timeout %v is not positive", opts.WaitTimeout)
	case opts.WaitAuto && opts.WaitReplicas > 0:
		return nil, fmt.Errorf("redis store: wait replicas %d with wait auto", opts.WaitReplicas)
	}
	scripts, ok := layouts[opts.RecordLayout]
	if !ok {
		return nil, fmt.Errorf("redis store: record layout %q is not %s or %s", opts.RecordLayout, layoutPacked, layoutHash)
	}
	sentinel := opts.MasterName != ""
	cluster := !sentinel && (opts.ClusterMode || len(opts.Addrs) > 1)
	if cluster && opts.WaitReplicas > 0 {
		return nil, errors.New("redis store: waiting for replicas is not supported on a Redis Cluster")
	}
	if cluster {
		opts.WaitAuto = false // WAIT covers one node's connection: see Options.WaitReplicas
	}
	writeTimeout := opts.OpTimeout
	if opts.WaitReplicas > 0 || opts.WaitAuto {
		writeTimeout += opts.WaitTimeout
	}
	s := &Store{
		prefix:       opts.KeyPrefix,
		opTimeout:    opts.OpTimeout,
		writeTimeout: writeTimeout,
		single:       !sentinel && !cluster,
		masterName:   opts.MasterName,
		epochSeen:    opts.EpochSeen,
		scripts:      scripts,
	}
	if !opts.SkipEvictionCheck {
		s.settings = newSettings(opts)
	}
	uo := universalOptions(opts)
	if opts.EpochSeen != nil || s.settings != nil {
		uo.OnConnect = s.onConnect(cluster)
	}
	s.client = goredis.NewUniversalClient(uo)
	s.pipe = newPipeliner(s.client, s.opTimeout, opts.WaitReplicas, opts.WaitAuto, opts.WaitTimeout)
	return s, nil
}

// universalOptions maps opts (checked by New) to go-redis options.
func universalOptions(opts Options) *goredis.UniversalOptions {
	uo := &goredis.UniversalOptions{
		Addrs:            opts.Addrs,
		IsClusterMode:    opts.ClusterMode,
		MasterName:       opts.MasterName,
		Username:         opts.Username,
		Password:         opts.Password,
		SentinelUsername: opts.SentinelUsername,
		SentinelPassword: opts.SentinelPassword,
		DB:               opts.DB,
		TLSConfig:        opts.TLS,
		ClientName:       "idemproxy",

		DialTimeout: opts.DialTimeout,
		// One dial per attempt: MaxRetries already retries a refused dial,
		// and a Redis that is down should be reported (as a 503) with its
		// real cause, not after the whole op timeout was spent dialling.
		DialerRetries: 1,
		ReadTimeout:   opts.OpTimeout,
		WriteTimeout:  opts.OpTimeout,
		// Every call runs under a context bounded by OpTimeout; let that
		// deadline bound the socket reads and writes too.
		ContextTimeoutEnabled: true,

		// MaxRetries stays at the go-redis default: a command that failed on
		// the network is sent again, inside the same OpTimeout. Resending is
		// safe for every script here: a retried Reserve finds its own token
		// and answers "reserved" (see reserveScript), a retried Commit or
		// MarkInDoubt finds its own token and changes nothing new. Only a
		// retried Release or Delete whose first attempt was applied reports
		// ErrNotOwner or false, which leaves the key in the same, released,
		// state.
	}
	if opts.WaitReplicas > 0 || opts.WaitAuto {
		// A resent script that finds its own write makes none, and the
		// WAIT after it would count replicas that never got the first
		// write (see Options.WaitReplicas): no resending. A reply to WAIT
		// may take WaitTimeout more.
		uo.MaxRetries = -1
		uo.ReadTimeout += opts.WaitTimeout
	}
	return uo
}

// replicaWaitFailures returns how many writes failed because fewer replicas
// than Options.WaitReplicas acknowledged them (errNotReplicated).
func (s *Store) replicaWaitFailures() uint64 { return s.pipe.waitFailures.Load() }

// Close closes the connections to Redis.
func (s *Store) Close() error {
	s.pipe.close()
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis store: close: %w", err)
	}
	return nil
}

// Reserve implements store.Store.
func (s *Store) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if res.Token == "" {
		return nil, errors.New("redis store: reserve: empty token")
	}
	if res.Lease <= 0 || res.TTL <= 0 {
		return nil, fmt.Errorf("redis store: reserve: lease %v and ttl %v must be positive", res.Lease, res.TTL)
	}
	if err := store.CheckOrigin(res.Origin); err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	if err := s.SettingsErr(); err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	deadline, err := s.deadline(ctx)
	if err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	script, keys, args := s.scripts.reserve, []string{s.prefix + key},
		[]any{res.Token, res.Fingerprint, millis(res.Lease), millis(res.TTL), deadline, res.Origin}
	if id := s.expectedEpoch(); id != "" {
		script, keys, args = s.scripts.reserveEpoch, append(keys, s.epochKey()), append(args, id)
	}
	v, err := s.pipe.run(ctx, true, script, keys, args...).Slice()
	if err != nil {
		switch {
		case strings.Contains(err.Error(), lateReply):
			err = errReserveLate
		case strings.Contains(err.Error(), epochReply):
			s.epochChanged(ctx)
			err = fmt.Errorf("%w: the epoch marker changed under a reservation", store.ErrKeysLost)
		}
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	return rec, nil
}

// Commit implements store.Store. The record may also be in doubt (its lease
// ran out, or it was marked so) as long as it carries token: the answer is
// known now, and storing it beats keeping the doubt. Committing twice keeps
// the first answer.
func (s *Store) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("redis store: commit: ttl %v must be positive", ttl)
	}
	b, err := encodeResponse(resp)
	if err != nil {
		return fmt.Errorf("redis store: commit: encode response: %w", err)
	}
	return s.fenced(ctx, "commit", s.scripts.commit, key, token, b, millis(ttl))
}

// Release implements store.Store: the record is deleted, whatever its
// state, when it carries token.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	return s.fenced(ctx, "release", releaseScript, key, token)
}

// MarkInDoubt implements store.Store. A record that is already completed
// stays completed: a known answer is never turned into a doubt.
func (s *Store) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("redis store: mark in doubt: ttl %v must be positive", ttl)
	}
	return s.fenced(ctx, "mark in doubt", s.scripts.markInDoubt, key, token, millis(ttl))
}

// fenced runs one of the token-checked scripts, which answer 1 (done) or 0
// (the record does not carry token).
func (s *Store) fenced(ctx context.Context, op string, script *goredis.Script, key, token string, args ...any) error {
	if token == "" {
		return fmt.Errorf("redis store: %s: empty token", op)
	}
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	n, err := s.pipe.run(ctx, true, script, []string{s.prefix + key}, append([]any{token}, args...)...).Int64()
	if err != nil {
		return fmt.Errorf("redis store: %s: %w", op, err)
	}
	if n != 1 {
		return store.ErrNotOwner
	}
	return nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := s.pipe.run(ctx, false, getScript, []string{s.prefix + key}).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis store: get: %w", err)
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("redis store: get: %w", err)
	}
	return rec, nil
}

// forEachNode runs fn on every master of a Cluster, at once, or on the
// one node of a single node or Sentinel.
func (s *Store) forEachNode(ctx context.Context, fn func(context.Context, *goredis.Client) error) error {
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *goredis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("unexpected client %T", s.client)
	}
}

// Ping implements store.Store: Redis answers, and is fit to keep records.
// On a Redis Cluster every master must pass; with Sentinel, the master.
//
// Fit means: unless Options.SkipEvictionCheck, no setting that loses keys
// is seen that the operator did not opt in to (see "The settings that
// lose keys" in settings.go; Ping checks them again, as CONFIG SET can
// change them at any time), and Ping fails with the *store.SettingError
// that names it. A single-node Store also fails when its node is a
// Cluster node, since most keys would then be answered with MOVED: that
// address needs Options.ClusterMode. The checks use INFO, not CONFIG,
// which managed services often refuse (CONFIG GET save only where it is
// allowed).
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	var err error
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			if err := s.checkNode(ctx, n, false); err != nil {
				return fmt.Errorf("node %s: %w", n.Options().Addr, err)
			}
			return nil
		})
	case *goredis.Client:
		err = s.checkNode(ctx, c, s.single)
	default:
		err = fmt.Errorf("unexpected client %T", s.client)
	}
	if err == nil && s.settings != nil {
		if err = s.CheckSettings(ctx); err == nil {
			err = s.SettingsErr()
		}
	}
	if err != nil {
		return fmt.Errorf("redis store: ping: %w", err)
	}
	return nil
}

// checkNode pings one node and, with single, checks that it is not a
// Cluster node. The commands go one by one, not in a pipeline: go-redis
// gives pipelines a connection pool of their own, and Ping must exercise
// the pool that the store's operations use.
func (s *Store) checkNode(ctx context.Context, c *goredis.Client, single bool) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	if single {
		info, err := c.Info(ctx, "cluster").Result()
		var refused goredis.Error
		switch {
		case errors.As(err, &refused):
			// INFO refused (an ACL without INFO): the Cluster check is a
			// diagnosis only, skip it.
		case err != nil:
			return fmt.Errorf("INFO cluster: %w", err)
		case infoField(info, "cluster_enabled") == "1":
			return errors.New("the node is part of a Redis Cluster, but one address without cluster mode means a single node: enable cluster mode for a configuration endpoint, or list several seed addresses")
		}
	}
	return nil
}

// infoField returns the value of field in INFO text, or "".
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("redis store: empty key")
	}
	return nil
}

// millis converts d to whole milliseconds, rounding up so that a positive
// duration never becomes 0 (PEXPIRE 0 would delete the key at once). It
// rounds without adding to d: d + 1ms - 1 overflows for a duration within a
// millisecond of the largest one (a ttl the configuration accepts), and a
// negative PEXPIRE deletes the key at once too.
func millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

// decodeRecord turns a reply of reserveScript or getScript into a record:
// {1} means none (reserved, or no record), {0, packed, pttl, now} a
// record in the packed layout, and {0, st, tok, fp, cr, le, resp, og,
// pttl, now} one in the hash layout (og: nil for a hash without origin).
func decodeRecord(v []any) (*store.Record, error) {
	if len(v) == 0 {
		return nil, errors.New("empty script reply")
	}
	if flag, _ := v[0].(int64); flag == 1 {
		return nil, nil
	}
	if len(v) == 4 {
		p, err := decodePacked(str(v[1]))
		if err != nil {
			return nil, err
		}
		le, resp := any(nil), any(nil)
		if p.le != 0 {
			le = strconv.FormatInt(p.le, 10)
		}
		if p.resp != "" {
			resp = p.resp
		}
		v = []any{int64(0), p.st, p.tok, p.fp, strconv.FormatInt(p.cr, 10), le, resp, p.og, v[2], v[3]}
	}
	if len(v) != 10 {
		return nil, fmt.Errorf("script reply has %d elements, want 10", len(v))
	}
	st := store.State(str(v[1]))
	switch st {
	case store.StateInFlight, store.StateCompleted, store.StateInDoubt:
	default:
		return nil, fmt.Errorf("record has unknown state %q", st)
	}
	cr, err := msField("cr", v[4])
	if err != nil {
		return nil, err
	}
	pttl, _ := v[8].(int64)
	now, _ := v[9].(int64)
	rec := &store.Record{
		State:       st,
		Token:       str(v[2]),
		Fingerprint: str(v[3]),
		CreatedAt:   time.UnixMilli(cr),
		Origin:      str(v[7]),
	}
	if pttl >= 0 {
		rec.ExpiresAt = time.UnixMilli(now + pttl)
	}
	if st == store.StateInFlight {
		le, err := msField("le", v[5])
		if err != nil {
			return nil, err
		}
		if le <= now {
			// The lease ran out: whoever held it may have reached the
			// upstream. The transition is derived, not stored; the TTL
			// stays what it was.
			rec.State = store.StateInDoubt
		} else {
			rec.LeaseExpiresAt = time.UnixMilli(le)
		}
	}
	if st == store.StateCompleted {
		raw := str(v[6])
		if raw == "" {
			return nil, errors.New("completed record has no response")
		}
		resp, err := decodeResponse([]byte(raw))
		if err != nil {
			return nil, fmt.Errorf("decode stored response: %w", err)
		}
		rec.Response = &resp
	}
	return rec, nil
}

// str returns a bulk string reply element; nil (and the false a RESP3
// connection may carry for a Lua false) read as "".
func str(v any) string {
	s, _ := v.(string)
	return s
}

func msField(name string, v any) (int64, error) {
	n, err := strconv.ParseInt(str(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("record field %s: %q is not a time in milliseconds", name, str(v))
	}
	return n, nil
}
