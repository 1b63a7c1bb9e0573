package keyextract

import (
	"bufio"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the rules that make a key, and the fingerprint, read a
// JSON value as every mainstream decoder does: Go's encoding/json (into
// float64, json.Number or string), Python's json (int, float, str; Decimal
// with parse_float) and JavaScript's JSON.parse.

// maxSafeInteger is 2^53: up to it every integer is a float64, so float64
// decoders (JavaScript, Go's float64) and exact ones (Python's int, Go's
// int64 and json.Number) read an integer alike.
const maxSafeInteger = 1 << 53

// number reads a JSON number literal (valid JSON syntax). An accepted
// number's canonical form is the float64 it denotes as JavaScript prints it
// (Number.prototype.toString, RFC 8785: 4200, 0.1, 1e-7), so every spelling
// of one value (4200, 4.2e3, 4200.0, 42e2) has one form. A number that
// decoders read as different values is refused, with the reason in a few
// words:
//   - out of range of a float64 (1e400): JavaScript and Python read
//     Infinity, Go's float64 refuses it;
//   - negative zero (-0, -0.0): Python reads the integer 0, JavaScript and
//     floats keep -0;
//   - an integral value beyond ±2^53: Python's int and Go's int64 and
//     json.Number keep every digit, JavaScript and float64 round;
//   - more digits than a float64 holds (1.0000000000000001, 0.10000000000000001,
//     1e-400): float decoders round it to another number's value, exact
//     ones (Python's int and Decimal, Go's json.Number) keep it.
func number(lit string) (canon string, refused string) {
	if n := len(strings.TrimPrefix(lit, "-")); n > 0 && n <= 15 && plainInteger(lit) {
		// The common case: at most 15 digits, below 2^53, exact.
		if lit == "-0" {
			return "", "is negative zero, which Python reads as 0 and JavaScript as -0"
		}
		return lit, ""
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return "", "is out of the range of a 64-bit float: JavaScript and Python read infinity, Go refuses it"
	}
	neg, digits, point, long := decimal(lit)
	if digits.n == 0 { // zero, however written
		if neg {
			return "", "is negative zero, which Python reads as 0 and JavaScript as -0"
		}
		return "0", ""
	}
	if f == math.Trunc(f) && math.Abs(f) > maxSafeInteger {
		return "", "is an integer beyond ±2^53 (9007199254740992): JavaScript and 64-bit floats round it, Python and Go's int64 do not"
	}
	var buf [32]byte
	_, sdigits, spoint, _ := decimal(strconv.AppendFloat(buf[:0], f, 'e', -1, 64))
	if long || digits != sdigits || point != spoint {
		return "", "has more digits than a 64-bit float holds: JavaScript and floats read " + es6(f) + ", exact decoders (Python's int and Decimal, Go's json.Number) do not"
	}
	return es6(f), ""
}

// abbrev shortens s for an error message.
func abbrev(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// plainInteger reports whether lit is an optional '-' and digits only.
func plainInteger(lit string) bool {
	i := 0
	if lit[0] == '-' {
		i = 1
	}
	if i == len(lit) {
		return false
	}
	for ; i < len(lit); i++ {
		if lit[i] < '0' || lit[i] > '9' {
			return false
		}
	}
	return true
}

// digits are a number's significant digits, at most 24 of them.
type digits struct {
	buf [24]byte
	n   int
}

// decimal reads a number literal (JSON syntax, or strconv's 'e' format) as
// 0.digits × 10^point, digits without leading or trailing zeros (none for
// zero). long reports more than 24 significant digits, which no float64's
// shortest form has; d then holds only the first 24.
func decimal[T string | []byte](lit T) (neg bool, d digits, point int, long bool) {
	buf := &d.buf
	n, zeros := 0, 0 // zeros: seen after a non-zero digit, not yet written
	first := -1      // index among the mantissa's digits of the first non-zero one
	idx, intDigits := 0, 0
	inFrac := false
	i := 0
	if i < len(lit) && lit[i] == '-' {
		neg = true
		i++
	}
	for ; i < len(lit); i++ {
		c := lit[i]
		if c == '.' {
			inFrac = true
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		if !inFrac {
			intDigits++
		}
		idx++
		if c == '0' {
			if first >= 0 {
				zeros++
			}
			continue
		}
		if first < 0 {
			first = idx - 1
		}
		for ; zeros > 0; zeros-- {
			if n < len(buf) {
				buf[n] = '0'
				n++
			} else {
				long = true
			}
		}
		if n < len(buf) {
			buf[n] = c
			n++
		} else {
			long = true
		}
	}
	d.n = n
	if first < 0 {
		return neg, digits{}, 0, false
	}
	point = intDigits - first
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		eneg := false
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			eneg = lit[i] == '-'
			i++
		}
		e := 0
		for ; i < len(lit) && lit[i] >= '0' && lit[i] <= '9'; i++ {
			if e < 1e9 { // saturated: such a value is infinite or zero anyway
				e = e*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			e = -e
		}
		point += e
	}
	return neg, d, point, long
}

// es6 formats f as JavaScript's Number.prototype.toString does (and
// encoding/json, and RFC 8785).
func es6(f float64) string {
	var buf [32]byte
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b := strconv.AppendFloat(buf[:0], f, format, -1, 64)
	if format == 'e' {
		// 1e-07 as 1e-7
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return string(b)
}

// loneSurrogate returns the first lone UTF-16 surrogate escaped in raw, a
// JSON string literal with its quotes (\udc00, or \ud800 not followed by
// a low surrogate's escape), and whether there is one. Go's encoding/json
// reads each as U+FFFD; JavaScript and Python keep it, so "\udc00" and
// "\udc01" are one value to Go and two to them.
func loneSurrogate(raw string) (rune, bool) {
	for i := strings.IndexByte(raw, '\\'); i >= 0 && i < len(raw); {
		if raw[i] != '\\' {
			i++
			continue
		}
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i += 2
			continue
		}
		r := hex4(raw, i+2)
		i += 6
		if !utf16.IsSurrogate(r) {
			continue
		}
		if r < 0xdc00 && i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
			if r2 := hex4(raw, i+2); r2 >= 0xdc00 && r2 < 0xe000 {
				i += 6
				continue
			}
		}
		return r, true
	}
	return 0, false
}

// hex4 reads the four hex digits at raw[i:] (-1 if there are not four).
func hex4(raw string, i int) rune {
	if i+4 > len(raw) {
		return -1
	}
	v, err := strconv.ParseUint(raw[i:i+4], 16, 16)
	if err != nil {
		return -1
	}
	return rune(v)
}

// decodeKeeping decodes raw, a valid JSON string literal with its quotes,
// as encoding/json does (each byte that is not valid UTF-8 as U+FFFD),
// except that a lone surrogate is kept, in the 3-byte form UTF-8 would give
// it (WTF-8: ED A0-BF xx), which a Go string can hold.
func decodeKeeping(raw string) string {
	s := raw[1 : len(raw)-1]
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			r, size := utf8.DecodeRuneInString(s[i:])
			b = utf8.AppendRune(b, r) // U+FFFD for a bad byte
			i += size
			continue
		}
		switch s[i+1] {
		case 'u':
			r := hex4(s, i+2)
			i += 6
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if r2 := hex4(s, i+2); r2 >= 0xdc00 && r2 < 0xe000 {
						b = utf8.AppendRune(b, utf16.DecodeRune(r, r2))
						i += 6
						continue
					}
				}
				b = append(b, 0xed, 0xa0|byte(r>>6&0x1f), 0x80|byte(r&0x3f))
				continue
			}
			b = utf8.AppendRune(b, r)
			continue
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		default: // " \ /
			b = append(b, s[i+1])
		}
		i += 2
	}
	return string(b)
}

