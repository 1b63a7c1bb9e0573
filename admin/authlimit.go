package admin

import (
	"sync"
	"time"
)

// The limits on failed authentications. A client (an IPv4 address, an
// IPv6 /64) that fails authMaxFailures times within authWindow is
// refused (429 with Retry-After) for authPenalty after its last failure:
// every request of it that needs the token, a correct token included,
// since an answer that told a correct token apart during the penalty would
// let guessing go on at full speed. At most authMaxClients clients are
// tracked; failures of further clients share one allowance, so a flood
// from many addresses cannot grow the limiter's memory.
const (
	authMaxFailures = 5
	authWindow      = time.Minute
	authPenalty     = time.Minute
	authMaxClients  = 4096
)

// authLimiter counts failed authentications per client.
type authLimiter struct {
	mu       sync.Mutex
	clients  map[string]*authEntry
	overflow authEntry // the allowance of clients beyond authMaxClients
}

// authEntry is one client's failures: count within the window that
// started at start, and the end of its penalty (zero: none).
type authEntry struct {
	failures int
	start    time.Time
	until    time.Time
}

func newAuthLimiter() *authLimiter {
	return &authLimiter{clients: map[string]*authEntry{}}
}

// entry returns the entry of client, adding one when add (nil when not
// add and there is none). l.mu is held.
func (l *authLimiter) entry(client string, now time.Time, add bool) *authEntry {
	if e := l.clients[client]; e != nil {
		return e
	}
	if len(l.clients) >= authMaxClients {
		for k, e := range l.clients {
			if e.expired(now) {
				delete(l.clients, k)
			}
		}
	}
	if len(l.clients) >= authMaxClients {
		return &l.overflow
	}
	if !add {
		return nil
	}
	e := &authEntry{}
	l.clients[client] = e
	return e
}

// expired reports whether e's window and penalty are over.
func (e *authEntry) expired(now time.Time) bool {
	return now.Sub(e.start) >= authWindow && !now.Before(e.until)
}

// wait returns how long client is refused from now on; 0: it may try.
func (l *authLimiter) wait(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(client, now, false)
	if e == nil || !now.Before(e.until) {
		return 0
	}
	return e.until.Sub(now)
}

// fail counts a failed authentication of client and reports whether it
// started a penalty.
func (l *authLimiter) fail(client string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(client, now, true)
	if now.Sub(e.start) >= authWindow {
		e.failures, e.start = 0, now
	}
	e.failures++
	if e.failures >= authMaxFailures {
		e.until = now.Add(authPenalty)
		e.failures, e.start = 0, now
		return true
	}
	return false
}

// succeed forgets the failures of client.
func (l *authLimiter) succeed(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.clients, client)
}
