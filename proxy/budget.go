package proxy

import (
	"errors"
	"io"
	"sync/atomic"
)

// budget bounds the request bytes buffered at once by all protected
// requests (server.max_buffered_bytes): without it, a few hundred
// concurrent large bodies held by a slow upstream take the sidecar's
// memory, and the pod with it.
type budget struct {
	limit atomic.Int64 // <= 0: no limit
	used  atomic.Int64
}

// take reserves n bytes, or reports that they do not fit now.
func (b *budget) take(n int64) bool {
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

// give returns n bytes taken before.
func (b *budget) give(n int64) { b.used.Add(-n) }

// errOverBudget is the read error of a body that does not fit the budget.
var errOverBudget = errors.New("the proxy buffers too many request bytes at once")

// budgetStep is how much a body of unknown length takes from the budget at
// a time.
const budgetStep = 64 << 10

// budgetReader takes budget for a body of unknown length as it arrives.
type budgetReader struct {
	r    io.Reader // at most max bytes (http.MaxBytesReader)
	b    *budget
	held *int64 // the attempt's share of the budget
	max  int64  // the route's max_body_bytes: no step takes more
	read int64
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	br.read += int64(n)
	if need := br.read - *br.held; need > 0 {
		// A step never goes past the route's limit: max_buffered_bytes
		// only has to hold that (validation), and a step beyond it would
		// refuse a small body with nothing else buffered.
		step := max(need, min(budgetStep, br.max-*br.held))
		if !br.b.take(step) {
			return n, errOverBudget
		}
		*br.held += step
	}
	return n, err
}
