package redis

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/proxy"
)

// Defaults for zero Options fields.
const (
	DefaultKeyPrefix   = "idemproxy:"
	DefaultDialTimeout = time.Second
	DefaultOpTimeout   = 500 * time.Millisecond
)

// Options configures a Store.
type Options struct {
	// Addrs are the Redis addresses (host:port). One address without
	// MasterName: a single node. Several without MasterName: a Redis Cluster
	// (the addresses are seeds). With MasterName: Sentinel addresses.
	Addrs []string
	// MasterName is the Sentinel master name; empty: no Sentinel.
	MasterName string
	// Username and Password authenticate (ACL user, or just a password).
	Username, Password string
	// DB is the database number; it must be 0 for a Redis Cluster.
	DB int
	// TLS configures TLS; nil means plain TCP.
	TLS *tls.Config
	// KeyPrefix is put in front of every proxy key; empty means
	// DefaultKeyPrefix ("idemproxy:").
	KeyPrefix string
	// DialTimeout bounds connecting to Redis; zero means DefaultDialTimeout
	// (1s).
	DialTimeout time.Duration
	// OpTimeout bounds every store operation, retries included, on top of the
	// caller's context; zero means DefaultOpTimeout (500ms).
	OpTimeout time.Duration
}

// Store is a proxy.Store kept in Redis. It is safe for concurrent use, also
// by several processes sharing one Redis.
type Store struct {
	client    goredis.UniversalClient
	prefix    string
	opTimeout time.Duration
}

var _ proxy.Store = (*Store)(nil)

// New returns a Store for opts. It does not connect: the first operation (or
// Ping) does, and every operation reconnects as needed, so a Store outlives
// Redis restarts and failovers.
func New(opts Options) (*Store, error) {
	if len(opts.Addrs) == 0 {
		return nil, errors.New("redis store: no address")
	}
	if opts.DB != 0 && opts.MasterName == "" && len(opts.Addrs) > 1 {
		return nil, fmt.Errorf("redis store: db %d: redis cluster has only db 0", opts.DB)
	}
	if opts.DialTimeout < 0 || opts.OpTimeout < 0 {
		return nil, errors.New("redis store: negative timeout")
	}
	s := &Store{prefix: opts.KeyPrefix, opTimeout: opts.OpTimeout}
	if s.prefix == "" {
		s.prefix = DefaultKeyPrefix
	}
	if s.opTimeout == 0 {
		s.opTimeout = DefaultOpTimeout
	}
	dial := opts.DialTimeout
	if dial == 0 {
		dial = DefaultDialTimeout
	}
	s.client = goredis.NewUniversalClient(&goredis.UniversalOptions{
		Addrs:      opts.Addrs,
		MasterName: opts.MasterName,
		Username:   opts.Username,
		Password:   opts.Password,
		DB:         opts.DB,
		TLSConfig:  opts.TLS,
		ClientName: "idemproxy",

		DialTimeout: dial,
		// One dial per attempt: MaxRetries already retries a refused dial,
		// and a Redis that is down should be reported (as a 503) with its
		// real cause, not after the whole op timeout was spent dialling.
		DialerRetries: 1,
		ReadTimeout:   s.opTimeout,
		WriteTimeout:  s.opTimeout,
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
	})
	return s, nil
}

// Close closes the connections to Redis.
func (s *Store) Close() error {
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis store: close: %w", err)
	}
	return nil
}

// Reserve implements proxy.Store.
func (s *Store) Reserve(ctx context.Context, key string, res proxy.Reservation) (*proxy.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if res.Token == "" {
		return nil, errors.New("redis store: reserve: empty token")
	}
	if res.Lease <= 0 || res.TTL <= 0 {
		return nil, fmt.Errorf("redis store: reserve: lease %v and ttl %v must be positive", res.Lease, res.TTL)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := reserveScript.Run(ctx, s.client, []string{s.prefix + key},
		res.Token, res.Fingerprint, millis(res.Lease), millis(res.TTL)).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("redis store: reserve: %w", err)
	}
	return rec, nil
}

