package admin

import (
	"container/list"
	"sync"
	"time"
)

// The limits on failed authentications. A client (an IPv4 address, an
// IPv6 /64) that fails authMaxFailures times within authWindow is
// refused (429 with Retry-After) for authPenalty after its last failure:
// every request of it that needs the token, a correct token included,
// since an answer that told a correct token apart during the penalty would
// let guessing go on at full speed.
//
// At most authMaxClients clients are tracked, so a flood from many
// addresses cannot grow the limiter's memory. When the table is full, a
// newly failing client takes the entry of a client whose penalty is over,
// else of the client that failed least recently among those not under a
// penalty: the cost of a flood falls on the flood's own addresses, whose
// failures are forgotten, never on an address that has not failed. A
// client under a penalty keeps its entry until the penalty ends. When
// every entry is under a penalty, a further client's failures are not
// tracked: it is answered 401, never 429, until an entry frees up. The
// trade-off: an attacker holding more networks than authMaxClients, each
// failing authMaxFailures times a minute, or rotating over more networks
// than the table holds, guesses at the rate the admin listener serves
// (bounded by its connection cap; every failure is counted and logged);
// the alternative, one penalty shared by every untracked client, let such
// an attacker refuse the operator's correct token from any address it had
// never seen. The token's length, not this limit, is what makes guessing
// hopeless.
const (
	authMaxFailures = 5
	authWindow      = time.Minute
	authPenalty     = time.Minute
	authMaxClients  = 4096
)

// authLimiter counts failed authentications per client, in a table of at
// most authMaxClients entries. Each entry is on one of two lists: free
// (not under a penalty, least recently failing first) or penalized
// (under a penalty or just out of one, earliest penalty first).
type authLimiter struct {
	mu        sync.Mutex
	clients   map[string]*authEntry
	free      list.List // of *authEntry, least recently failing first
	penalized list.List // of *authEntry, earliest penalty first
}

// authEntry is one client's failures: count within the window that
// started at start, and the end of its penalty (zero: none). elem is its
// element in the free or penalized list (penalized says which).
type authEntry struct {
	client    string
	failures  int
	start     time.Time
	until     time.Time
	penalized bool
	elem      *list.Element
}

func newAuthLimiter() *authLimiter {
	return &authLimiter{clients: map[string]*authEntry{}}
}

// add returns a new entry for client, taking the place of another when
// the table is full, or nil when every entry is under a penalty at now.
// l.mu is held.
func (l *authLimiter) add(client string, now time.Time) *authEntry {
	if len(l.clients) >= authMaxClients {
		var victim *list.Element
		if f := l.penalized.Front(); f != nil && !now.Before(f.Value.(*authEntry).until) {
			victim = f // its penalty is over: it holds nothing worth keeping
		} else if f := l.free.Front(); f != nil {
			victim = f // the least recently failing client not under a penalty
		}
		if victim == nil {
			return nil
		}
		l.remove(victim.Value.(*authEntry))
	}
	e := &authEntry{client: client}
	e.elem = l.free.PushBack(e)
	l.clients[client] = e
	return e
}

// remove drops e from the table. l.mu is held.
func (l *authLimiter) remove(e *authEntry) {
	if e.penalized {
		l.penalized.Remove(e.elem)
	} else {
		l.free.Remove(e.elem)
	}
	delete(l.clients, e.client)
}

// wait returns how long client is refused from now on; 0: it may try.
// A client without an entry is never refused: no failure of another
// client counts against it.
func (l *authLimiter) wait(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.clients[client]
	if e == nil || !now.Before(e.until) {
		return 0
	}
	return e.until.Sub(now)
}

// fail counts a failed authentication of client and reports whether it
// started a penalty. A client that can get no entry (every entry is under
// a penalty) is not counted.
func (l *authLimiter) fail(client string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.clients[client]
	if e == nil {
		if e = l.add(client, now); e == nil {
			return false
		}
	}
	if e.penalized && !now.Before(e.until) {
		// The penalty is over: back among the clients that may be evicted.
		l.penalized.Remove(e.elem)
		e.penalized, e.elem = false, l.free.PushBack(e)
	}
	if now.Sub(e.start) >= authWindow {
		e.failures, e.start = 0, now
	}
	e.failures++
	if e.failures >= authMaxFailures {
		e.until = now.Add(authPenalty)
		e.failures, e.start = 0, now
		if e.penalized {
			l.penalized.MoveToBack(e.elem)
		} else {
			l.free.Remove(e.elem)
			e.penalized, e.elem = true, l.penalized.PushBack(e)
		}
		return true
	}
	if !e.penalized {
		l.free.MoveToBack(e.elem)
	}
	return false
}

// succeed forgets the failures of client.
func (l *authLimiter) succeed(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.clients[client]; e != nil {
		l.remove(e)
	}
}
