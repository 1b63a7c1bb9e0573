package keyextract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// maxDepth bounds the nesting of a canonicalised JSON body.
const maxDepth = 512

// Canonicalize returns a canonical form of the JSON value in body: object
// members sorted by name, no insignificant white space, strings re-encoded,
// numbers as written. Members at the dotted paths in ignore (sentAt,
// meta.sentAt, items.0.ts) are left out. A body that is not exactly one
// JSON value, nests deeper than 512 levels, or repeats a name within one
// object is an error wrapping ErrBadJSON: a repeated name is read
// differently by different parsers, so the key and the upstream could
// disagree.
func Canonicalize(body []byte, ignore []string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	c := canonicalizer{dec: dec}
	if len(ignore) > 0 {
		c.ignore = make(map[string]bool, len(ignore))
		for _, p := range ignore {
			c.ignore[p] = true
		}
	}
	var out bytes.Buffer
	out.Grow(len(body))
	if err := c.value(&out, "", 0); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the JSON value", ErrBadJSON)
	}
	return out.Bytes(), nil
}

type canonicalizer struct {
	dec    *json.Decoder
	ignore map[string]bool
}

// value writes the next JSON value. depth is the number of arrays and
// objects enclosing it.
func (c *canonicalizer) value(out *bytes.Buffer, path string, depth int) error {
	tok, err := c.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("unexpected end of input")
		}
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxDepth && (t == '{' || t == '[') {
			return fmt.Errorf("nested deeper than %d levels", maxDepth)
		}
		switch t {
		case '{':
			return c.object(out, path, depth)
		case '[':
			return c.array(out, path, depth)
		}
		return fmt.Errorf("unexpected %q", t)
	case string:
		writeString(out, t)
	case json.Number:
		out.WriteString(string(t))
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

func (c *canonicalizer) object(out *bytes.Buffer, path string, depth int) error {
	type member struct {
		name string
		val  []byte
	}
	var members []member
	seen := map[string]bool{}
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string) // the decoder guarantees a string name here
		if seen[name] {
			return fmt.Errorf("the name %q appears twice in one object", name)
		}
		seen[name] = true
		var buf bytes.Buffer
		p := join(path, name)
		if err := c.value(&buf, p, depth+1); err != nil {
			return err
		}
		if !c.ignore[p] {
			members = append(members, member{name, buf.Bytes()})
		}
	}
	if _, err := c.dec.Token(); err != nil { // '}'
		return err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeString(out, m.name)
		out.WriteByte(':')
		out.Write(m.val)
	}
	out.WriteByte('}')
	return nil
}

func (c *canonicalizer) array(out *bytes.Buffer, path string, depth int) error {
	out.WriteByte('[')
	n := 0
	for i := 0; c.dec.More(); i++ {
		p := join(path, strconv.Itoa(i))
		if c.ignore[p] {
			var skip bytes.Buffer
			if err := c.value(&skip, p, depth+1); err != nil {
				return err
			}
			continue
		}
		if n > 0 {
			out.WriteByte(',')
		}
		if err := c.value(out, p, depth+1); err != nil {
			return err
		}
		n++
	}
	if _, err := c.dec.Token(); err != nil { // ']'
		return err
	}
	out.WriteByte(']')
	return nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func writeString(out *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // a Go string always marshals
	out.Write(b)
}

// Fingerprint hashes what makes two requests under one key the same
// request: the method, the path and the body. A JSON body is hashed in its
// canonical form with the ignored paths left out (so key order, white space
// and a send timestamp do not matter); any other body is hashed as it is,
// and jsonErr says why it is not JSON (an empty body is not JSON either).
func Fingerprint(method, path string, body []byte, ignore []string) (fp string, jsonErr error) {
	h := sha256.New()
	// Length-prefixed, so that no method, path and body can be shifted into
	// one another (a path may hold a decoded newline).
	fmt.Fprintf(h, "%d:%s%d:%s", len(method), method, len(path), path)
	canon, jsonErr := Canonicalize(body, ignore)
	if jsonErr == nil {
		h.Write([]byte{'j'})
		h.Write(canon)
	} else {
		h.Write([]byte{'r'})
		h.Write(body)
	}
	return hex.EncodeToString(h.Sum(nil)), jsonErr
}
