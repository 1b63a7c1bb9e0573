// Package canary proves, every interval, that the store still holds what
// this replica wrote to it: each replica writes a small canary record with
// a sequence number and a TTL, and reads back one it wrote earlier (the
// last one, and by turns the oldest it still judges). A canary missing
// before its TTL means the store lost writes: an eviction, a failover to
// a replica that had not received them, a restore of an older backup. The
// replica then marks the store lost (epoch.Watcher.MarkLost), for every
// replica, until an operator accepts the loss. A read or write that fails
// is not a loss: the store is unreachable, and the store's errors answer.
//
// The canaries, and the release marks (MarkReleased) that tell a witness
// (internal/witness) that a key was released on purpose, live under
// Prefix: no route's name or keyspace can begin with '~' (config's name
// rule), so no route's key, listing or reconciliation ever reaches them,
// and they are never counted as keys. A canary is a reservation whose
// lease is its TTL: it is never in doubt, never reconciled, and the store
// forgets it by itself.
//
// On a Redis Cluster, where each master can lose writes on its own, there
// is one canary for each master (Options.Tags: hash tags whose slots each
// master serves).
package canary

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// Prefix is the reserved key space of canaries and release marks.
const Prefix = "~idemproxy/"

// MinTTL is a canary's shortest TTL: well above the interval, so that a
// canary is judged for minutes (a restore of a backup taken within them is
// seen by the oldest canaries).
const MinTTL = 5 * time.Minute

// TTL is the TTL of a canary written every interval.
func TTL(interval time.Duration) time.Duration { return max(MinTTL, 20*interval) }

// Options configures New.
type Options struct {
	// Store is the store the canaries are written to (not gated by the
	// epoch: canaries are written whether or not reservations are).
	// Required.
	Store store.Store
	// Interval is the time between two canaries. Required (positive).
	Interval time.Duration
	// Tags returns the hash tags that put one canary in each part of the
	// store that can lose writes on its own (a Redis Cluster's masters),
	// as "{tag}"; nil, or none returned: one canary, without a tag. It is
	// asked at start and then every minute.
	Tags func(ctx context.Context) ([]string, error)
	// Epoch returns the ID of the epoch marker the replica trusts ("":
	// none). Canaries are written and judged only while one is trusted,
	// and only against canaries written under the same one: after an
	// operator accepted a loss, the canaries the loss took are not seen
	// missing again. Required.
	Epoch func() string
	// Lost marks the store lost, with reason saying what was seen (the
	// epoch watcher's MarkLost). Required.
	Lost func(reason string) bool
	// Paused, when set, reports that the store refuses writes on its own
	// (Badger below its free-space floor, which answers every
	// reservation 503 and counts it as refused): a round writes and reads
	// nothing then. Nil: never.
	Paused func() bool
	// Logger receives debug lines of failed reads and writes; nil
	// discards them.
	Logger *slog.Logger
}

// written is a canary this replica wrote.
type written struct {
	seq   uint64
	at    stamp
	epoch string
}

// stamp is an instant on both of this host's clocks: the monotonic one
// (in at) and the wall clock (Unix nanoseconds).
type stamp struct {
	at   time.Time
	wall int64
}

// since is the time from t to s: the longer of the two clocks' readings.
// The store expires a canary by its own clock, which goes on while this
// host is suspended (a laptop asleep, a VM paused), when the monotonic
// clock stops; the monotonic clock goes on where the wall clock is
// stepped back. Taking the longer only ever gives a canary up sooner.
func (s stamp) since(t stamp) time.Duration {
	return max(s.at.Sub(t.at), time.Duration(s.wall-t.wall))
}

// place is one tag's canaries, oldest first.
type place struct {
	tag  string
	live []written
}

