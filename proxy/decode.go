package proxy

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"strings"

	"github.com/idemproxy/idemproxy/internal/admission"
)

// decodeBody returns a request body decoded from its Content-Encoding, for
// the key and the fingerprint: body itself when it has none (or identity).
// Only one coding of gzip, x-gzip and deflate is decoded; any other is
// 415. The decoded body is bounded by the route's max_body_bytes (413
// beyond: a bomb costs that much work at most) and takes its size from
// the budget of buffered bytes: a nil body and no problem when it does
// not fit now (503 overloaded). A body that cannot be decoded is 400.
func (a *attempt) decodeBody(body []byte) ([]byte, *problem, string) {
	var codings []string
	for _, v := range a.in.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) == 0 {
		return body, nil, ""
	}
	if len(codings) > 1 || decodable(codings[0]) == "" {
		return nil, &probUnsupportedCoding, fmt.Sprintf(
			"this route reads the body for its key or fingerprint and decodes only one of gzip, x-gzip and deflate, not %q",
			strings.Join(codings, ", "))
	}
	coding := decodable(codings[0])
	var r io.Reader
	var err error
	if coding == "gzip" {
		r, err = gzip.NewReader(bytes.NewReader(body))
	} else if r, err = zlib.NewReader(bytes.NewReader(body)); err != nil {
		r, err = flate.NewReader(bytes.NewReader(body)), nil // raw deflate, as some clients send it
	}
	undecodable := func(err error) ([]byte, *problem, string) {
		return nil, &probUnreadableBody, fmt.Sprintf("the %s body could not be decoded: %v", codings[0], err)
	}
	if err != nil {
		return undecodable(err)
	}
	limit := a.rt.cfg.MaxBodyBytes
	var out bytes.Buffer
	var held int64
	var chunk [decodeStep]byte
	for {
		n, rerr := r.Read(chunk[:])
		if n > 0 {
			size := int64(out.Len() + n)
			if size > limit {
				return nil, &probBodyTooLarge, fmt.Sprintf(
					"this route accepts bodies of at most %d bytes, decoded from %s too", limit, codings[0])
			}
			if need := size - held; need > 0 {
				step := min(max(need, decodeStep), limit-held)
				if !a.p.budget.Take(step, admission.RefusalBudget) {
					return nil, nil, ""
				}
				held += step
				a.held += step
			}
			out.Write(chunk[:n])
		}
		switch {
		case rerr == io.EOF:
			if out.Len() == 0 {
				return []byte{}, nil, "" // nil would say "over budget"
			}
			return out.Bytes(), nil, ""
		case rerr != nil:
			return undecodable(rerr)
		}
	}
}

// decodeStep is how much of the budget a decoded request body takes at a
// time.
const decodeStep = 64 << 10
