// Package keyextract finds a request's idempotency key (in a header, a JSON
// body path, a query parameter, a path wildcard, or several of them) and
// computes the request's fingerprint over a canonical form of its body.
package keyextract

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"golang.org/x/text/unicode/norm"
)

// maxKeyBytes is the longest key accepted, composite keys included.
const maxKeyBytes = 255

// Kind is where a key part comes from.
type Kind int

// The key sources.
const (
	JSON   Kind = iota + 1 // a path in the JSON body: orderId, order.id, items.0.sku
	Header                 // a request header
	Query                  // a query parameter
	Path                   // a wildcard of the route's ServeMux pattern
)

func (k Kind) String() string {
	switch k {
	case JSON:
		return "json"
	case Header:
		return "header"
	case Query:
		return "query"
	case Path:
		return "path"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Source is one place a key part comes from.
type Source struct {
	Kind Kind
	// Name is the JSON path, header name, query parameter or wildcard name.
	Name string
}

func (s Source) String() string { return s.Kind.String() + " " + s.Name }

// Spec says where a route's key comes from: one Source, or several joined
// into a composite key.
type Spec struct {
	Parts []Source
	// NFC puts the value of every part in Unicode Normalization Form C
	// before the parts are joined and the key is checked, so that "CAFÉ-1"
	// written with U+00C9 and with E and U+0301 is one key. False (the
	// default) compares keys byte for byte. It applies to the key only,
	// never to the fingerprint, and not to LegacyExtract.
	NFC bool
}

// NeedsJSON reports whether any part of the key is read from the JSON body.
func (s Spec) NeedsJSON() bool {
	for _, p := range s.Parts {
		if p.Kind == JSON {
			return true
		}
	}
	return false
}

// Errors returned, wrapped in *extractError, by Extract.
var (
	// ErrMissing: the source has no value (absent, empty or JSON null).
	ErrMissing = errors.New("missing")
	// errInvalid: the value is not a usable key (too long, not printable,
	// not a scalar, ambiguous, read differently by mainstream decoders, a
	// malformed structured string in a header).
	errInvalid = errors.New("invalid")
	// ErrBadJSON: the body is not one valid JSON value.
	ErrBadJSON = errors.New("body is not valid JSON")
)

// extractError is a key that could not be extracted.
type extractError struct {
	Source Source
	// Err is ErrMissing, errInvalid or ErrBadJSON.
	Err error
	// Reason explains errInvalid and ErrBadJSON in a few words.
	Reason string
}

func (e *extractError) Error() string {
	msg := fmt.Sprintf("key %s: %v", e.Source, e.Err)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

func (e *extractError) Unwrap() error { return e.Err }

// Extract returns the key of r. body is the request body, already read;
// it is only looked at for JSON sources. A composite key joins its parts
// with '|', each part escaped so that the joined key is unambiguous
// ('%' as %25, '|' as %7C).
// On error the key is "".
func (s Spec) Extract(r *http.Request, body []byte) (string, error) {
	return s.extract(r, body, false)
}

// LegacyExtract returns the key of r as versions before the key rules of
// issue 16 derived it: a header's value as sent (a quoted structured
// string with its quotes) and a JSON number as written (4200.0), where
// Extract reads "k-1" as k-1 and 4200.0 as 4200. Records such a version
// stored stay under that key for their TTL, so a retry must still find
// them. It is Extract's key whenever the two rules agree.
func (s Spec) LegacyExtract(r *http.Request, body []byte) (string, error) {
	return s.extract(r, body, true)
}

func (s Spec) extract(r *http.Request, body []byte, legacy bool) (string, error) {
	switch len(s.Parts) {
	case 0:
		return "", &extractError{Err: errInvalid, Reason: "no key source configured"}
	case 1:
		v, err := s.Parts[0].value(r, body, legacy)
		if err != nil {
			return "", err
		}
		if s.NFC && !legacy {
			v = nfc(v)
		}
		if err := checkKey(s.Parts[0], v); err != nil {
			return "", err
		}
		return v, nil
	}
	vals := make([]string, len(s.Parts))
	for i, p := range s.Parts {
		v, err := p.value(r, body, legacy)
		if err != nil {
			return "", err
		}
		if s.NFC && !legacy {
			v = nfc(v)
		}
		vals[i] = partEscaper.Replace(v)
	}
	key := strings.Join(vals, "|")
	if err := checkKey(Source{Kind: s.Parts[0].Kind, Name: "(composite)"}, key); err != nil {
		return "", err
	}
	return key, nil
}

// nfc returns v in Unicode Normalization Form C. A value that is not
// UTF-8, or too long to be a key in any form (NFC makes a string at most
// three times shorter: a Hangul syllable from its three jamo), is returned
// as it is, for checkKey to refuse without normalizing it.
func nfc(v string) string {
	if len(v) > 3*maxKeyBytes || !utf8.ValidString(v) {
		return v
	}
	return norm.NFC.String(v)
}

var partEscaper = strings.NewReplacer("%", "%25", "|", "%7C")

func (src Source) value(r *http.Request, body []byte, legacy bool) (string, error) {
	switch src.Kind {
	case Header:
		vs := r.Header.Values(src.Name)
		if len(vs) > 1 {
			return "", &extractError{Source: src, Err: errInvalid, Reason: "the header is repeated"}
		}
		if len(vs) == 0 || vs[0] == "" {
			return "", &extractError{Source: src, Err: ErrMissing}
		}
		if legacy {
			return vs[0], nil
		}
		key, reason := sfHeaderValue(vs[0])
		if reason != "" {
			return "", &extractError{Source: src, Err: errInvalid, Reason: "not a valid RFC 8941 structured field string: " + reason}
		}
		if key == "" {
			return "", &extractError{Source: src, Err: ErrMissing}
		}
		return key, nil
	case Query:
		vs := r.URL.Query()[src.Name]
		if unparsedParam(r.URL.RawQuery, src.Name) {
			// Left out by Go, read by others: not missing, and with
			// on_missing_key: forward it would go unprotected.
			return "", &extractError{Source: src, Err: errInvalid, Reason: "the parameter is not valid query syntax (a bad % escape or a ';')"}
		}
		if len(vs) > 1 {
			return "", &extractError{Source: src, Err: errInvalid, Reason: "the parameter is repeated"}
		}
		if len(vs) == 0 || vs[0] == "" {
			return "", &extractError{Source: src, Err: ErrMissing}
		}
		return vs[0], nil
	case Path:
		v := r.PathValue(src.Name)
		if v == "" {
			return "", &extractError{Source: src, Err: ErrMissing}
		}
		return v, nil
	case JSON:
		if err := checkJSON(body); err != nil {
			return "", &extractError{Source: src, Err: ErrBadJSON, Reason: strings.TrimPrefix(err.Error(), ErrBadJSON.Error()+": ")}
		}
		// gjson looks for the first '{' or '[' even inside a top-level
		// string ("[0" would yield 0"): a path only exists in an object or
		// array.
		if b := bytes.TrimLeft(body, " \t\r\n"); b[0] != '{' && b[0] != '[' {
			return "", &extractError{Source: src, Err: ErrMissing}
		}
		res, ambiguous := lookupFold(gjson.ParseBytes(body), src.Name)
		if ambiguous {
			return "", &extractError{Source: src, Err: errInvalid, Reason: "a name on the path appears in more than one letter case"}
		}
		switch res.Type {
		case gjson.String:
			if r, lone := loneSurrogate(res.Raw); lone {
				return "", &extractError{Source: src, Err: errInvalid, Reason: fmt.Sprintf(
					"the string holds a lone UTF-16 surrogate (\\u%04x), which Go reads as U+FFFD and JavaScript and Python keep", r)}
			}
			if res.Str == "" {
				return "", &extractError{Source: src, Err: ErrMissing}
			}
			return res.Str, nil
		case gjson.Number:
			// The canonical form (4.2e3 as 4200), so that 1001 and "1001"
			// are one key, and 4200 and 4.2e3.
			if legacy {
				return res.Raw, nil
			}
			canon, refused := number(res.Raw)
			if refused != "" {
				return "", &extractError{Source: src, Err: errInvalid, Reason: "the number " + abbrev(res.Raw) + " " + refused}
			}
			return canon, nil
		case gjson.True, gjson.False:
			return res.Raw, nil
		case gjson.JSON:
			return "", &extractError{Source: src, Err: errInvalid, Reason: "an object or array is not a key"}
		default: // Null, or not present
			return "", &extractError{Source: src, Err: ErrMissing}
		}
	}
	return "", &extractError{Source: src, Err: errInvalid, Reason: "unknown source"}
}

// unparsedParam reports whether query holds a pair named name that Go's
// url.ParseQuery leaves out: one with a bad escape ("id=50%off") or a ';'
// ("id=A;B", "x=1;id=A"). Upstreams in other languages read it (PHP and
// Express keep a bad escape as written, some split pairs at ';').
func unparsedParam(query, name string) bool {
	for query != "" {
		var pair string
		pair, query, _ = strings.Cut(query, "&")
		if _, err := url.ParseQuery(pair); err == nil {
			continue
		}
		for sub := range strings.SplitSeq(pair, ";") {
			k, _, _ := strings.Cut(sub, "=")
			if u, err := url.QueryUnescape(k); err == nil {
				k = u
			}
			if k == name {
				return true
			}
		}
	}
	return false
}

// lookupFold finds path in v, matching object member names as many
// upstreams decode them: case-insensitively (Go's encoding/json takes
// "OrderId" for a field orderId). A name whose only match differs in case
// is that member, so a request is never forwarded as "missing a key" that
// the upstream reads; a name matched by more than one member (orderId and
// OrderId) is ambiguous, since upstreams differ in which one they take.
func lookupFold(v gjson.Result, path string) (res gjson.Result, ambiguous bool) {
	for name := range strings.SplitSeq(path, ".") {
		switch {
		case v.IsObject():
			var found gjson.Result
			n := 0
			v.ForEach(func(k, val gjson.Result) bool {
				if strings.EqualFold(k.Str, name) {
					found = val
					n++
				}
				return n < 2
			})
			if n > 1 {
				return gjson.Result{}, true
			}
			v = found
		case v.IsArray():
			v = v.Get(name) // an index; a name is not found
		default:
			return gjson.Result{}, false
		}
		if !v.Exists() {
			return gjson.Result{}, false
		}
	}
	return v, false
}

func checkKey(src Source, key string) error {
	if len(key) > maxKeyBytes {
		return &extractError{Source: src, Err: errInvalid, Reason: fmt.Sprintf("longer than %d bytes", maxKeyBytes)}
	}
	if !utf8.ValidString(key) {
		return &extractError{Source: src, Err: errInvalid, Reason: "not valid UTF-8"}
	}
	for _, r := range key {
		if !unicode.IsPrint(r) {
			return &extractError{Source: src, Err: errInvalid, Reason: "holds a character that is not printable"}
		}
	}
	return nil
}

var pathSyntax = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// ValidatePath checks a JSON path: names and array indexes separated by
// dots (orderId, order.id, items.0.sku). Names hold letters, digits, '_'
// and '-'.
func ValidatePath(path string) error {
	if !pathSyntax.MatchString(path) {
		return fmt.Errorf("%q is not a JSON path of names and indexes separated by dots (order.id, items.0.sku)", path)
	}
	return nil
}
