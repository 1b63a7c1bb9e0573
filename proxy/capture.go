package proxy

import (
	"bytes"
	"io"
	"net/http"
)

// capture passes the upstream's body through to the client and keeps a
// copy up to limit bytes. When the body ends, the answer is committed; if
// the client went away first, the rest is still read so the answer can be
// stored; if the upstream's body breaks off, the key is in doubt.
type capture struct {
	rc    io.ReadCloser
	a     *attempt
	resp  *http.Response
	limit int64
	held  int64 // budget taken for buf; a.held counts it too, and the attempt gives it back
	buf   bytes.Buffer
	over  bool
	eof   bool
	err   error
	done  bool
}

func (c *capture) keep(p []byte) (int, error) {
	if c.over {
		return len(p), nil
	}
	n := int64(c.buf.Len() + len(p))
	if n > c.limit {
		c.drop()
		return len(p), nil
	}
	// The copy counts in server.max_buffered_bytes like the request
	// bodies: a burst of large answers must not take the sidecar's memory.
	// It is held until the request ends (the attempt gives it back).
	if need := n - c.held; need > 0 {
		// In steps of a page: small answers (most) take little; a large
		// one does not touch the shared counter for every read.
		step := min((need+captureStep-1)/captureStep*captureStep, c.limit-c.held)
		if !c.a.p.budget.take(step) {
			c.a.p.log.Warn("answer not stored: too many bytes buffered at once; duplicates get 409 response-not-replayable",
				"route", c.a.routeName())
			c.drop()
			return len(p), nil
		}
		c.held += step
		c.a.held += step
	}
	c.buf.Write(p)
	return len(p), nil
}

// captureStep is how much of the budget a captured answer takes at a time.
const captureStep = 4 << 10

// drop stops keeping the answer: it is committed as not stored.
func (c *capture) drop() {
	c.over = true
	c.buf = bytes.Buffer{}
}

func (c *capture) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.keep(p[:n])
	switch {
	case err == io.EOF:
		c.eof = true
	case err != nil:
		c.err = err
	}
	return n, err
}

func (c *capture) Close() error {
	if !c.done {
		c.done = true
		if !c.eof && c.err == nil {
			if _, err := io.Copy(writerFunc(c.keep), c.rc); err != nil {
				c.err = err
			} else {
				c.eof = true
			}
		}
		if c.eof {
			c.a.commit(c.resp.StatusCode, c.resp.Header, c.buf.Bytes(), !c.over)
		} else {
			c.a.p.log.Warn("upstream answer broke off", "route", c.a.routeName(), "err", c.err)
			c.a.markInDoubt()
		}
	}
	return c.rc.Close()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