// Canaries writes and judges one replica's canaries.
type Canaries struct {
	opts    Options
	log     *slog.Logger
	replica string
	ttl     time.Duration
	kick    chan struct{}
	wall    func() int64 // the wall clock, Unix nanoseconds (a test steps it)

	mu     sync.Mutex // one round at a time
	seq    uint64
	places []*place
	tagsAt time.Time

	writes, writeErrors           atomic.Uint64
	checksOK, missing, readErrors atomic.Uint64
	placesN                       atomic.Int64
}

// New returns the canaries of a replica; Run writes them.
func New(opts Options) *Canaries {
	c := &Canaries{opts: opts, log: opts.Logger, replica: rand.Text()[:16], ttl: TTL(opts.Interval), kick: make(chan struct{}, 1),
		wall: func() int64 { return time.Now().UnixNano() }}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c
}

// CheckNow asks Run to read back the canaries at once (a witness saw a key
// lost). It does not wait.
func (c *Canaries) CheckNow() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run writes a canary and reads one back every Interval, and reads them
// back when asked (CheckNow), until ctx ends.
func (c *Canaries) Run(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Round(ctx, false)
		case <-c.kick:
			c.Round(ctx, true)
		}
	}
}

// Round writes one canary in each place and reads one back (all: the last
// and the oldest), and marks the store lost when one is missing. It
// reports whether it did.
func (c *Canaries) Round(ctx context.Context, all bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, max(c.opts.Interval, 5*time.Second))
	defer cancel()
	if c.opts.Paused != nil && c.opts.Paused() {
		return false
	}
	epoch := c.opts.Epoch()
	if epoch == "" {
		// Nothing is reserved: nothing to vouch for. Canaries written
		// before are judged against the epoch they were written in.
		return false
	}
	c.refreshTags(ctx)
	now := stamp{at: time.Now(), wall: c.wall()}
	c.seq++
	for _, p := range c.places {
		// The oldest first (the TTL's half: well inside it, whatever
		// the clocks), then the ones of another epoch.
		for len(p.live) > 0 && (now.since(p.live[0].at) > c.ttl/2 || p.live[0].epoch != epoch) {
			p.live = p.live[1:]
		}
		var check []written
		if n := len(p.live); n > 0 {
			check = append(check, p.live[n-1])
			if (all || c.seq%2 == 0) && n > 1 {
				check = append(check, p.live[0])
			}
		}
		if !all {
			c.write(ctx, p, epoch, now)
		}
		for _, w := range check {
			if c.read(ctx, p, w, now) {
				return true
			}
		}
	}
	return false
}

// write writes the canary c.seq in p.
func (c *Canaries) write(ctx context.Context, p *place, epoch string, now stamp) {
	res := store.Reservation{Token: rand.Text(), Fingerprint: "canary " + strconv.FormatUint(c.seq, 10), Lease: c.ttl, TTL: c.ttl}
	if _, err := c.opts.Store.Reserve(ctx, c.key(p, c.seq), res); err != nil {
		c.writeErrors.Add(1)
		c.log.Debug("canary not written", "err", err)
		return
	}
	c.writes.Add(1)
	p.live = append(p.live, written{seq: c.seq, at: now, epoch: epoch})
}

// read reads back the canary w of p, and marks the store lost if it is
// missing (or is another one).
func (c *Canaries) read(ctx context.Context, p *place, w written, now stamp) bool {
	rec, err := c.opts.Store.Get(ctx, c.key(p, w.seq))
	if err != nil {
		c.readErrors.Add(1)
		c.log.Debug("canary not read", "err", err)
		return false
	}
	want := "canary " + strconv.FormatUint(w.seq, 10)
	if rec != nil && rec.Fingerprint == want {
		c.checksOK.Add(1)
		return false
	}
	if c.opts.Epoch() != w.epoch {
		return false // an operator accepted a loss meanwhile
	}
	c.missing.Add(1)
	where := ""
	if p.tag != "" {
		where = " on the part of the store that holds " + p.tag
	}
	reason := fmt.Sprintf("canary %d of this replica, written %s ago with a TTL of %s, is missing%s: "+
		"the store lost writes (evicted, a failover to a replica that missed them, or a restore of an older backup)",
		w.seq, now.since(w.at).Round(time.Millisecond), c.ttl, where)
	p.live = nil
	return c.opts.Lost(reason)
}

