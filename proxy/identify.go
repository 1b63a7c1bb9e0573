package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/keyextract"
)

// readBody buffers the request body up to limit bytes. The budget is
// charged as the bytes arrive, in doubling steps (admission.BodyChunk), never for
// what Content-Length announces alone; the body must arrive within the
// server's body_timeout. Nothing has been reserved yet: a body refused or
// cut here leaves no key behind.
func (a *attempt) readBody(w http.ResponseWriter, limit int64) (_ []byte, ok bool) {
	r := a.in
	tooLarge := func() ([]byte, bool) {
		a.problem(w, OutcomeBadRequest, probBodyTooLarge,
			fmt.Sprintf("this route accepts bodies of at most %d bytes", limit), 0, map[string]any{"max_body_bytes": limit})
		return nil, false
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, true
	}
	if r.Context().Err() != nil {
		return a.clientGone()
	}
	src := io.Reader(http.MaxBytesReader(w, r.Body, limit))
	if t := a.p.table.Load(); t.bodyTimeout > 0 && r.ProtoMajor == 2 {
		// Over HTTP/2 a deadline set through the ResponseController is a
		// message to the connection's serving goroutine, which a handler
		// waits to hand over: under a flood of frames, or on a stream
		// already reset, that wait held the handler, and its slot. A timer
		// that closes the body cuts it without that goroutine (the stream
		// ends, the connection serves on); read_timeout still applies.
		d := &deadlineBody{r: src}
		timer := time.AfterFunc(t.bodyTimeout, func() { d.expire(); r.Body.Close() })
		defer timer.Stop()
		src = d
	} else if t.bodyTimeout > 0 {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(t.bodyTimeout)) == nil {
			// Once the body is in, back to the server's whole-request
			// deadline (read_timeout), as if the body deadline had never
			// been set. A body that failed keeps it: what the server
			// discards of its rest after the answer (up to 256 KiB) must
			// not hold the connection longer.
			defer func() {
				if ok {
					rc.SetReadDeadline(a.start.Add(t.readTimeout))
				}
			}()
		}
	}
	end := limit // the most the buffer grows to
	if r.ContentLength >= 0 {
		end = r.ContentLength
	}
	client := admission.ClientOf(r.RemoteAddr)
	// The body arrives into chunks, each taken from the budget when the
	// one before is full: what a body holds is what arrived, plus at most
	// one chunk (never past its Content-Length).
	var chunks [][]byte
	var cur []byte
	var got int64
	for {
		if len(cur) == cap(cur) {
			if cur != nil {
				chunks = append(chunks, cur)
			}
			if got == end {
				if r.ContentLength >= 0 {
					break // all of it: the reader says no more
				}
				// As far as limit allows: one more byte is a 413, the
				// end of the body is the body.
				var one [1]byte
				n, err := src.Read(one[:])
				if n > 0 || (err != nil && err != io.EOF) {
					return a.bodyFailed(w, err, tooLarge)
				}
				if err == io.EOF {
					break
				}
				continue
			}
			size := min(end-got, admission.BodyChunk(a.bodyHeld))
			if why := a.p.budget.TakeFor(client, a.bodyHeld, size); why != "" {
				return a.overloaded(w, why)
			}
			a.held += size
			a.bodyHeld += size
			a.clientID = client
			cur = make([]byte, 0, size)
		}
		n, err := src.Read(cur[len(cur):cap(cur)])
		cur = cur[:len(cur)+n]
		got += int64(n)
		if err == io.EOF {
			if r.ContentLength > 0 && got < r.ContentLength {
				err = io.ErrUnexpectedEOF
			} else {
				chunks = append(chunks, cur)
				break
			}
		}
		if err != nil {
			return a.bodyFailed(w, err, tooLarge)
		}
	}
	if len(chunks) == 1 {
		return chunks[0], true // most bodies: one chunk, no copy
	}
	// One copy into one slice: for the moment of the copy the chunks and
	// the slice are both alive, the chunks' charge covering the slice.
	body := make([]byte, 0, got)
	for _, c := range chunks {
		body = append(body, c...)
	}
	return body, true
}

// bodyFailed answers a request whose body could not be read.
func (a *attempt) bodyFailed(w http.ResponseWriter, err error, tooLarge func() ([]byte, bool)) ([]byte, bool) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), err == nil: // err == nil: a byte past the limit
		return tooLarge()
	case a.in.Context().Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded):
		return a.clientGone()
	case errors.Is(err, os.ErrDeadlineExceeded):
		// A stalled or trickling body: cut, and the connection with it
		// (HTTP/1; an HTTP/2 stream ends alone), so that it holds neither
		// the budget nor a connection any longer.
		a.p.m.adm.BodyTimedOut()
		a.p.log.Warn("request body not received within body_timeout: cut", "route", a.routeName())
		if a.in.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		a.problem(w, OutcomeBadRequest, probBodyTimeout,
			fmt.Sprintf("the request body did not arrive within %s; nothing was stored or forwarded, the request may be retried",
				a.p.table.Load().bodyTimeout), 0, nil)
		return nil, false
	}
	a.problem(w, OutcomeBadRequest, probUnreadableBody, err.Error(), 0, nil)
	return nil, false
}

