package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

// The epoch marker (store.EpochStore) is a hash without TTL under the key
// prefix, <prefix>epoch: record keys always hold a '/', this one does not,
// so no route's key can reach it; List and Unscheduled pass it by, like
// the reconcile schedule. Its fields are named apart from a record's
// (no 'st', 'tok'), so a scan that read it as a record would find no
// state. On a Cluster it is one key in one slot; no script reads it
// together with a record key.

var _ store.EpochStore = (*Store)(nil)

// epochFields are the marker's hash fields, in the order the scripts
// return them.
var epochFields = []string{"eid", "est", "gen", "at", "prev", "note"}

// epochKey returns the Redis key of the epoch marker.
func (s *Store) epochKey() string { return s.prefix + "epoch" }

// swapEpochScript replaces the marker when its ID is ARGV[1] (” : none).
//
//	KEYS[1] marker key
//	ARGV    old ID, then the new marker's fields (epochFields' order)
//
// It returns {1} when it wrote, else {0, <fields of the current marker>}.
var swapEpochScript = goredis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'eid') or ''
if cur ~= ARGV[1] then
  local f = redis.call('HMGET', KEYS[1], 'eid', 'est', 'gen', 'at', 'prev', 'note')
  return {0, f[1], f[2], f[3], f[4], f[5], f[6]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'eid', ARGV[2], 'est', ARGV[3], 'gen', ARGV[4], 'at', ARGV[5], 'prev', ARGV[6], 'note', ARGV[7])
return {1}
`)

// Epoch implements store.EpochStore.
func (s *Store) Epoch(ctx context.Context) (*store.Epoch, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := s.client.HMGet(ctx, s.epochKey(), epochFields...).Result()
	if err != nil {
		return nil, fmt.Errorf("redis store: read the epoch marker: %w", err)
	}
	e, err := decodeEpoch(v)
	if err != nil {
		return nil, fmt.Errorf("redis store: read the epoch marker: %w", err)
	}
	return e, nil
}

// SwapEpoch implements store.EpochStore.
func (s *Store) SwapEpoch(ctx context.Context, old string, e store.Epoch) (*store.Epoch, bool, error) {
	if e.ID == "" {
		return nil, false, errors.New("redis store: swap epoch: empty ID")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	v, err := swapEpochScript.Run(ctx, s.client, []string{s.epochKey()}, old,
		e.ID, string(e.State), strconv.FormatUint(e.Gen, 10), strconv.FormatInt(e.CreatedAt.UnixMilli(), 10),
		e.Previous, e.Note).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("redis store: swap epoch: %w", err)
	}
	if flag, _ := v[0].(int64); flag == 1 {
		return &e, true, nil
	}
	cur, err := decodeEpoch(v[1:])
	if err != nil {
		return nil, false, fmt.Errorf("redis store: swap epoch: %w", err)
	}
	return cur, false, nil
}

// decodeEpoch turns the marker's fields (epochFields' order) into an
// Epoch; nil when there is no marker.
func decodeEpoch(v []any) (*store.Epoch, error) {
	if len(v) != len(epochFields) {
		return nil, fmt.Errorf("marker reply has %d fields, want %d", len(v), len(epochFields))
	}
	if str(v[0]) == "" {
		return nil, nil
	}
	gen, err := strconv.ParseUint(str(v[2]), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("marker field gen %q is not a number", str(v[2]))
	}
	at, err := strconv.ParseInt(str(v[3]), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("marker field at %q is not a time in milliseconds", str(v[3]))
	}
	return &store.Epoch{ID: str(v[0]), State: store.EpochState(str(v[1])), Gen: gen,
		CreatedAt: time.UnixMilli(at), Previous: str(v[4]), Note: str(v[5])}, nil
}

// epochReply starts the error of reserveEpochScript for a marker that is
// not the expected one.
const epochReply = "IDEMPROXY_EPOCH"

// ExpectEpoch makes every reservation check, in its script, that the
// marker's ID is id ("": stop checking). It does nothing on a Cluster,
// where the marker and a record key are in different slots. The program
// calls it with the epoch the replica trusts.
func (s *Store) ExpectEpoch(id string) {
	if _, cluster := s.client.(*goredis.ClusterClient); cluster {
		return
	}
	s.expect.Store(&id)
}

func (s *Store) expectedEpoch() string {
	if p := s.expect.Load(); p != nil {
		return *p
	}
	return ""
}

// epochChanged tells Options.EpochSeen the marker a reservation found
// changed.
func (s *Store) epochChanged(ctx context.Context) {
	if s.epochSeen == nil {
		return
	}
	if m, err := s.Epoch(ctx); err == nil {
		s.epochSeen(m, true)
	}
}

// onConnect is the go-redis OnConnect hook: the settings that lose keys
// checked on the new connection (settings.go), and Options.EpochSeen with
// the marker read on it. A failed read does not fail the
// connection: the watcher's checks see the store as it is.
func (s *Store) onConnect(cluster bool) func(ctx context.Context, cn *goredis.Conn) error {
	key := s.epochKey()
	return func(ctx context.Context, cn *goredis.Conn) error {
		if s.settings != nil {
			s.connSettings(ctx, cn)
		}
		if s.epochSeen == nil {
			return nil
		}
		if cluster {
			return s.epochSeen(nil, false)
		}
		v, err := cn.HMGet(ctx, key, epochFields...).Result()
		if err != nil {
			return nil
		}
		m, err := decodeEpoch(v)
		if err != nil {
			return nil
		}
		return s.epochSeen(m, true)
	}
}

// Incarnation names the Redis server processes the store reaches: the
// run_id of INFO server (every master's on a Cluster, in address order),
// which changes when a server restarts or a failover promotes another.
func (s *Store) Incarnation(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	runID := func(ctx context.Context, c *goredis.Client) (string, error) {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return "", err
		}
		return infoField(info, "run_id"), nil
	}
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		var (
			mu  sync.Mutex
			ids []string
		)
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			id, err := runID(ctx, n)
			mu.Lock()
			ids = append(ids, n.Options().Addr+"="+id)
			mu.Unlock()
			return err
		})
		slices.Sort(ids)
		return strings.Join(ids, ","), err
	case *goredis.Client:
		return runID(ctx, c)
	default:
		return "", fmt.Errorf("unexpected client %T", s.client)
	}
}
