package keyextract

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// maxDepth bounds how deeply arrays and objects may nest in a JSON body.
const maxDepth = 128

// Canonicalize returns a canonical form of the JSON value in body: object
// members sorted by name, no insignificant white space, strings re-encoded
// (a lone surrogate kept as its escape, \udc00), numbers that every
// mainstream decoder reads as one value in one form (4200 for 4.2e3 and
// 4200.0; see number) and the others as written. Members at the dotted paths in ignore (sentAt,
// meta.sentAt, items.0.ts) are left out. A body that is not exactly one
// JSON value, nests deeper than maxDepth, or repeats a name within one
// object is an error wrapping ErrBadJSON. Names that differ only in case
// count as repeated: Go's encoding/json (and others) match names without
// regard to case, so the key and the upstream could read different members.
func Canonicalize(body []byte, ignore []string) ([]byte, error) {
	var out bytes.Buffer
	out.Grow(len(body))
	if err := canonicalize(&out, body, CompileIgnore(ignore), false); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// canonicalize writes the canonical form of body to w (with numbers as
// written when numbersAsWritten).
func canonicalize(w io.Writer, body []byte, ignore *Ignore, numbersAsWritten bool) error {
	if err := checkJSON(body); err != nil {
		return err
	}
	bw := writers.Get().(*bufio.Writer)
	defer writers.Put(bw)
	bw.Reset(w)
	c := canonicalizer{w: bw, numbersAsWritten: numbersAsWritten}
	if ignore != nil {
		c.ignore, c.children = ignore.ignore, ignore.children
	}
	if err := c.value(gjson.ParseBytes(body), "", c.ignore != nil); err != nil {
		return fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	return bw.Flush()
}

// Ignore is a compiled list of ignored JSON paths (fingerprint.ignore).
// It is only read once built, so one Ignore serves concurrent
// fingerprints; a nil *Ignore leaves nothing out.
type Ignore struct {
	ignore   map[string]bool
	children map[string]map[string]bool
}

// CompileIgnore compiles the dotted paths to leave out of a fingerprint
// (sentAt, meta.sentAt); it returns nil for an empty list. Compile a
// route's list once, not per request: building it is most of a small
// fingerprint's allocations.
func CompileIgnore(paths []string) *Ignore {
	if len(paths) == 0 {
		return nil
	}
	ig := &Ignore{ignore: make(map[string]bool, len(paths)), children: map[string]map[string]bool{}}
	for _, p := range paths {
		ig.ignore[p] = true
		parent := ""
		for name := range strings.SplitSeq(p, ".") {
			if ig.children[parent] == nil {
				ig.children[parent] = map[string]bool{}
			}
			ig.children[parent][name] = true
			parent = join(parent, name)
		}
	}
	return ig
}

var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

// checkJSON reports whether body is one valid JSON value nested at most
// maxDepth deep. The depth is checked first, by a linear scan, so that the
// validator's recursion is bounded too.
func checkJSON(body []byte) error {
	depth, inString, escaped := 0, false, false
	for _, c := range body {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > maxDepth {
				return fmt.Errorf("%w: nested deeper than %d levels", ErrBadJSON, maxDepth)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	if !gjson.ValidBytes(body) {
		// The slow path, for the error message only.
		var first json.RawMessage
		err := json.NewDecoder(bytes.NewReader(body)).Decode(&first)
		switch {
		case errors.Is(err, io.EOF):
			return fmt.Errorf("%w: unexpected end of input", ErrBadJSON)
		case err != nil:
			return fmt.Errorf("%w: %v", ErrBadJSON, err)
		}
		return fmt.Errorf("%w: data after the JSON value", ErrBadJSON)
	}
	return nil
}

type canonicalizer struct {
	w      *bufio.Writer
	ignore map[string]bool
	// children holds, for each path above an ignored one, the names below
	// it that lead to one: only those paths are worth building.
	children map[string]map[string]bool
	// numbersAsWritten writes every number as written, as fingerprints
	// were made before numbers were canonicalised (LegacyFingerprintIgnoring).
	numbersAsWritten bool
}

// value writes one valid JSON value. When tracked, path is its dotted path;
// otherwise no ignored path lies at or below it.
func (c *canonicalizer) value(v gjson.Result, path string, tracked bool) error {
	switch {
	case v.IsObject():
		return c.object(v, path, tracked)
	case v.IsArray():
		return c.array(v, path, tracked)
	case v.Type == gjson.String:
		if _, lone := loneSurrogate(v.Raw); lone {
			writeKeeping(c.w, decodeKeeping(v.Raw))
			return nil
		}
		writeString(c.w, v.Str)
	case v.Type == gjson.Number:
		// One value, one form (4.2e3 as 4200); a number decoders read
		// differently stays as written.
		if canon, refused := number(v.Raw); refused == "" && !c.numbersAsWritten {
			c.w.WriteString(canon)
			return nil
		}
		c.w.WriteString(v.Raw)
	default: // true, false, null
		c.w.WriteString(v.Raw)
	}
	return nil
}

// object writes an object; tracked says whether its members' paths matter.
func (c *canonicalizer) object(v gjson.Result, path string, tracked bool) error {
	type member struct {
		name string
		val  gjson.Result
		lone bool // name holds a lone surrogate (decodeKeeping)
	}
	var room [8]member // the members of a small object, without an allocation
	members := room[:0]
	seen := map[string]string{}
	var err error
	v.ForEach(func(k, val gjson.Result) bool {
		name, goName, lone := k.Str, k.Str, false
		if _, lone = loneSurrogate(k.Raw); lone {
			// Kept, so that "\udc00" and "\udc01" stay two names; but
			// they are one to encoding/json, so repeated.
			name = decodeKeeping(k.Raw)
			goName = goView(name)
		} else if !utf8.ValidString(k.Str) {
			// As encoding/json reads it, before sorting: each invalid
			// byte is U+FFFD.
			name = string([]rune(k.Str))
			goName = name
		}
		folded := foldName(goName)
		if first, dup := seen[folded]; dup {
			err = fmt.Errorf("the names %q and %q in one object are the same name to case-insensitive readers", first, goName)
			if first == goName {
				err = fmt.Errorf("the name %q appears twice in one object", goName)
			}
			return false
		}
		seen[folded] = goName
		members = append(members, member{name, val, lone})
		return true
	})
	if err != nil {
		return err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
	c.w.WriteByte('{')
	n := 0
	for _, m := range members {
		p, track := "", tracked && c.children[path][m.name]
		if track {
			p = join(path, m.name)
		}
		if track && c.ignore[p] {
			if err := c.skip(m.val); err != nil {
				return err
			}
			continue
		}
		if n > 0 {
			c.w.WriteByte(',')
		}
		n++
		if m.lone {
			writeKeeping(c.w, m.name)
		} else {
			writeString(c.w, m.name)
		}
		c.w.WriteByte(':')
		if err := c.value(m.val, p, track); err != nil {
			return err
		}
	}
	c.w.WriteByte('}')
	return nil
}

// array writes an array; tracked says whether its elements' paths matter.
func (c *canonicalizer) array(v gjson.Result, path string, tracked bool) error {
	c.w.WriteByte('[')
	i, n := 0, 0
	var err error
	kids := c.children[path]
	tracked = tracked && slices.ContainsFunc(slices.Collect(maps.Keys(kids)), isIndex)
	v.ForEach(func(_, val gjson.Result) bool {
		var p string
		track := false
		if tracked {
			name := strconv.Itoa(i)
			if track = kids[name]; track {
				p = join(path, name)
			}
		}
		i++
		if track && c.ignore[p] {
			err = c.skip(val)
			return err == nil
		}
		if n > 0 {
			c.w.WriteByte(',')
		}
		n++
		err = c.value(val, p, track)
		return err == nil
	})
	if err != nil {
		return err
	}
	c.w.WriteByte(']')
	return nil
}

// isIndex reports whether a path segment is an array index.
func isIndex(name string) bool {
	_, err := strconv.Atoi(name)
	return err == nil
}

// skip checks an ignored value (a repeated name is an error there too)
// without writing it.
func (c *canonicalizer) skip(v gjson.Result) error {
	bw := writers.Get().(*bufio.Writer) // pooled: a new 4 KiB writer per ignored value was most of a fingerprint's garbage
	defer writers.Put(bw)
	bw.Reset(io.Discard)
	d := canonicalizer{w: bw}
	return d.value(v, "", false)
}

// foldName maps a name to one representative of its case-folding class
// (Unicode simple folding, as encoding/json compares names).
func foldName(s string) string {
	return strings.Map(func(r rune) rune {
		m := r // the largest of the class: a lower-case ASCII name maps to itself
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = max(m, f)
		}
		return m
	}, s)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// writeString writes s as a JSON string, each byte that is not valid
// UTF-8 replaced by U+FFFD (as encoding/json decodes it).
func writeString(w *bufio.Writer, s string) {
	if plain(s) { // what json.Marshal would write, without its allocation
		w.WriteByte('"')
		w.WriteString(s)
		w.WriteByte('"')
		return
	}
	if !utf8.ValidString(s) {
		s = string([]rune(s))
	}
	b, _ := json.Marshal(s) // a Go string always marshals
	w.Write(b)
}

// plain reports whether s is printable ASCII that json.Marshal writes as
// it is (no quote, backslash, or HTML character, which it escapes).
func plain(s string) bool {
	for i := range len(s) {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// Fingerprint hashes what makes two requests under one key the same
// request: the method, the target (the path, with the query string if the
// caller includes it) and the body. A JSON body is hashed in its canonical
// form with the ignored paths left out (so key order, white space and a
// send timestamp do not matter); any other body is hashed as it is, and
// jsonErr says why it is not JSON (an empty body is not JSON either).
func Fingerprint(method, target string, body []byte, ignore []string) (fp string, jsonErr error) {
	return FingerprintIgnoring(method, target, body, CompileIgnore(ignore))
}

// FingerprintIgnoring is Fingerprint with the ignored paths compiled
// beforehand (CompileIgnore).
func FingerprintIgnoring(method, target string, body []byte, ignore *Ignore) (fp string, jsonErr error) {
	return fingerprint(method, target, body, ignore, false)
}

// LegacyFingerprintIgnoring is FingerprintIgnoring with every number
// hashed as written (4.2e3, 12.50), as fingerprints were made before
// numbers were canonicalised: records stored by such a version keep their
// fingerprints for their TTL, and an identical retry after an upgrade must
// still match them. It differs from FingerprintIgnoring only for a JSON
// body holding a number not written in its canonical form, and it never
// matches a fingerprint of this version's that FingerprintIgnoring of the
// same body would not.
func LegacyFingerprintIgnoring(method, target string, body []byte, ignore *Ignore) (fp string, jsonErr error) {
	return fingerprint(method, target, body, ignore, true)
}

func fingerprint(method, target string, body []byte, ignore *Ignore, numbersAsWritten bool) (fp string, jsonErr error) {
	h := sha256.New()
	// Length-prefixed, so that no method, target and body can be shifted
	// into one another (a path may hold a decoded newline).
	writePrefix(h, method, target, 'j')
	if jsonErr = canonicalize(h, body, ignore, numbersAsWritten); jsonErr != nil {
		h.Reset()
		writePrefix(h, method, target, 'r')
		h.Write(body)
	}
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], h.Sum(sum[:0]))
	return string(out[:]), jsonErr
}

// writePrefix writes "<len(method)>:<method><len(target)>:<target><kind>"
// to h, as fmt.Fprintf("%d:%s%d:%s") and the kind byte would, without
// boxing its arguments.
func writePrefix(h hash.Hash, method, target string, kind byte) {
	var small [128]byte
	b := strconv.AppendInt(small[:0], int64(len(method)), 10)
	b = append(b, ':')
	b = append(b, method...)
	b = strconv.AppendInt(b, int64(len(target)), 10)
	b = append(b, ':')
	b = append(b, target...)
	b = append(b, kind)
	h.Write(b)
}
