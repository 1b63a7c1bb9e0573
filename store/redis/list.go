package redis

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

var _ store.Lister = (*Store)(nil)

// listScript reads what a listing shows of one record (either layout,
// see scripts.go): {st, cr, le,
// stored status, pttl, now}, or {} when there is none. The stored status
// is read from the start of the response JSON (encodeResponse writes it
// first), so the body is never sent.
const listScript = nowMillis + `
local v = redis.pcall('GET', KEYS[1])
local f
if type(v) == 'string' then
  local _, st, _, _, cr, le, resp = cmsgpack.unpack(v)
  f = {st, string.format('%d', cr), le ~= 0 and string.format('%d', le) or false, resp ~= '' and resp or false}
else
  f = redis.call('HMGET', KEYS[1], 'st', 'cr', 'le', 'resp')
end
if not f[1] then return {} end
local status = 0
if f[1] == 'completed' and f[4] then
  status = tonumber(string.match(f[4], '^{"status":(%d+)')) or 0
end
return {f[1], f[2] or '', f[3] or '', status, redis.call('PTTL', KEYS[1]), now}
`

// listCursor is the state of a listing between pages: the node being
// scanned (its address; "" on a single node or Sentinel master), its SCAN
// cursor, and, when a page ended inside the batch that cursor returns,
// the last key listed of that batch. The prefix ties it to its listing.
type listCursor struct {
	Prefix string `json:"p"`
	Node   string `json:"n,omitempty"`
	Scan   uint64 `json:"c,omitempty"`
	After  string `json:"k,omitempty"`
	// Seen holds the hashes (keyHash64, 8 bytes each) of the last keys
	// listed, at most maxSeen: a key SCAN returns again is not listed
	// again (see seenKeys).
	Seen []byte `json:"s,omitempty"`
}

// maxSeen bounds the keys a cursor remembers (seenKeys): 128 hashes of
// 8 bytes, about 1.4 KB of cursor.
const maxSeen = 128

// seenKeys is what a listing remembers of the keys it listed, so that a
// key SCAN returns twice is listed once. SCAN returns a key again when the
// node's hash table shrinks (or is rehashed) between two SCAN calls, as
// keys of other routes or applications come and go: the buckets SCAN
// visits again after a shrink are those it visited just before, so the
// keys it repeats are among the last ones listed. A listing remembers the
// hashes of every key of its page and of the last maxSeen keys of earlier
// pages (carried in the cursor): memory bounded by the page, and a key
// listed long before may in theory come back after a large shrink.
type seenKeys struct {
	set   map[uint64]struct{}
	order []uint64
}

func newSeenKeys(carried []byte) *seenKeys {
	s := &seenKeys{set: map[uint64]struct{}{}}
	for i := 0; i+8 <= len(carried); i += 8 {
		s.add(binary.BigEndian.Uint64(carried[i:]))
	}
	return s
}

