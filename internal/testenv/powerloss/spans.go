package powerloss

import "sort"

// span is the byte range [off, end) of a file.
type span struct{ off, end int64 }

// spans is a set of byte ranges kept sorted and merged: the parts of a file
// written since its last sync. The zero value is the empty set.
type spans []span

// add inserts [off, end), merging it with the ranges it touches or overlaps.
func (s spans) add(off, end int64) spans {
	if end <= off {
		return s
	}
	// The first range that ends at or after off can merge with the new one.
	i := sort.Search(len(s), func(i int) bool { return s[i].end >= off })
	j := i
	for j < len(s) && s[j].off <= end {
		off = min(off, s[j].off)
		end = max(end, s[j].end)
		j++
	}
	out := append(s[:i:i], span{off, end})
	return append(out, s[j:]...)
}

// bytes is the number of bytes the set covers.
func (s spans) bytes() int64 {
	var n int64
	for _, r := range s {
		n += r.end - r.off
	}
	return n
}