// surrogateAt returns the surrogate whose WTF-8 form starts at s[i], if one
// does.
func surrogateAt(s string, i int) (rune, bool) {
	if i+2 < len(s) && s[i] == 0xed && s[i+1] >= 0xa0 && s[i+1] <= 0xbf && s[i+2]&0xc0 == 0x80 {
		return 0xd000 | rune(s[i+1]&0x3f)<<6 | rune(s[i+2]&0x3f), true
	}
	return 0, false
}

// goView is s (from decodeKeeping) as encoding/json reads it: each lone
// surrogate as U+FFFD.
func goView(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if _, ok := surrogateAt(s, i); ok {
			b.WriteRune(utf8.RuneError)
			i += 3
			continue
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

// writeKeeping writes s (from decodeKeeping) as a JSON string, as
// writeString does, each lone surrogate as its escape (\udc00).
func writeKeeping(w *bufio.Writer, s string) {
	w.WriteByte('"')
	start := 0
	flush := func(end int) {
		if start < end {
			b, _ := json.Marshal(s[start:end]) // valid UTF-8 between surrogates
			w.Write(b[1 : len(b)-1])
		}
	}
	for i := 0; i < len(s); {
		r, ok := surrogateAt(s, i)
		if !ok {
			i++
			continue
		}
		flush(i)
		const hex = "0123456789abcdef"
		w.WriteString(`\u`)
		w.WriteByte(hex[r>>12&0xf])
		w.WriteByte(hex[r>>8&0xf])
		w.WriteByte(hex[r>>4&0xf])
		w.WriteByte(hex[r&0xf])
		i += 3
		start = i
	}
	flush(len(s))
	w.WriteByte('"')
}