// keyHash64 is the 64-bit FNV-1a hash of key: the same in every replica,
// since cursors pass between them.
func keyHash64(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

func (s *seenKeys) has(h uint64) bool { _, ok := s.set[h]; return ok }

func (s *seenKeys) add(h uint64) {
	if !s.has(h) {
		s.set[h] = struct{}{}
		s.order = append(s.order, h)
	}
}

// carry returns the hashes of the last maxSeen keys, for the cursor.
func (s *seenKeys) carry() []byte {
	last := s.order[max(0, len(s.order)-maxSeen):]
	b := make([]byte, 0, 8*len(last))
	for _, h := range last {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return b
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // strings and a number: cannot fail
	return "r1." + base64.RawURLEncoding.EncodeToString(b)
}

func decodeListCursor(s, prefix string) (listCursor, error) {
	if s == "" {
		return listCursor{Prefix: prefix}, nil
	}
	rest, ok := strings.CutPrefix(s, "r1.")
	if !ok {
		return listCursor{}, store.ErrBadCursor
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return listCursor{}, store.ErrBadCursor
	}
	var c listCursor
	if err := json.Unmarshal(b, &c); err != nil || c.Prefix != prefix || len(c.Seen) > 8*maxSeen || len(c.Seen)%8 != 0 {
		return listCursor{}, store.ErrBadCursor
	}
	return c, nil
}

// listNode is one node a listing scans.
type listNode struct {
	addr   string
	client *goredis.Client
}

// nodes returns the nodes that hold the records: the masters of a
// Cluster in address order, or the one node.
func (s *Store) nodes(ctx context.Context) ([]listNode, error) {
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		var (
			mu    sync.Mutex
			nodes []listNode
		)
		err := c.ForEachMaster(ctx, func(_ context.Context, n *goredis.Client) error {
			mu.Lock()
			nodes = append(nodes, listNode{n.Options().Addr, n})
			mu.Unlock()
			return nil
		})
		slices.SortFunc(nodes, func(a, b listNode) int { return strings.Compare(a.addr, b.addr) })
		return nodes, err
	case *goredis.Client:
		return []listNode{{"", c}}, nil
	default:
		return nil, fmt.Errorf("unexpected client %T", s.client)
	}
}

// List implements store.Lister with SCAN over the keys matching the key
// prefix and q.Prefix (glob characters escaped), one node after the other
// on a Cluster (the cursor says which): a call runs at most
// q.Budget()/count SCANs of count keys each, plus one pipelined read of
// the matching keys per SCAN, each within the op timeout, so a page may be
// short. SCAN walks the whole database (every route's keys, and other
// applications' keys in a shared Redis), MATCH only filtering what it
// returns: listing a route costs reading every key of the database. The keys of one
// SCAN batch are taken in key order, so a page can end inside a batch and
// the next resume after its last key. SCAN returns a key again when the
// node's hash table shrinks between two calls (keys of other routes or
// applications removed meanwhile); the listing does not list it again as
// long as it is among the last maxSeen keys listed, which the cursor
// remembers (seenKeys), as the keys SCAN repeats are. A page that ended
// inside a SCAN batch while the table shrank may still miss keys of the
// merged buckets that sort before its last key, and a Cluster resharding
// or failing over meanwhile may skip or repeat keys. A lapsed lease is
// judged by Redis' clock, as Get does.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Listed, string, error) {
	if q.Limit <= 0 {
		return nil, "", fmt.Errorf("redis store: list: limit %d is not positive", q.Limit)
	}
	cur, err := decodeListCursor(q.Cursor, q.Prefix)
	if err != nil {
		return nil, "", err
	}
	nodes, err := s.nodesWithin(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("redis store: list: %w", err)
	}
	// The node of the cursor, or the first after it in address order
	// when it is no longer a master (a failover): its scan starts over.
	i, found := slices.BinarySearchFunc(nodes, cur.Node, func(n listNode, addr string) int { return strings.Compare(n.addr, addr) })
	if !found {
		cur.Scan, cur.After = 0, ""
	}
	count := min(max(q.Limit, 100), 1000)
	return s.list(ctx, q, cur, nodes, i, int64(count), max(1, q.Budget()/count))
}

// list runs List from node i and cur, with at most scans SCANs of count.
func (s *Store) list(ctx context.Context, q store.ListQuery, cur listCursor, nodes []listNode, i int, count int64, scans int) ([]store.Listed, string, error) {
	match := globEscape(s.prefix+q.Prefix) + "*"
	var recs []store.Listed
	seen := newSeenKeys(cur.Seen)
	next := func() string { cur.Seen = seen.carry(); return cur.encode() }
	for i < len(nodes) {
		if scans == 0 {
			return recs, next(), nil
		}
		scans--
		cur.Node = nodes[i].addr // the cursor of a page that ends here
		batch, scanNext, err := s.scanWithin(ctx, nodes[i].client, cur.Scan, match, count)
		if err != nil {
			return nil, "", fmt.Errorf("redis store: list: scan %s: %w", nodes[i].addr, err)
		}
		slices.Sort(batch)
		if cur.After != "" {
			j, found := slices.BinarySearch(batch, s.prefix+cur.After)
			if found {
				j++
			}
			batch = batch[j:]
		}
		got, err := s.listBatch(ctx, nodes[i].client, batch, q)
		if err != nil {
			return nil, "", fmt.Errorf("redis store: list: %w", err)
		}
		for _, l := range got {
			if l == nil {
				continue
			}
			h := keyHash64(l.Key)
			if seen.has(h) {
				continue // SCAN returned it again
			}
			if len(recs) == q.Limit {
				// The batch holds more: the next page reads it again,
				// from after the last key listed (which is in it: a page
				// that fills up ends with its batch).
				cur.After = recs[len(recs)-1].Key
				return recs, next(), nil
			}
			recs = append(recs, *l)
			seen.add(h)
		}
		cur.Scan, cur.After = scanNext, ""
		if scanNext == 0 {
			// This node is done: the next one's scan starts.
			if i++; i < len(nodes) {
				cur.Node = nodes[i].addr
			}
		}
		if len(recs) == q.Limit {
			break
		}
	}
	if i == len(nodes) {
		return recs, "", nil
	}
	return recs, next(), nil
}