// key is the store key of canary seq in p.
func (c *Canaries) key(p *place, seq uint64) string {
	tag := ""
	if p.tag != "" {
		tag = p.tag + "/"
	}
	return Prefix + "canary/" + tag + c.replica + "/" + strconv.FormatUint(seq, 10)
}

// refreshTags asks Options.Tags for the places, at start and every minute,
// keeping the canaries of places that stay.
func (c *Canaries) refreshTags(ctx context.Context) {
	if c.places != nil && (c.opts.Tags == nil || time.Since(c.tagsAt) < time.Minute) {
		return
	}
	tags := []string{""}
	if c.opts.Tags != nil {
		got, err := c.opts.Tags(ctx)
		switch {
		case err != nil && c.places != nil:
			return // the places as they were
		case err != nil:
			c.log.Debug("canary places not read", "err", err)
			// One canary meanwhile, without a tag.
		case len(got) > 0:
			tags = got
		}
		if err == nil {
			c.tagsAt = time.Now()
		}
	}
	old := map[string]*place{}
	for _, p := range c.places {
		old[p.tag] = p
	}
	places := make([]*place, 0, len(tags))
	for _, t := range tags {
		if p := old[t]; p != nil {
			places = append(places, p)
		} else {
			places = append(places, &place{tag: t})
		}
	}
	c.places = places
	c.placesN.Store(int64(len(places)))
}

// Stats are the canaries' counters.
type Stats struct {
	// Places is the number of canaries written each interval.
	Places int
	// Writes and WriteErrors count the canaries written and the writes
	// that failed.
	Writes, WriteErrors uint64
	// OK, Missing and ReadErrors count the canaries read back: found,
	// missing (a loss), and reads that failed.
	OK, Missing, ReadErrors uint64
}

// Stats returns the counters.
func (c *Canaries) Stats() Stats {
	return Stats{Places: int(c.placesN.Load()), Writes: c.writes.Load(), WriteErrors: c.writeErrors.Load(),
		OK: c.checksOK.Load(), Missing: c.missing.Load(), ReadErrors: c.readErrors.Load()}
}

// releaseKey is the store key of storeKey's release mark.
func releaseKey(storeKey string) string {
	sum := sha256.Sum256([]byte(storeKey))
	return Prefix + "released/" + hex.EncodeToString(sum[:16])
}

// MarkReleased writes the release mark of storeKey, kept for ttl (at least
// every replica's witness window): a replica that answered the key and
// sees it free again reads the mark and knows it was released on purpose.
// An older mark of the key is replaced, so that the mark lasts ttl from
// now.
func MarkReleased(ctx context.Context, st store.Store, storeKey string, ttl time.Duration) error {
	key := releaseKey(storeKey)
	res := store.Reservation{Token: rand.Text(), Fingerprint: "released", Lease: ttl, TTL: ttl}
	for range 4 {
		rec, err := st.Reserve(ctx, key, res)
		if err != nil {
			return fmt.Errorf("release mark: %w", err)
		}
		if rec == nil || rec.Token == res.Token {
			return nil
		}
		if err := st.Release(ctx, key, rec.Token); err != nil && !errors.Is(err, store.ErrNotOwner) {
			return fmt.Errorf("release mark: %w", err)
		}
	}
	return errors.New("release mark: the mark kept changing; try again")
}

// Released reports whether storeKey has a release mark.
func Released(ctx context.Context, st store.Store, storeKey string) (bool, error) {
	rec, err := st.Get(ctx, releaseKey(storeKey))
	if err != nil {
		return false, fmt.Errorf("release mark: %w", err)
	}
	return rec != nil, nil
}
