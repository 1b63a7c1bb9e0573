package redis

import (
	"errors"
	"fmt"
	"math"
)

// packed is a record as the scripts pack it (see "The record layout" in
// scripts.go).
type packed struct {
	st, tok, fp string
	cr, le      int64
	resp        string
	og          string // the origin: "" when the record has none
}

// errPacked is returned (wrapped) for a string that is not a packed record.
var errPacked = errors.New("not a packed record")

// decodePacked reads a record packed by the scripts: seven MessagePack
// values, 1, state, token, fingerprint, created, lease end and response,
// and an eighth, the origin, when the record has one.
// It reads only the encodings Redis' cmsgpack writes for them (strings,
// and integers, which it writes for every integral Lua number).
func decodePacked(b string) (packed, error) {
	d := msgpackReader{b: b}
	var p packed
	if v, err := d.int(); err != nil || v != 1 {
		return p, fmt.Errorf("%w: version %d, %v", errPacked, v, err)
	}
	var err error
	for _, s := range []*string{&p.st, &p.tok, &p.fp} {
		if *s, err = d.str(); err != nil {
			return p, err
		}
	}
	if p.cr, err = d.int(); err != nil {
		return p, err
	}
	if p.le, err = d.int(); err != nil {
		return p, err
	}
	if p.resp, err = d.str(); err != nil {
		return p, err
	}
	if d.i < len(d.b) {
		if p.og, err = d.str(); err != nil {
			return p, err
		}
	}
	if d.i != len(d.b) {
		return p, fmt.Errorf("%w: %d bytes after the record", errPacked, len(d.b)-d.i)
	}
	return p, nil
}

// msgpackReader reads MessagePack values from b.
type msgpackReader struct {
	b string
	i int
}

// next returns the next n bytes.
func (d *msgpackReader) next(n int) (string, error) {
	if n < 0 || len(d.b)-d.i < n {
		return "", fmt.Errorf("%w: truncated at byte %d", errPacked, d.i)
	}
	s := d.b[d.i : d.i+n]
	d.i += n
	return s, nil
}

// uint reads a big-endian unsigned integer of n bytes.
func (d *msgpackReader) uint(n int) (uint64, error) {
	s, err := d.next(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := 0; i < n; i++ {
		v = v<<8 | uint64(s[i])
	}
	return v, nil
}

// int reads an integer (or an integral float64).
func (d *msgpackReader) int() (int64, error) {
	t, err := d.next(1)
	if err != nil {
		return 0, err
	}
	switch c := t[0]; {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c >= 0xcc && c <= 0xcf:
		v, err := d.uint(1 << (c - 0xcc))
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%w: integer out of range", errPacked)
		}
		return int64(v), err
	case c >= 0xd0 && c <= 0xd3:
		n := 1 << (c - 0xd0)
		v, err := d.uint(n)
		return int64(v<<(64-8*n)) >> (64 - 8*n), err // sign-extend
	case c == 0xcb:
		v, err := d.uint(8)
		f := math.Float64frombits(v)
		if err == nil && (f != math.Trunc(f) || math.Abs(f) > 1<<53) {
			return 0, fmt.Errorf("%w: %v is not an integer", errPacked, f)
		}
		return int64(f), err
	default:
		return 0, fmt.Errorf("%w: byte %#x at %d is not an integer", errPacked, c, d.i-1)
	}
}

// str reads a string (str or bin).
func (d *msgpackReader) str() (string, error) {
	t, err := d.next(1)
	if err != nil {
		return "", err
	}
	var n uint64
	switch c := t[0]; {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = d.uint(1)
	case c == 0xda || c == 0xc5:
		n, err = d.uint(2)
	case c == 0xdb || c == 0xc6:
		n, err = d.uint(4)
	default:
		return "", fmt.Errorf("%w: byte %#x at %d is not a string", errPacked, c, d.i-1)
	}
	if err != nil {
		return "", err
	}
	if n > uint64(len(d.b)) {
		return "", fmt.Errorf("%w: truncated string at byte %d", errPacked, d.i)
	}
	return d.next(int(n))
}
