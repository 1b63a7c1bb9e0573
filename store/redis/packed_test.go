package redis

import (
	"strings"
	"testing"
)

// TestDecodePackedRefusesGarbage: a string that is not a whole packed
// record (truncated, a length past its end, another version, trailing
// bytes past the origin, another value's type) is an error, never a panic or a record.
func TestDecodePackedRefusesGarbage(t *testing.T) {
	t.Parallel()
	good := "\x01\xa9in_flight\xa1t\xa1f\xcf\x00\x00\x01\x8c\x00\x00\x00\x00\xcf\x00\x00\x01\x8c\x00\x00\xea\x60\xa0"
	p, err := decodePacked(good)
	if err != nil || p.st != "in_flight" || p.tok != "t" || p.fp != "f" || p.le-p.cr != 60000 || p.resp != "" {
		t.Fatalf("decodePacked(good) = %+v, %v", p, err)
	}
	if p, err := decodePacked(good + "\xa2og"); err != nil || p.og != "og" || p.tok != "t" {
		t.Errorf("decodePacked(good with an origin) = %+v, %v; want origin \"og\"", p, err)
	}
	for name, in := range map[string]string{
		"empty":            "",
		"a plain string":   "a string",
		"version 2":        "\x02" + good[1:],
		"truncated":        good[:len(good)-3],
		"trailing":         good + "\x00",
		"two after":        good + "\xa1o\xa1p",
		"origin truncated": good + "\xa2o",
		"huge length":      "\x01\xdb\xff\xff\xff\xff",
		"string for int":   "\x01\xa9in_flight\xa1t\xa1f\xa1x" + good[len(good)-19:],
		"fraction":         "\x01\xa9in_flight\xa1t\xa1f\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00" + good[len(good)-10:],
		"int out of range": "\x01\xa9in_flight\xa1t\xa1f\xcf\xff\xff\xff\xff\xff\xff\xff\xff" + good[len(good)-10:],
	} {
		if p, err := decodePacked(in); err == nil {
			t.Errorf("%s: decodePacked(%q) = %+v, nil; want an error", name, in, p)
		} else if !strings.Contains(err.Error(), "not a packed record") {
			t.Errorf("%s: error %v does not wrap errPacked", name, err)
		}
	}
}
