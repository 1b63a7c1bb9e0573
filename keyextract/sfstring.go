package keyextract

import "strings"

// sfHeaderValue reads a header key's value as the IETF idempotency-key draft
// defines it: an RFC 8941 Structured Field String ("k-1") when it starts
// with a double quote, and the value as it is (a bare token, k-1)
// otherwise, so that "k-1" and k-1 are one key. The quoted form allows the
// escapes \" and \\ only, printable ASCII only, and nothing after the
// closing quote: no parameters ("k-1";x=1) and no second list member
// ("k-1", "k-2"). An empty string ("") is a missing key, as an empty
// value is. reason says what is malformed.
func sfHeaderValue(v string) (key string, reason string) {
	t := strings.Trim(v, " \t")
	if !strings.HasPrefix(t, `"`) {
		return v, ""
	}
	s, rest, reason := parseSFString(t)
	if reason != "" {
		return "", reason
	}
	switch {
	case rest == "":
		return s, ""
	case rest[0] == ';':
		return "", "the structured string has parameters (" + abbrev(rest) + "); a key takes none"
	case rest[0] == ',':
		return "", "the header holds a list of values, not one structured string"
	}
	return "", "data after the structured string's closing quote (" + abbrev(rest) + ")"
}

// parseSFString parses the sf-string at the start of t (RFC 8941 section
// 4.2.5) and returns it unescaped, with what follows the closing quote.
func parseSFString(t string) (s, rest, reason string) {
	var b strings.Builder
	for i := 1; i < len(t); i++ {
		switch c := t[i]; {
		case c == '\\':
			if i+1 >= len(t) {
				return "", "", "the structured string is not terminated (it ends in a backslash)"
			}
			i++
			if t[i] != '"' && t[i] != '\\' {
				return "", "", `the structured string holds an escape other than \" and \\`
			}
			b.WriteByte(t[i])
		case c == '"':
			return b.String(), t[i+1:], ""
		case c < 0x20 || c > 0x7e:
			return "", "", "the structured string holds a character that is not printable ASCII"
		default:
			b.WriteByte(c)
		}
	}
	return "", "", "the structured string is not terminated (no closing quote)"
}

// quoteSFString returns s, printable ASCII, as an RFC 8941 sf-string.
func quoteSFString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
