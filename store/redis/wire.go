package redis

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/idemproxy/idemproxy/store"
)

// wireResponse is the JSON form of a stored answer in a record's response
// field (and in a lookup's applied answer). Records written by earlier
// releases use these names, so they must never change.
type wireResponse struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header,omitempty"`
	Body       []byte      `json:"body,omitempty"`
	Trailer    http.Header `json:"trailer,omitempty"`
	BodyStored bool        `json:"body_stored"`
	Reconciled bool        `json:"reconciled,omitempty"`
}

// encodeResponse returns the JSON of r, byte for byte what
// json.Marshal(wireResponse(r)) returns (TestEncodeResponseIsJSON), written
// without reflection: it runs for every committed answer.
func encodeResponse(r store.Response) ([]byte, error) {
	n := 64 + base64.StdEncoding.EncodedLen(len(r.Body)) + headerSize(r.Header) + headerSize(r.Trailer)
	b := make([]byte, 0, n)
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	if len(r.Header) > 0 {
		b = append(b, `,"header":`...)
		b = appendHeader(b, r.Header)
	}
	if len(r.Body) > 0 {
		b = append(b, `,"body":"`...)
		b = base64.StdEncoding.AppendEncode(b, r.Body)
		b = append(b, '"')
	}
	if len(r.Trailer) > 0 {
		b = append(b, `,"trailer":`...)
		b = appendHeader(b, r.Trailer)
	}
	b = append(b, `,"body_stored":`...)
	b = strconv.AppendBool(b, r.BodyStored)
	if r.Reconciled {
		b = append(b, `,"reconciled":true`...)
	}
	return append(b, '}'), nil
}

// headerSize is about the JSON size of h.
func headerSize(h http.Header) int {
	n := 0
	for k, vs := range h {
		n += len(k) + 6
		for _, v := range vs {
			n += len(v) + 3
		}
	}
	return n
}

// appendHeader appends h as encoding/json writes a map of string slices:
// keys sorted, a nil slice as null.
func appendHeader(b []byte, h http.Header) []byte {
	var small [16]string
	keys := small[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		vs := h[k]
		if vs == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range vs {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string the way encoding/json does: a
// string of printable ASCII that needs no escape (json.Marshal escapes '"',
// '\\' and, for HTML, '<', '>' and '&') is copied between quotes; any other
// goes through encoding/json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func decodeResponse(b []byte) (store.Response, error) {
	var w wireResponse
	err := json.Unmarshal(b, &w)
	return store.Response(w), err
}
