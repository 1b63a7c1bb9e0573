// Package witness remembers, in memory of a fixed size, the store keys one
// replica answered (committed) in the last few minutes, the window in which
// clients retry. A reservation that succeeds on one of them means the
// store no longer had the answer: unless someone released the key on
// purpose (an operator, on any replica: a release mark in the store says
// so), the store lost it, and the proxy refuses the request rather than
// charge it a second time.
//
// The table holds 16 bytes a key: a 64-bit hash of the store key (seeded
// per process, so that nobody can aim two keys at one hash) and the time
// until which the answer must be in the store (the commit's time plus the
// window, or plus the route's TTL when that is shorter), on the witness'
// own clock: the later of the monotonic and the wall clock since it was
// made, so that no step of this host's clock makes a key expired by its
// TTL look answered within the window (a false alarm takes every
// protected route down): NTP stepping the wall clock back leaves the
// monotonic one going, and a suspended host (a VM paused or migrated),
// whose monotonic clock stops, finds the wall clock gone on. It is
// set-associative: a key has 8 places in one set; a set that is full
// gives the place of the entry that ends first to the new one, so that a
// table too small for the traffic forgets keys early (a retry of them is
// not witnessed), never wrongly. Neither Answered nor Seen allocates.
package witness

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// BytesPerKey is the memory the table takes for each key it can hold.
const BytesPerKey = 16

// ways is the number of places a key may take in its set.
const ways = 8

// margin is taken off a route's TTL shorter than the window: the store
// may count the TTL from a little before the commit returned (and its
// clock may run a little ahead), and a key it expired is not a loss.
const margin = 2 * time.Second

// Options configures New.
type Options struct {
	// Window is how long a key is remembered after its answer was
	// committed. Required (positive).
	Window time.Duration
	// MaxKeys bounds the keys remembered at once; it is rounded up to a
	// power of two, at least 8.
	MaxKeys int
	// Released reports whether the store key was released on purpose
	// since it was answered (an operator's release mark). Nil: never.
	Released func(ctx context.Context, storeKey string) (bool, error)
	// Lost is told that the store lost a key this replica answered; reason
	// says what was seen. Nil: nobody is told.
	Lost func(reason string)
	// Epoch returns the ID of the epoch marker the replica trusts ("":
	// none). The answers remembered belong to one epoch: when it changes
	// (an operator accepted a loss, after which a retry of a key answered
	// before is forwarded again on purpose), they are all forgotten,
	// before a hit is judged and whenever Sync is called. Nil: one epoch
	// for ever.
	Epoch func() string
}

type entry struct {
	h     uint64 // the key's hash with its low bit set; 0: empty
	until int64  // on the witness' clock (Witness.clock)
}

type shard struct {
	mu sync.Mutex
	_  [56]byte // a cache line of its own
}

// Witness is the table. Its methods are safe for concurrent use.
type Witness struct {
	opts    Options
	seed    maphash.Seed
	entries []entry
	sets    uint64 // a power of two
	shards  []shard

	// base is when the witness was made (with its monotonic reading),
	// baseWall the same on the wall clock, and wall reads the wall clock
	// (a test steps it).
	base     time.Time
	baseWall int64
	wall     func() int64

	epoch atomic.Pointer[string] // the epoch of the answers remembered

	forgotten atomic.Uint64 // live entries given up for a newer key
	lost      atomic.Uint64
	released  atomic.Uint64
	unknown   atomic.Uint64
}

// New returns an empty Witness.
func New(opts Options) *Witness {
	n := uint64(max(opts.MaxKeys, ways))
	n = 1 << bits.Len64(n-1)
	sets := n / ways
	nshards := min(sets, 256)
	base := time.Now()
	return &Witness{opts: opts, seed: maphash.MakeSeed(), entries: make([]entry, n), sets: sets, shards: make([]shard, nshards),
		base: base, baseWall: base.UnixNano(), wall: func() int64 { return time.Now().UnixNano() }}
}

// clock is the witness' time of an instant read as mono (monotonic, since
// base) and wall (Unix nanoseconds): the later of the two readings since
// base. Each clock moves on where the other one steps back or stops, and a
// step forward only makes keys forgotten early (a retry of them is not
// witnessed), never wrongly remembered.
func (w *Witness) clock(mono time.Duration, wall int64) int64 {
	return max(int64(mono), wall-w.baseWall)
}

// now is the witness' time now.
func (w *Witness) now() int64 { return w.clock(time.Since(w.base), w.wall()) }

// Window is Options.Window.
func (w *Witness) Window() time.Duration { return w.opts.Window }

// Capacity is the number of keys the table holds.
func (w *Witness) Capacity() int { return len(w.entries) }

// place returns the key's hash, its set and that set's lock.
func (w *Witness) place(storeKey string) (uint64, []entry, *sync.Mutex) {
	h := maphash.String(w.seed, storeKey) | 1
	set := (h >> 1) & (w.sets - 1)
	return h, w.entries[set*ways : set*ways+ways], &w.shards[set&uint64(len(w.shards)-1)].mu
}

