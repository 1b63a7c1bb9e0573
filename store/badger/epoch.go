package badger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// The epoch marker (store.EpochStore) is a key of the database, without
// expiry: epochKey begins with a zero byte, which no record key (a route
// name first) does, and carries UserMeta metaEpoch, which no scan for
// records selects; List passes by every key that begins with a zero byte.
// A data directory replaced by an empty one while the proxy runs (the
// Guard reopens it) has no marker: the watcher that remembers the old one
// sees it gone.

// epochKey is the marker's key.
const epochKey = "\x00epoch"

// metaEpoch is the UserMeta of the marker.
const metaEpoch byte = 5

var (
	_ store.EpochStore = (*Store)(nil)
	_ store.EpochStore = (*Guard)(nil)
)

// epochValue is the marker as stored.
type epochValue struct {
	ID        string `json:"id"`
	State     string `json:"st"`
	Gen       uint64 `json:"gen"`
	CreatedAt int64  `json:"at"` // Unix ms
	Previous  string `json:"prev,omitempty"`
	Note      string `json:"note,omitempty"`
}

func readEpoch(txn getter) (*store.Epoch, error) {
	item, err := txn.Get([]byte(epochKey))
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, asFault(err)
	}
	var v epochValue
	if err := item.Value(func(b []byte) error { return json.Unmarshal(b, &v) }); err != nil {
		return nil, fmt.Errorf("decode the epoch marker: %w", err)
	}
	return &store.Epoch{ID: v.ID, State: store.EpochState(v.State), Gen: v.Gen,
		CreatedAt: time.UnixMilli(v.CreatedAt), Previous: v.Previous, Note: v.Note}, nil
}

// Epoch implements store.EpochStore.
func (s *Store) Epoch(ctx context.Context) (*store.Epoch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var e *store.Epoch
	err := s.view(func(txn *bdg.Txn) error {
		var err error
		e, err = readEpoch(txn)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("badger: read the epoch marker: %w", err)
	}
	return e, nil
}

// SwapEpoch implements store.EpochStore; the write is synced.
func (s *Store) SwapEpoch(ctx context.Context, old string, e store.Epoch) (*store.Epoch, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if e.ID == "" {
		return nil, false, errors.New("badger: swap epoch: empty ID")
	}
	b, err := json.Marshal(epochValue{ID: e.ID, State: string(e.State), Gen: e.Gen, CreatedAt: e.CreatedAt.UnixMilli(),
		Previous: e.Previous, Note: e.Note})
	if err != nil {
		return nil, false, err
	}
	var (
		cur     *store.Epoch
		swapped bool
	)
	// Before and after: a marker checkEpoch reads meanwhile is not kept.
	s.epochSwaps.Add(1)
	defer s.epochSwaps.Add(1)
	err = s.update(func(txn *wtxn) error {
		cur, swapped = nil, false
		got, err := readEpoch(txn)
		if err != nil {
			return err
		}
		id := ""
		if got != nil {
			id = got.ID
		}
		if id != old {
			cur = got
			return nil
		}
		if err := txn.SetEntry(bdg.NewEntry([]byte(epochKey), b).WithMeta(metaEpoch)); err != nil {
			return err
		}
		cur, swapped = &e, true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("badger: swap epoch: %w", err)
	}
	return cur, swapped, nil
}

// Epoch implements store.EpochStore. A data directory replaced (or
// removed) since the store was opened breaks the store, so that the Guard
// reopens it in the directory there now: an error until then, and the
// marker of that directory (none, if it is new) after.
func (g *Guard) Epoch(ctx context.Context) (e *store.Epoch, err error) {
	if g.dirReplaced() {
		return nil, fmt.Errorf("badger: the data directory %s was replaced", g.opts.Dir)
	}
	err = g.do(func(s *Store) error {
		e, err = s.Epoch(ctx)
		return err
	})
	return e, err
}

// ExpectEpoch makes every reservation check first that the marker's ID is
// id ("": stop checking) and that the data directory is still the one the
// store was opened in: a directory replaced by an empty one is
// store.ErrKeysLost at the next reservation, not only at the watcher's
// next check. The program calls it with the epoch the replica trusts.
func (g *Guard) ExpectEpoch(id string) { g.expect.Store(&id) }

func (g *Guard) expectedEpoch() string {
	if p := g.expect.Load(); p != nil {
		return *p
	}
	return ""
}

// noteDir records the data directory the store was opened in.
func (g *Guard) noteDir() {
	if fi, err := os.Stat(g.opts.Dir); err == nil {
		g.dir.Store(&fi)
	}
}

// dirReplaced reports whether the data directory is gone or another than
// the one the open store was opened in; then it breaks the store (once),
// so that it is reopened in the directory there now.
func (g *Guard) dirReplaced() bool {
	was := g.dir.Load()
	if was == nil {
		return false
	}
	fi, err := os.Stat(g.opts.Dir)
	if err == nil && os.SameFile(*was, fi) {
		return false
	}
	if g.dir.CompareAndSwap(was, nil) {
		g.replaced.Store(true)
		g.fail(fmt.Errorf("the data directory %s was removed or replaced while the store was open", g.opts.Dir))
	}
	return true
}

// checkedEpoch is a marker ID checkEpoch found, and the value of
// epochSwaps it was read under.
type checkedEpoch struct {
	id    string
	swaps uint64
}

// checkEpoch returns store.ErrKeysLost unless the marker's ID is id. It
// reads the marker (a read transaction and a JSON decoding) only when a
// swap began since it last found id: every reservation calls it.
func (s *Store) checkEpoch(ctx context.Context, id string) error {
	swaps := s.epochSwaps.Load()
	if c := s.epochChecked.Load(); c != nil && c.id == id && c.swaps == swaps {
		return ctx.Err()
	}
	m, err := s.Epoch(ctx)
	if err != nil {
		return err
	}
	if m == nil || m.ID != id {
		return fmt.Errorf("badger: %w: the epoch marker is not the one this replica trusts", store.ErrKeysLost)
	}
	s.epochChecked.Store(&checkedEpoch{id: id, swaps: swaps})
	return nil
}

// SwapEpoch implements store.EpochStore.
func (g *Guard) SwapEpoch(ctx context.Context, old string, e store.Epoch) (cur *store.Epoch, swapped bool, err error) {
	err = g.do(func(s *Store) error {
		cur, swapped, err = s.SwapEpoch(ctx, old, e)
		return err
	})
	return cur, swapped, err
}
