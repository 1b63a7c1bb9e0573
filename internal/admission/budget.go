package proxy

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// budget bounds the bytes buffered at once by all protected requests
// (server.max_buffered_bytes): without it, a few hundred concurrent large
// bodies held by a slow upstream take the sidecar's memory, and the pod
// with it. Request bodies are charged as their bytes arrive (takeFor), each
// client within its share (server.max_buffered_bytes_per_client); copies of
// answers are charged to the whole budget only (take).
type budget struct {
	limit     atomic.Int64 // <= 0: no limit
	perClient atomic.Int64 // <= 0: no per-client share
	used      atomic.Int64

	mu      sync.Mutex
	clients map[string]int64 // bytes held by each client's request bodies; no entry: none

	// refused, when set, counts a refusal by reason (refusalBudget,
	// refusalClient, refusalAnswer).
	refused func(reason string)
}

// The reasons a charge is refused, the reason label of
// idemproxy_buffer_refusals_total.
const (
	refusalBudget = "budget" // a request body: the whole budget is in use
	refusalClient = "client" // a request body: its client holds its share
	refusalAnswer = "answer" // a copy of an answer: the whole budget is in use
)

// bufferRefusalReasons lists every refusal reason, in documentation order.
var bufferRefusalReasons = []string{refusalBudget, refusalClient, refusalAnswer}

// take reserves n bytes not tied to a client (a copy of an answer, a
// decoded copy of a body), or reports that they do not fit now, counting
// the refusal under reason.
func (b *budget) take(n int64, reason string) bool {
	if b.reserve(n) {
		return true
	}
	b.refuse(reason)
	return false
}

// give returns n bytes taken before, by take or takeFor.
func (b *budget) give(n int64) { b.used.Add(-n) }

// reserve takes n bytes from the whole budget if they fit.
func (b *budget) reserve(n int64) bool {
	for {
		used, limit := b.used.Load(), b.limit.Load()
		if limit > 0 && used+n > limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

func (b *budget) refuse(reason string) {
	if b.refused != nil {
		b.refused(reason)
	}
}

// takeFor reserves n more bytes for a request body of client that already
// holds own bytes, from the whole budget and from the client's share. A
// client that holds nothing but this body may always grow it (up to the
// route's max_body_bytes, which the whole budget holds): the share bounds
// what one client adds on top of one body. It returns "" when the bytes
// were taken, else the reason they were not. give returns them to the
// whole budget, release to the client's share.
func (b *budget) takeFor(client string, own, n int64) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.clients[client]
	if share := b.perClient.Load(); share > 0 && held > own && held+n > share {
		b.refuse(refusalClient)
		return refusalClient
	}
	if !b.reserve(n) {
		b.refuse(refusalBudget)
		return refusalBudget
	}
	if b.clients == nil {
		b.clients = make(map[string]int64)
	}
	b.clients[client] = held + n
	return ""
}

// release returns n bytes of client's share taken by takeFor; the entry
// goes with its last byte, so the map holds only clients with a body
// buffered now.
func (b *budget) release(client string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if left := b.clients[client] - n; left > 0 {
		b.clients[client] = left
	} else {
		delete(b.clients, client)
	}
}

// clientHeld returns the bytes client's request bodies hold now.
func (b *budget) clientHeld(client string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clients[client]
}

// saturated reports whether less than reserve bytes are free: a body of
// that size may be refused now.
func (b *budget) saturated(reserve int64) bool {
	limit := b.limit.Load()
	return limit > 0 && b.used.Load() > limit-reserve
}

// clientOf returns the client a request comes from, the key of its share:
// its IP address, or for IPv6 its /64, the block one host is commonly
// given (one host could otherwise take a share per address). HTTP/2
// streams of one connection share its remote address, so its client.
func clientOf(remoteAddr string) string {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return remoteAddr // not an IP address (a test's or a Unix socket's): one client
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// ClientOf returns the client remoteAddr belongs to, as the buffer share
// counts clients: one IPv4 address, one IPv6 /64. The listener's
// per-client limits (requests in flight, resets) count the same clients.
func ClientOf(remoteAddr string) string { return clientOf(remoteAddr) }

// bodyFirstStep is the first chunk a request body is read into, taken
// from the budget before its bytes arrive: a stalled body holds no more
// than this (or its Content-Length if smaller). Each further chunk is as
// large as the chunks before it together, up to bodyMaxStep: a body holds
// what arrived plus at most one chunk, and a large body is read in few
// chunks.
const (
	bodyFirstStep = 4 << 10
	bodyMaxStep   = 64 << 10
)