// Commit implements proxy.Store. The record may also be in doubt (its lease
// ran out, or it was marked so) as long as it carries token: the answer is
// known now, and storing it beats keeping the doubt. Committing twice keeps
// the first answer.
func (s *Store) Commit(ctx context.Context, key, token string, resp proxy.Response, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("redis store: commit: ttl %v must be positive", ttl)
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("redis store: commit: encode response: %w", err)
	}
	return s.fenced(ctx, "commit", commitScript, key, token, string(b), millis(ttl))
}

// Release implements proxy.Store: the record is deleted, whatever its
// state, when it carries token.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	return s.fenced(ctx, "release", releaseScript, key, token)
}

// MarkInDoubt implements proxy.Store. A record that is already completed
// stays completed: a known answer is never turned into a doubt.
func (s *Store) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("redis store: mark in doubt: ttl %v must be positive", ttl)
	}
	return s.fenced(ctx, "mark in doubt", markInDoubtScript, key, token, millis(ttl))
}

// fenced runs one of the token-checked scripts, which answer 1 (done) or 0
// (the record does not carry token).
func (s *Store) fenced(ctx context.Context, op string, script *goredis.Script, key, token string, args ...any) error {
	if token == "" {
		return fmt.Errorf("redis store: %s: empty token", op)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	n, err := script.Run(ctx, s.client, []string{s.prefix + key}, append([]any{token}, args...)...).Int64()
	if err != nil {
		return fmt.Errorf("redis store: %s: %w", op, err)
	}
	if n != 1 {
		return proxy.ErrNotOwner
	}
	return nil
}

// Get implements proxy.Store.
func (s *Store) Get(ctx context.Context, key string) (*proxy.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := getScript.Run(ctx, s.client, []string{s.prefix + key}).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis store: get: %w", err)
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("redis store: get: %w", err)
	}
	return rec, nil
}

// Delete implements proxy.Store.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	n, err := s.client.Del(ctx, s.prefix+key).Result()
	if err != nil {
		return false, fmt.Errorf("redis store: delete: %w", err)
	}
	return n > 0, nil
}

// Ping implements proxy.Store. On a Redis Cluster every master must answer.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	var err error
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redis store: ping: %w", err)
	}
	return nil
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("redis store: empty key")
	}
	return nil
}

// millis converts d to whole milliseconds, rounding up so that a positive
// duration never becomes 0 (PEXPIRE 0 would delete the key at once).
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// decodeRecord turns a reply of reserveScript or getScript into a record:
// {1} means none (reserved, or no record), otherwise
// {0, st, tok, fp, cr, le, resp, pttl, now}.
func decodeRecord(v []any) (*proxy.Record, error) {
	if len(v) == 0 {
		return nil, errors.New("empty script reply")
	}
	if flag, _ := v[0].(int64); flag == 1 {
		return nil, nil
	}
	if len(v) != 9 {
		return nil, fmt.Errorf("script reply has %d elements, want 9", len(v))
	}
	st := proxy.State(str(v[1]))
	switch st {
	case proxy.StateInFlight, proxy.StateCompleted, proxy.StateInDoubt:
	default:
		return nil, fmt.Errorf("record has unknown state %q", st)
	}
	cr, err := msField("cr", v[4])
	if err != nil {
		return nil, err
	}
	pttl, _ := v[7].(int64)
	now, _ := v[8].(int64)
	rec := &proxy.Record{
		State:       st,
		Token:       str(v[2]),
		Fingerprint: str(v[3]),
		CreatedAt:   time.UnixMilli(cr),
	}
	if pttl >= 0 {
		rec.ExpiresAt = time.UnixMilli(now + pttl)
	}
	if st == proxy.StateInFlight {
		le, err := msField("le", v[5])
		if err != nil {
			return nil, err
		}
		if le <= now {
			// The lease ran out: whoever held it may have reached the
			// upstream. The transition is derived, not stored; the TTL
			// stays what it was.
			rec.State = proxy.StateInDoubt
		} else {
			rec.LeaseExpiresAt = time.UnixMilli(le)
		}
	}
	if st == proxy.StateCompleted {
		raw := str(v[6])
		if raw == "" {
			return nil, errors.New("completed record has no response")
		}
		var resp proxy.Response
		if err := json.Unmarshal([]byte(raw), &resp); err != nil {
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
