package badger

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

var _ store.Lister = (*Store)(nil)

// cursorTag begins every cursor of a Badger listing; the rest is the last
// key examined, base64url-encoded.
const cursorTag = "b1."

// List implements store.Lister. It iterates the keys under q.Prefix in key
// order from the one after the cursor's, in one read transaction, and
// examines at most q.Budget() keys: Badger's iterator skips expired
// records itself, the state filter reads the entry's UserMeta first and a
// value only where that cannot tell, and the key-hash filter reads no
// value. A commit not yet applied (commit.go) is listed as completed, as
// Get reports it.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Listed, string, error) {
	after, err := checkList(q)
	if err != nil {
		return nil, "", err
	}
	var (
		recs []store.Listed
		next string
	)
	err = s.view(func(txn *bdg.Txn) error {
		recs, next = nil, ""
		p := []byte(q.Prefix)
		it := txn.NewIterator(bdg.IteratorOptions{PrefetchValues: false, Prefix: p})
		defer it.Close()
		start := p
		if after != nil {
			start = after
		}
		budget := q.Budget()
		var last []byte
		examined := 0
		for it.Seek(start); it.ValidForPrefix(p); it.Next() {
			item := it.Item()
			if after != nil && bytes.Equal(item.Key(), after) {
				continue
			}
			if len(recs) == q.Limit || examined == budget {
				next = cursorTag + base64.RawURLEncoding.EncodeToString(last)
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			examined++
			last = item.KeyCopy(last[:0])
			l, ok, err := s.listed(item, q)
			if err != nil {
				return err
			}
			if ok {
				recs = append(recs, l)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("badger: list: %w", err)
	}
	return recs, next, nil
}

// listed returns the record of item as List shows it, and whether q
// selects it.
func (s *Store) listed(item *bdg.Item, q store.ListQuery) (store.Listed, bool, error) {
	key := string(item.Key())
	if len(key) > 0 && key[0] == 0 { // the epoch marker, the schedule index: no records
		return store.Listed{}, false, nil
	}
	if q.KeyHash != "" && store.KeyHash(key) != q.KeyHash {
		return store.Listed{}, false, nil
	}
	// The UserMeta mirrors the stored state; only an in-flight
	// record may read otherwise (in doubt, its lease lapsed).
	switch m := item.UserMeta(); {
	case q.State == store.StateCompleted && m != metaCompleted,
		q.State == store.StateInFlight && m != metaInFlight,
		q.State == store.StateInDoubt && m == metaCompleted:
		return store.Listed{}, false, nil
	}
	var rec record
	err := item.Value(func(v []byte) error {
		if err := rec.unmarshal(v); err != nil {
			return corrupt(err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, errCorrupt) {
			s.log.Error("record cannot be decoded; not listed", "key_hash", store.KeyHash(key), "err", err)
			return store.Listed{}, false, nil
		}
		return store.Listed{}, false, asFault(err) // Badger could not read the value
	}
	pub := s.public(&rec, item.ExpiresAt())
	if !q.Matches(key, pub.State) {
		return store.Listed{}, false, nil
	}
	l := store.Listed{Key: key, State: pub.State, CreatedAt: pub.CreatedAt, ExpiresAt: pub.ExpiresAt, LeaseExpiresAt: pub.LeaseExpiresAt}
	if pub.Response != nil {
		l.StoredStatus = pub.Response.Status
	}
	return l, true, nil
}

// checkList checks the limit and cursor of q, and returns the key the
// cursor carries (nil for the first page). The Guard calls it before its
// store does, since a bad query is no fault of the store.
func checkList(q store.ListQuery) ([]byte, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("badger: list: limit %d is not positive", q.Limit)
	}
	return decodeCursor(q.Cursor, q.Prefix)
}

// decodeCursor returns the key a cursor of a listing of prefix carries,
// nil for the empty cursor.
func decodeCursor(cursor, prefix string) ([]byte, error) {
	if cursor == "" {
		return nil, nil
	}
	rest, ok := strings.CutPrefix(cursor, cursorTag)
	if !ok {
		return nil, store.ErrBadCursor
	}
	k, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || !bytes.HasPrefix(k, []byte(prefix)) || len(k) == len(prefix) {
		return nil, store.ErrBadCursor
	}
	return k, nil
}
