package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy/internal/admission"
)

// The answer belongs to the upstream: a protected request's answer is read
// from the upstream at the upstream's pace, up to max_stored_body_bytes,
// and committed before the client gets its first byte. The client then
// takes it from memory at its own pace, so a slow or vanished client
// never turns a finished charge into in doubt, and a retry sent as soon
// as the answer arrived is replayed, never 409 in flight.
//
// An answer that is larger than max_stored_body_bytes, or does not fit
// server.max_buffered_bytes, cannot be held: what was read of it and the
// rest are streamed to the client as they come, and it is committed as
// not replayable once the upstream's body has ended (the rule of answers
// too large to store). Such a client must take the answer before
// upstream_timeout less a quarter of it (streamMargin): then it is cut
// off, and the rest of the upstream's answer is read in the time left, so
// that an upstream that has finished still settles the key as completed.

// captureAnswer reads resp's body ahead of the client and commits it, or,
// when it cannot be held, streams it through and commits it once it ended.
// The error of an answer that broke off before it could be committed
// (the key is then in doubt) goes to the reverse proxy's error handler.
func (a *attempt) captureAnswer(resp *http.Response) error {
	limit := a.rt.cfg.MaxStoredBodyBytes
	var buf bytes.Buffer
	over, reason := false, ""
	// A HEAD's answer has no body: its ContentLength is the GET's.
	head := a.in.Method == http.MethodHead
	if resp.ContentLength > limit && !head {
		over, reason = true, notStoredTooLarge
	} else {
		if resp.ContentLength > 0 && !head {
			// Announced, but taken only as it arrives: an upstream that
			// lies about the length must not take the budget for nothing.
			buf.Grow(int(min(resp.ContentLength, 1<<20)))
		}
		var err error
		over, reason, err = a.fill(&buf, resp.Body, limit)
		if err != nil {
			a.p.log.Warn("upstream answer broke off", "route", a.routeName(), "err", err)
			a.answerBrokeOff()
			return fmt.Errorf("reading the upstream's answer: %w", err)
		}
	}
	if !over {
		trailer, fits := a.storedTrailer(resp.Trailer, limit-int64(buf.Len()))
		if fits {
			resp.Body.Close()
			a.commit(resp.StatusCode, resp.Header, trailer, buf.Bytes(), true)
			resp.Body = a.deliver(buf.Bytes())
			return nil
		}
		over, reason = true, notStoredTooLarge
	}
	// Streamed: the client must take it before the upstream's deadline,
	// less the margin in which the rest is read should the client be slow.
	a.p.m.answersNotStored.WithLabelValues(a.routeName(), reason).Inc()
	if reason == notStoredOverBudget {
		a.p.log.Warn("answer not stored: too many bytes buffered at once; duplicates get 409 response-not-replayable",
			"route", a.routeName())
	}
	if d, ok := resp.Request.Context().Deadline(); ok && a.client != nil {
		a.client.SetWriteDeadline(d.Add(-a.rt.cfg.UpstreamTimeout.D() / streamMargin))
	}
	resp.Body = &stream{prefix: buf.Bytes(), rc: resp.Body, a: a, resp: resp}
	return nil
}

// answerBrokeOff settles the key of an answer to be committed whose body broke
// off before it was whole.
func (a *attempt) answerBrokeOff() {
	v, _ := classify(upstreamResult{kind: brokeOff}, nil)
	a.conclude(v)
}

// streamMargin: an answer streamed through must reach the client before
// upstream_timeout less upstream_timeout/streamMargin.
const streamMargin = 4

// The reason label values of idemproxy_answers_not_stored_total.
const (
	notStoredTooLarge   = "too_large"
	notStoredOverBudget = "over_budget"
)

