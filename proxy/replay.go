package proxy

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
)

// replay answers a duplicate with the stored answer. The answer fits the
// retrying client:
//   - a body stored in a content coding (gzip, x-gzip, deflate) the client
//     does not accept (a client that sends no Accept-Encoding accepts only
//     identity) is decoded, up to max_stored_body_bytes decoded: without
//     Content-Encoding, with its decoded Content-Length and a weak ETag;
//     one in another coding, or larger decoded, is replayed as stored.
//     A stored answer in a content coding is replayed with
//     Vary: Accept-Encoding;
//   - a HEAD replay carries the Content-Length of the original (a HEAD's,
//     or the stored body's length; none when a HEAD original had none)
//     and no body;
//   - stored trailers are replayed as trailers (the body then goes
//     chunked, as the original did).
func (a *attempt) replay(w http.ResponseWriter, resp *store.Response) {
	a.outcome, a.status = OutcomeReplayed, resp.Status
	h := w.Header()
	for k, vs := range resp.Header {
		// A record stored before credentials were refused (or by a
		// configuration that bypassed validation) keeps them.
		if config.ReplayRefusal(k, a.rt.cfg.Scope.Header) == "" {
			h[k] = vs
		}
	}
	h.Del("Content-Length")
	h.Set("Idempotent-Replayed", "true")
	if resp.Reconciled {
		h.Set("Idempotent-Reconciled", "true")
	}
	head := a.in.Method == http.MethodHead
	length, decode := int64(len(resp.Body)), ""
	if ce := strings.Join(resp.Header.Values("Content-Encoding"), ","); ce != "" {
		h.Add("Vary", "Accept-Encoding")
		if c := decodable(ce); !acceptsCodings(a.in.Header, ce) && c != "" && len(resp.Body) > 0 {
			if n, ok := decodedLength(c, resp.Body, a.rt.cfg.MaxStoredBodyBytes); ok {
				length, decode = n, c
				h.Del("Content-Encoding")
				if et := h.Get("ETag"); strings.HasPrefix(et, `"`) {
					h.Set("ETag", "W/"+et) // the decoded body is another representation
				}
			}
		}
	}
	trailers := len(resp.Trailer) > 0 && !head
	switch cl := resp.Header.Get("Content-Length"); {
	case head && cl != "" && decode == "":
		h.Set("Content-Length", cl) // the HEAD original's
	case head && len(resp.Body) == 0:
		// A HEAD original without a length (chunked): none either. The
		// stored body is empty, its 0 is not the resource's length.
	case trailers:
		// Chunked, so that the trailers can follow the body.
		names := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			names = append(names, k)
		}
		h.Set("Trailer", strings.Join(names, ", "))
	default:
		h.Set("Content-Length", strconv.FormatInt(length, 10))
	}
	w.WriteHeader(resp.Status)
	if head {
		return
	}
	if decode != "" {
		if r, err := decoder(decode, resp.Body); err == nil {
			io.Copy(w, r)
		}
	} else {
		w.Write(resp.Body)
	}
	if trailers {
		for k, vs := range resp.Trailer {
			h[k] = vs
		}
	}
}

// decodable returns the one content coding of a Content-Encoding value
// that replay can decode (gzip for x-gzip), "" for any other value
// (another coding, or several).
func decodable(ce string) string {
	switch c := strings.ToLower(strings.TrimSpace(ce)); c {
	case "gzip", "x-gzip":
		return "gzip"
	case "deflate":
		return c
	}
	return ""
}

// acceptsCodings reports whether a request's Accept-Encoding accepts every
// content coding of a Content-Encoding value. A request without
// Accept-Encoding accepts only identity: RFC 9110 lets a server send any
// coding then, but a client library that does not decode sends none.
func acceptsCodings(h http.Header, ce string) bool {
	for c := range strings.SplitSeq(ce, ",") {
		if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") && !acceptsCoding(h, c) {
			return false
		}
	}
	return true
}

func acceptsCoding(h http.Header, coding string) bool {
	coding = codingName(coding)
	explicit, star := -1, -1 // -1: not named; 0: refused; 1: accepted
	for _, v := range h.Values("Accept-Encoding") {
		for elem := range strings.SplitSeq(v, ",") {
			name, params, _ := strings.Cut(elem, ";")
			ok := 1
			for p := range strings.SplitSeq(params, ";") {
				k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					if q, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil || q <= 0 {
						ok = 0
					}
				}
			}
			switch n := codingName(name); n {
			case coding:
				explicit = ok
			case "*":
				star = ok
			}
		}
	}
	if explicit >= 0 {
		return explicit == 1
	}
	return star == 1
}

func codingName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "x-gzip" {
		return "gzip"
	}
	return s
}

// decoder returns a reader of body decoded from coding (gzip or deflate:
// zlib-wrapped as RFC 9110 says, or raw as some servers send it).
func decoder(coding string, body []byte) (io.Reader, error) {
	if coding == "gzip" {
		return gzip.NewReader(bytes.NewReader(body))
	}
	if r, err := zlib.NewReader(bytes.NewReader(body)); err == nil {
		return r, nil
	}
	return flate.NewReader(bytes.NewReader(body)), nil
}

// decodedLength returns the decoded length of body, and false when it
// cannot be decoded or is longer than limit: it decodes into nothing, so a
// small body that decodes to gigabytes (a bomb) costs limit bytes of
// work and no memory.
func decodedLength(coding string, body []byte, limit int64) (int64, bool) {
	r, err := decoder(coding, body)
	if err != nil {
		return 0, false
	}
	n, err := io.Copy(io.Discard, io.LimitReader(r, limit+1))
	return n, err == nil && n <= limit
}