// Answered remembers that the answer to storeKey was committed at (the
// time the commit was sent), kept by the store for ttl.
func (w *Witness) Answered(storeKey string, ttl time.Duration, at time.Time) {
	keep := w.opts.Window
	if ttl < keep {
		keep = ttl - margin
	}
	until := w.clock(at.Sub(w.base), at.UnixNano()) + int64(keep)
	now := w.now()
	if until <= now {
		return
	}
	h, set, mu := w.place(storeKey)
	mu.Lock()
	defer mu.Unlock()
	victim := 0
	for i := range set {
		e := &set[i]
		if e.h == h {
			e.until = max(e.until, until)
			return
		}
		if e.until <= now {
			*e = entry{h: h, until: until}
			return
		}
		if e.until < set[victim].until {
			victim = i
		}
	}
	set[victim] = entry{h: h, until: until}
	w.forgotten.Add(1)
}

// Seen reports whether this replica answered storeKey within its window:
// the cheap look of the normal path (no allocation), before Judge.
func (w *Witness) Seen(storeKey string) bool { return w.seen(storeKey, w.now()) }

// seen reports whether storeKey was answered within its window.
func (w *Witness) seen(storeKey string, now int64) bool {
	h, set, mu := w.place(storeKey)
	mu.Lock()
	defer mu.Unlock()
	for i := range set {
		if set[i].h == h && set[i].until > now {
			return true
		}
	}
	return false
}

// forget removes storeKey.
func (w *Witness) forget(storeKey string) {
	h, set, mu := w.place(storeKey)
	mu.Lock()
	defer mu.Unlock()
	for i := range set {
		if set[i].h == h {
			set[i] = entry{}
		}
	}
}

// Sync forgets every answer remembered when epoch is not the epoch they
// were remembered in, and reports whether it did. The first call only
// records epoch. No epoch trusted ("": the store just marked lost, or a
// new marker not yet trusted) forgets nothing: the answers are judged
// until an epoch is trusted again, then forgotten if it is another one
// (an acceptance makes a new one). Forgotten at the loss, a retry whose
// reservation succeeded just before another detector marked the store
// lost would be found Fresh and forwarded: charged a second time.
func (w *Witness) Sync(epoch string) bool {
	if epoch == "" {
		return false
	}
	old := w.epoch.Load()
	if old != nil && *old == epoch {
		return false
	}
	if !w.epoch.CompareAndSwap(old, &epoch) {
		return false // another caller synced meanwhile
	}
	if old == nil {
		return false
	}
	for set := range w.sets {
		mu := &w.shards[set&uint64(len(w.shards)-1)].mu
		mu.Lock()
		clear(w.entries[set*ways : set*ways+ways])
		mu.Unlock()
	}
	return true
}

// Verdict is what Judge found.
type Verdict int

// The verdicts of Judge.
const (
	// Fresh: the key was not answered here within the window.
	Fresh Verdict = iota
	// Released: it was, and then released on purpose; it is forgotten.
	Released
	// Lost: it was, and nobody released it: the store lost it. Lost was
	// told.
	Lost
	// Unknown: it was, and whether it was released could not be read.
	Unknown
)

// Judge is asked about a key whose reservation just succeeded: Fresh (the
// normal case, one look at the table) unless this replica answered it
// within the window. Then it asks Released, and on no release tells Lost,
// with reason. err is Released's error (Unknown).
func (w *Witness) Judge(ctx context.Context, storeKey, reason string) (Verdict, error) {
	if !w.seen(storeKey, w.now()) {
		return Fresh, nil
	}
	if w.opts.Epoch != nil && w.Sync(w.opts.Epoch()) {
		return Fresh, nil // answered in an epoch the replica no longer trusts
	}
	if w.opts.Released != nil {
		rel, err := w.opts.Released(ctx, storeKey)
		if err != nil {
			w.unknown.Add(1)
			return Unknown, err
		}
		if rel {
			w.forget(storeKey)
			w.released.Add(1)
			return Released, nil
		}
	}
	w.lost.Add(1)
	if w.opts.Lost != nil {
		w.opts.Lost(reason)
	}
	return Lost, nil
}

// Stats are the witness' counters.
type Stats struct {
	// Lost counts reservations that succeeded on a key answered within
	// the window and released by nobody; Released, those released on
	// purpose.
	Lost, Released uint64
	// Unknown counts those whose release marks could not be read.
	Unknown uint64
	// Forgotten counts keys given up before their window ended, for a
	// newer key in a full set: the table is too small for the traffic.
	Forgotten uint64
}

// Stats returns the counters.
func (w *Witness) Stats() Stats {
	return Stats{Lost: w.lost.Load(), Released: w.released.Load(), Unknown: w.unknown.Load(), Forgotten: w.forgotten.Load()}
}
