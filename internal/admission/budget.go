package admission

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// Budget bounds the bytes buffered at once by all protected requests
// (server.max_buffered_bytes): without it, a few hundred concurrent large
// bodies held by a slow upstream take the sidecar's memory, and the pod
// with it. Request bodies are charged as their bytes arrive (TakeFor), each
// client within its share (server.max_buffered_bytes_per_client); copies of
// answers are charged to the whole budget only (Take). The zero value has
// no limit and no share; SetLimits sets them.
type Budget struct {
	limit     atomic.Int64 // <= 0: no limit
	perClient atomic.Int64 // <= 0: no per-client share
	used      atomic.Int64

	mu      sync.Mutex
	clients map[string]int64 // bytes held by each client's request bodies; no entry: none

	// refused, when set, counts a refusal by reason (RefusalBudget,
	// RefusalClient, RefusalAnswer): BufferMetrics.Watch sets it.
	refused func(reason string)
}

// The reasons a charge is refused, the reason label of
// idemproxy_buffer_refusals_total.
const (
	RefusalBudget = "budget" // a request body: the whole budget is in use
	RefusalClient = "client" // a request body: its client holds its share
	RefusalAnswer = "answer" // a copy of an answer: the whole budget is in use
)

// bufferRefusalReasons lists every refusal reason, in documentation order.
var bufferRefusalReasons = []string{RefusalBudget, RefusalClient, RefusalAnswer}

// SetLimits applies server.max_buffered_bytes (limit) and
// server.max_buffered_bytes_per_client (perClient), either <= 0: none. A
// reload applies them to charges from then on; bytes already held stay.
func (b *Budget) SetLimits(limit, perClient int64) {
	b.perClient.Store(perClient)
	b.limit.Store(limit)
}

// Limit returns server.max_buffered_bytes as applied (<= 0: no limit).
func (b *Budget) Limit() int64 { return b.limit.Load() }

// PerClient returns server.max_buffered_bytes_per_client as applied
// (<= 0: no share).
func (b *Budget) PerClient() int64 { return b.perClient.Load() }

// Used returns the bytes held now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Take reserves n bytes not tied to a client (a copy of an answer, a
// decoded copy of a body), or reports that they do not fit now, counting
// the refusal under reason.
func (b *Budget) Take(n int64, reason string) bool {
	if b.reserve(n) {
		return true
	}
	b.refuse(reason)
	return false
}

// Give returns n bytes taken before, by Take or TakeFor.
func (b *Budget) Give(n int64) { b.used.Add(-n) }

// reserve takes n bytes from the whole budget if they fit.
func (b *Budget) reserve(n int64) bool {
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

func (b *Budget) refuse(reason string) {
	if b.refused != nil {
		b.refused(reason)
	}
}

// TakeFor reserves n more bytes for a request body of client that already
// holds own bytes, from the whole budget and from the client's share. A
// client that holds nothing but this body may always grow it (up to the
// route's max_body_bytes, which the whole budget holds): the share bounds
// what one client adds on top of one body. It returns "" when the bytes
// were taken, else the reason they were not (RefusalClient,
// RefusalBudget). Give returns them to the whole budget, Release to the
// client's share.
func (b *Budget) TakeFor(client string, own, n int64) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.clients[client]
	if share := b.perClient.Load(); share > 0 && held > own && held+n > share {
		b.refuse(RefusalClient)
		return RefusalClient
	}
	if !b.reserve(n) {
		b.refuse(RefusalBudget)
		return RefusalBudget
	}
	if b.clients == nil {
		b.clients = make(map[string]int64)
	}
	b.clients[client] = held + n
	return ""
}

// Release returns n bytes of client's share taken by TakeFor; the entry
// goes with its last byte, so the map holds only clients with a body
// buffered now.
func (b *Budget) Release(client string, n int64) {
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
func (b *Budget) clientHeld(client string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clients[client]
}

// Saturated reports whether less than reserve bytes are free: a body of
// that size may be refused now.
func (b *Budget) Saturated(reserve int64) bool {
	limit := b.limit.Load()
	return limit > 0 && b.used.Load() > limit-reserve
}

// ClientOf returns the client a request comes from (remoteAddr, as
// http.Request.RemoteAddr or net.Conn.RemoteAddr().String() give it), the
// key of its buffer share: its IP address, or for IPv6 its /64, the block
// one host is commonly given (one host could otherwise take a share per
// address). HTTP/2 streams of one connection share its remote address, so
// its client. The listener's per-client limits (requests in flight,
// resets) and the admin API's authentication limiter count the same
// clients.
func ClientOf(remoteAddr string) string {
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

// BodyChunk returns the size of the next chunk a request body takes from
// the budget once the chunks it holds (held bytes) are full: bodyFirstStep
// for the first, then as much as it holds, up to bodyMaxStep. The caller
// caps it at what the body may still bring (its Content-Length or
// max_body_bytes).
func BodyChunk(held int64) int64 { return max(bodyFirstStep, min(held, bodyMaxStep)) }