// fill reads r into buf up to limit bytes, taking each step from the
// budget. It stops early, over, when the answer is larger than limit or
// the budget cannot hold it; err is the read error of an answer that
// broke off.
func (a *attempt) fill(buf *bytes.Buffer, r io.Reader, limit int64) (over bool, reason string, err error) {
	chunk := copyBuffers.Get()
	defer copyBuffers.Put(chunk)
	for {
		n, rerr := r.Read(chunk)
		if n > 0 {
			size := int64(buf.Len() + n)
			if size > limit {
				buf.Write(chunk[:n]) // delivered, not stored
				return true, notStoredTooLarge, nil
			}
			if need := size - a.capHeld; need > 0 {
				// In steps of a page: small answers (most) take little;
				// a large one does not touch the shared counter for every
				// read.
				step := min((need+captureStep-1)/captureStep*captureStep, limit-a.capHeld)
				if !a.p.budget.Take(step, admission.RefusalAnswer) {
					buf.Write(chunk[:n])
					return true, notStoredOverBudget, nil
				}
				a.capHeld += step
				a.held += step
			}
			buf.Write(chunk[:n])
		}
		switch {
		case rerr == io.EOF:
			return false, "", nil
		case rerr != nil:
			return false, "", rerr
		}
	}
}

// captureStep is how much of the budget a captured answer takes at a time.
const captureStep = 4 << 10

// errDeliveryStopped ends the delivery of a committed answer once the
// proxy is past its shutdown deadline.
var errDeliveryStopped = errors.New("the proxy is shutting down")

// deliver returns the body that hands a committed answer to the client.
// The client may take it at its own pace, but must take each part (one
// copy buffer, 32 KiB) within the route's upstream_timeout: a client that
// stops reading does not hold the answer's memory for ever. Past the
// shutdown deadline the delivery stops; the answer is committed already.
func (a *attempt) deliver(b []byte) io.ReadCloser {
	d := &delivery{b: b, a: a}
	if a.client != nil {
		d.stop = context.AfterFunc(a.p.life, func() { a.client.SetWriteDeadline(time.Now()) })
	}
	return d
}

type delivery struct {
	b    []byte
	a    *attempt
	stop func() bool
}

func (d *delivery) Read(p []byte) (int, error) {
	if len(d.b) == 0 {
		return 0, io.EOF
	}
	if d.a.p.life.Err() != nil {
		return 0, errDeliveryStopped
	}
	if d.a.client != nil {
		d.a.client.SetWriteDeadline(time.Now().Add(d.a.rt.cfg.UpstreamTimeout.D()))
	}
	n := copy(p, d.b)
	d.b = d.b[n:]
	return n, nil
}

func (d *delivery) Close() error {
	if d.stop != nil {
		d.stop()
	}
	return nil
}

// stream passes an answer that cannot be stored through to the client:
// first what was read of it ahead, then the rest as it comes. When the
// body ends the answer is committed as not stored; if the client went away
// first, the rest is still read so the key can settle; if the upstream's
// body breaks off, the key is in doubt.
type stream struct {
	prefix []byte
	rc     io.ReadCloser
	a      *attempt
	resp   *http.Response
	eof    bool
	err    error
	done   bool
}

func (s *stream) Read(p []byte) (int, error) {
	if len(s.prefix) > 0 {
		n := copy(p, s.prefix)
		s.prefix = s.prefix[n:]
		return n, nil
	}
	n, err := s.rc.Read(p)
	switch {
	case err == io.EOF:
		s.eof = true
	case err != nil:
		s.err = err
	}
	return n, err
}

func (s *stream) Close() error {
	if !s.done {
		s.done = true
		if !s.eof && s.err == nil {
			if _, err := io.Copy(io.Discard, s.rc); err != nil {
				s.err = err
			} else {
				s.eof = true
			}
		}
		if s.eof {
			s.a.commit(s.resp.StatusCode, s.resp.Header, nil, nil, false)
		} else {
			s.a.p.log.Warn("upstream answer broke off", "route", s.a.routeName(), "err", s.err)
			s.a.answerBrokeOff()
		}
	}
	return s.rc.Close()
}

// storedTrailer returns the trailers of an answer that replay_headers
// allows (nil when there are none), and whether they fit in room bytes:
// they are stored with the body, under max_stored_body_bytes.
func (a *attempt) storedTrailer(t http.Header, room int64) (http.Header, bool) {
	var out http.Header
	var size int64
	for _, name := range a.rt.cfg.ReplayHeaders {
		vs := t.Values(name)
		if len(vs) == 0 {
			continue
		}
		if out == nil {
			out = http.Header{}
		}
		name = http.CanonicalHeaderKey(name)
		for _, v := range vs {
			size += int64(len(name) + len(v))
		}
		out[name] = vs
	}
	return out, size <= room
}