// overloaded answers a request whose body does not fit the budget of
// buffered bytes (why is admission.RefusalBudget or
// admission.RefusalClient): nothing was stored or forwarded, the retry may
// fit.
func (a *attempt) overloaded(w http.ResponseWriter, why string) ([]byte, bool) {
	a.reason = why
	if why == admission.RefusalClient {
		client := admission.ClientOf(a.in.RemoteAddr)
		share := a.p.budget.PerClient()
		a.p.log.Warn("request refused: this client's request bodies hold its share of the buffers",
			"route", a.routeName(), "reason", why, "client", client,
			"setting", "server.max_buffered_bytes_per_client", "limit", share)
		a.problem(w, OutcomeOverloaded, probOverloaded, fmt.Sprintf("this client's requests buffered now (client %s) "+
			"hold its share of the proxy's buffers, server.max_buffered_bytes_per_client (%d bytes); retry later, "+
			"or raise server.max_buffered_bytes_per_client if every request comes from this address (a mesh, a gateway)",
			client, share), 1,
			map[string]any{"client": client, "setting": "server.max_buffered_bytes_per_client", "limit": share})
		return nil, false
	}
	limit := a.p.budget.Limit()
	a.p.log.Warn("request refused: too many request bytes buffered at once", "route", a.routeName(), "reason", why,
		"setting", "server.max_buffered_bytes", "limit", limit)
	a.problem(w, OutcomeOverloaded, probOverloaded, fmt.Sprintf("the proxy is buffering too many requests at once "+
		"(server.max_buffered_bytes, %d bytes); retry later", limit), 1,
		map[string]any{"setting": "server.max_buffered_bytes", "limit": limit})
	return nil, false
}

// clientGone ends a request whose client went away (over HTTP/2: reset its
// stream) before its body was in: nothing was reserved or forwarded, and
// nothing is written, since no one reads it. The handler returns at once,
// and the request's slot with it. The access log says 499, as nginx does.
func (a *attempt) clientGone() ([]byte, bool) {
	a.outcome, a.status, a.reason = OutcomeBadRequest, statusClientClosed, "client_gone"
	return nil, false
}

// statusClientClosed is the status the access log gives a request whose
// client went away before it was answered; nothing is sent.
const statusClientClosed = 499

// deadlineBody reads an HTTP/2 request body until expire (body_timeout),
// after which its reads fail with os.ErrDeadlineExceeded, as a read
// deadline's do.
type deadlineBody struct {
	r       io.Reader
	expired atomic.Bool
}

func (d *deadlineBody) expire() { d.expired.Store(true) }

func (d *deadlineBody) Read(p []byte) (int, error) {
	if d.expired.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	n, err := d.r.Read(p)
	if err != nil && d.expired.Load() {
		err = os.ErrDeadlineExceeded
	}
	return n, err
}

// invalidUpgrade reports whether a request asks to switch to a protocol
// whose name is not printable ASCII (Connection: Upgrade and such an
// Upgrade header), a request the reverse proxy refuses to forward. That is
// the client's error: answered before it is reserved or counted against
// the upstream.
func invalidUpgrade(h http.Header) bool {
	upgrade := false
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			upgrade = upgrade || strings.EqualFold(strings.Trim(tok, " \t"), "upgrade")
		}
	}
	if !upgrade {
		return false
	}
	for _, c := range []byte(h.Get("Upgrade")) {
		if c < ' ' || c > '~' {
			return true
		}
	}
	return false
}

const upgradeDetail = "the Upgrade header names a protocol that is not printable ASCII; the request was not sent"

// identity is what identifies a request on its route.
type identity struct {
	key    string // the idempotency key
	scope  string // the scope header's value ("" when the route has none)
	fp     string // the fingerprint ("" when the route disables it)
	target string // the path and the canonical query the fingerprint covers
}

// badRequest is why a request cannot be identified: the problem enforce
// mode answers with, which observe mode counts (as OutcomeBadRequest) and
// forwards instead.
type badRequest struct {
	prob   problem
	detail string
	err    error // the key extractor's error, when that is the cause
}

func (b *badRequest) Error() string { return b.detail }
func (b *badRequest) Unwrap() error { return b.err }

// errKeyBodyOverBudget: the decoded body, read for the key and the
// fingerprint, does not fit the budget of buffered bytes.
var errKeyBodyOverBudget = errors.New("the decoded request body does not fit the buffered-bytes budget")