// nodesWithin is nodes within the op timeout.
func (s *Store) nodesWithin(ctx context.Context) ([]listNode, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	return s.nodes(ctx)
}

// scanWithin runs one SCAN within the op timeout.
func (s *Store) scanWithin(ctx context.Context, c *goredis.Client, cursor uint64, match string, count int64) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	return c.Scan(ctx, cursor, match, count).Result()
}

// listBatch reads the records of batch (full Redis keys, on node c) in one
// pipeline and returns, in batch's order, those q selects (nil for the
// others, and for records gone meanwhile).
func (s *Store) listBatch(ctx context.Context, c *goredis.Client, batch []string, q store.ListQuery) ([]*store.Listed, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	out := make([]*store.Listed, len(batch))
	pipe := c.Pipeline()
	cmds := make([]*goredis.Cmd, len(batch))
	for j, k := range batch {
		key := strings.TrimPrefix(k, s.prefix)
		if k == s.scheduleKey() || k == s.epochKey() || k == s.keyspacesKey() || (q.KeyHash != "" && store.KeyHash(key) != q.KeyHash) {
			continue
		}
		cmds[j] = pipe.Eval(ctx, listScript, []string{k})
	}
	if pipe.Len() == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return nil, err
	}
	for j, cmd := range cmds {
		if cmd == nil {
			continue
		}
		v, err := cmd.Slice()
		if err != nil {
			return nil, err
		}
		key := strings.TrimPrefix(batch[j], s.prefix)
		l, err := decodeListed(key, v)
		if err != nil {
			return nil, fmt.Errorf("record %s: %w", store.KeyHash(key), err)
		}
		if l != nil && q.Matches(key, l.State) {
			out[j] = l
		}
	}
	return out, nil
}

// decodeListed turns a reply of listScript into a listed record; nil for
// none.
func decodeListed(key string, v []any) (*store.Listed, error) {
	if len(v) == 0 {
		return nil, nil
	}
	if len(v) != 6 {
		return nil, fmt.Errorf("list script reply has %d elements, want 6", len(v))
	}
	st := store.State(str(v[0]))
	switch st {
	case store.StateInFlight, store.StateCompleted, store.StateInDoubt:
	default:
		return nil, fmt.Errorf("record has unknown state %q", st)
	}
	cr, err := msField("cr", v[1])
	if err != nil {
		return nil, err
	}
	status, _ := v[3].(int64)
	pttl, _ := v[4].(int64)
	now, _ := v[5].(int64)
	if pttl == -2 {
		return nil, nil // expired between the two reads
	}
	l := &store.Listed{Key: key, State: st, CreatedAt: time.UnixMilli(cr), StoredStatus: int(status)}
	if pttl >= 0 {
		l.ExpiresAt = time.UnixMilli(now + pttl)
	}
	if st == store.StateInFlight {
		le, err := msField("le", v[2])
		if err != nil {
			return nil, err
		}
		if le <= now {
			l.State = store.StateInDoubt // as Get reports it
		} else {
			l.LeaseExpiresAt = time.UnixMilli(le)
		}
	}
	return l, nil
}