// identify returns the request's identity. When it has none it answers
// the request and reports false: a bad request is answered with its
// problem (or forwarded in observe mode), a request without a key under
// on_missing_key: forward is forwarded unprotected, and one whose decoded
// body does not fit the budget is answered 503.
func (a *attempt) identify(w http.ResponseWriter, body []byte) (identity, bool) {
	id, err := a.readIdentity(body)
	var bad *badRequest
	switch {
	case err == nil:
		return id, true
	case errors.Is(err, keyextract.ErrMissing) && a.rt.cfg.OnMissingKey == config.MissingKeyForward:
		a.outcome = OutcomeUnprotected
		a.p.forward(w, a, body)
	case errors.Is(err, errKeyBodyOverBudget):
		a.overloaded(w, admission.RefusalBudget)
	case errors.As(err, &bad):
		if !a.observe(w, body, OutcomeBadRequest) {
			a.problem(w, OutcomeBadRequest, bad.prob, bad.detail, 0, nil)
		}
	}
	return id, false
}

// readIdentity finds the request's identity, in order: the body as the key
// reads it, the fingerprint, the key, the scope. The error is a
// *badRequest or errKeyBodyOverBudget.
func (a *attempt) readIdentity(body []byte) (id identity, err error) {
	keyBody, err := a.keyBody(body)
	if err != nil {
		return id, err
	}
	if id.fp, id.target, err = a.fingerprint(keyBody); err != nil {
		return id, err
	}
	if id.key, err = a.key(keyBody); err != nil {
		return id, err
	}
	id.scope, err = a.scope()
	return id, err
}

// keyBody returns the body as the key and the fingerprint read it: a
// compressed body decoded (a retry may compress it otherwise). The body is
// forwarded as sent.
func (a *attempt) keyBody(body []byte) ([]byte, error) {
	if len(body) == 0 || (!a.rt.spec.NeedsJSON() && a.rt.cfg.Fingerprint.Disabled) {
		return body, nil
	}
	keyBody, prob, detail := a.decodeBody(body)
	switch {
	case prob != nil:
		return nil, &badRequest{prob: *prob, detail: detail}
	case keyBody == nil:
		return nil, errKeyBodyOverBudget
	}
	return keyBody, nil
}

// fingerprint returns the request's fingerprint ("" when the route
// disables it) and the target it covers: the (cleaned) path and the query,
// parameters sorted, so that the same key with another query is another
// request. A body that is not JSON is a bad request on a route that reads
// its key from the body.
func (a *attempt) fingerprint(keyBody []byte) (fp, target string, err error) {
	r := a.in
	target = r.URL.Path
	if raw := r.URL.RawQuery; raw != "" {
		target += "?" + canonicalQuery(raw)
	}
	fp, jsonErr := keyextract.FingerprintIgnoring(r.Method, target, keyBody, a.rt.ignore)
	if a.rt.spec.NeedsJSON() && jsonErr != nil {
		return "", "", &badRequest{prob: probInvalidJSON, detail: jsonErr.Error()}
	}
	if a.rt.cfg.Fingerprint.Disabled {
		fp = ""
	}
	return fp, target, nil
}

// key returns the request's idempotency key. A missing key is a bad
// request that wraps keyextract.ErrMissing.
func (a *attempt) key(keyBody []byte) (string, error) {
	key, err := a.rt.spec.Extract(a.in, keyBody)
	if err == nil {
		return key, nil
	}
	prob := probInvalidKey
	switch {
	case errors.Is(err, keyextract.ErrMissing):
		prob = probMissingKey
	case errors.Is(err, keyextract.ErrBadJSON):
		prob = probInvalidJSON
	}
	return "", &badRequest{prob: prob, detail: err.Error(), err: err}
}

// scope returns the value of the route's scope header ("" when it has
// none). On a route with one, each client is one key space: the header
// missing, empty or repeated is a bad request.
func (a *attempt) scope() (string, error) {
	h := a.rt.cfg.Scope.Header
	if h == "" {
		return "", nil
	}
	vs := a.in.Header.Values(h)
	if len(vs) > 1 {
		// Scoped by which one? Each client must be one key space.
		return "", &badRequest{prob: probInvalidScope, detail: "the " + h + " header is repeated"}
	}
	if len(vs) == 0 || vs[0] == "" {
		return "", &badRequest{prob: probMissingScope, detail: "this route keeps one key space per " + h + " header"}
	}
	return vs[0], nil
}

// canonicalQuery sorts the parameters of a query string. A query Go cannot
// parse (a ';', a bad escape) is sorted as raw pairs, so that no part of it
// is left out of the fingerprint.
func canonicalQuery(raw string) string {
	if q, err := url.ParseQuery(raw); err == nil {
		return q.Encode()
	}
	pairs := strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' })
	slices.Sort(pairs)
	return "raw:" + strings.Join(pairs, "&")
}
