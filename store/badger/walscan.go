package badger

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// Reading a whole log: the records that follow on from one another, and
// damage told from a torn tail.
//
// The records of a log are a chain: each carries the sequence number after
// the one before it, across segments. Where the chain stops (a bad CRC, a
// length past the segment's end, a sequence number that skips, or a segment
// that ends), everything after it is searched for a record that proves the
// missing one was synced: a valid record with a higher sequence number
// whose durable mark (the highest sequence number synced when it was
// written) reaches the missing one. Found, the stop is damage (the disk
// lost or changed bytes that were on it). Not found, it is a torn tail:
// after a power loss the kernel may have written back later unsynced pages
// and not earlier ones, so valid records written after the last sync may
// follow a lost one; none of them was acknowledged as durable. A record of
// the previous format has no mark: one in a later segment than the stop
// proves it (a segment is synced whole before the next is written to), one
// in the same segment does not (as before).
//
// A missing record from before the checkpoint (durable in Badger) loses
// nothing: the proof must reach past it.
//
// The search follows valid frames by their length and, where none is, moves
// a byte at a time (zeros skipped at once). A frame found so is believed
// only if its sequence number could be there (at most one record per
// walHeader bytes between the stop and it): a frame inside a stored answer
// would have to guess the sequence number too.

// frameStatus is what frameAt found.
type frameStatus int

const (
	frameNone frameStatus = iota // a zero length, or no room for a frame: the segment ends
	frameBad                     // a length past the end, or a bad CRC
	frameOK
)

// walFrame is a frame read at some offset.
type walFrame struct {
	seq       uint64
	n         int64 // payload bytes
	synced    uint64
	hasSynced bool // the payload begins with a durable mark
}

// window reads a segment through a buffer of walWindow bytes.
type window struct {
	r    io.ReaderAt
	size int64
	buf  []byte
	base int64
}

const walWindow = 1 << 20

func newWindow(sf segmentFile) *window { return &window{r: sf.r, size: sf.size} }

// at returns the n bytes at off (a slice valid until the next call), or
// an error; off+n must not be past the end.
func (w *window) at(off int64, n int64) ([]byte, error) {
	if off >= w.base && off+n <= w.base+int64(len(w.buf)) {
		return w.buf[off-w.base : off-w.base+n], nil
	}
	if n > walWindow {
		b := make([]byte, n)
		if _, err := w.r.ReadAt(b, off); err != nil {
			return nil, err
		}
		return b, nil
	}
	l := min(int64(walWindow), w.size-off)
	if int64(cap(w.buf)) < l {
		w.buf = make([]byte, min(int64(walWindow), w.size))
	}
	w.buf = w.buf[:l]
	if _, err := w.r.ReadAt(w.buf, off); err != nil && err != io.EOF {
		w.buf = w.buf[:0]
		return nil, err
	}
	w.base = off
	return w.buf[:n], nil
}

// frameAt reads the frame at off.
func (w *window) frameAt(off int64) (walFrame, frameStatus, error) {
	var f walFrame
	if w.size-off < walHeader {
		return f, frameNone, nil
	}
	h, err := w.at(off, walHeader)
	if err != nil {
		return f, frameBad, err
	}
	n := int64(binary.LittleEndian.Uint32(h[0:4]))
	if n == 0 {
		return f, frameNone, nil
	}
	if n > w.size-off-walHeader {
		return f, frameBad, nil
	}
	sum := binary.LittleEndian.Uint32(h[4:8])
	f.seq, f.n = binary.LittleEndian.Uint64(h[8:16]), n
	rec, err := w.at(off+8, 8+n)
	if err != nil {
		return f, frameBad, err
	}
	if crc32.Checksum(rec, castagnoli) != sum {
		return f, frameBad, nil
	}
	f.synced, f.hasSynced = recordSynced(rec[8:])
	return f, frameOK, nil
}

// chainSpan is a run of chained records in one segment: [from, to), the
// first carrying sequence number first.
type chainSpan struct {
	seg      int
	from, to int64
	first    uint64
}

// logScan is what reading a whole log found.
type logScan struct {
	// spans are the chained records before the first damage, in order.
	spans []chainSpan
	// records counts them; last is the last one's sequence number (0:
	// none).
	records int
	last    uint64
	// damage lists the damaged places (the first is where the records
	// that can be replayed end).
	damage []Damage
	// damageSeg is the index of the first damage's segment, damageOff
	// where in it the chain stopped: what Quarantine keeps of it.
	damageSeg int
	damageOff int64
	// after counts the valid records after the first damage (not the
	// leftovers of a recycled segment).
	after int
	// maxSeq is the highest sequence number of a valid record in the
	// chain or proving damage.
	maxSeq uint64
}

// scanLog reads files, the log's segments in order, with applied the
// last sequence number durable in Badger (the checkpoint's, less one; 0:
// none or unknown).
func scanLog(files []segmentFile, applied uint64) (logScan, error) {
	var res logScan
	wins := make([]*window, len(files))
	for i, sf := range files {
		wins[i] = newWindow(sf)
	}
	// remaining is the log's bytes from (i, off) on.
	tail := make([]int64, len(files)+1)
	for i := len(files) - 1; i >= 0; i-- {
		tail[i] = tail[i+1] + files[i].size
	}
	remaining := func(i int, off int64) int64 { return tail[i] - off }

	s, started, damaged := uint64(0), false, false
	i, off := 0, int64(0)
	for i < len(files) {
		w := wins[i]
		from, first := off, s
		segEnded := false
		var breakSt frameStatus
		for {
			f, st, err := w.frameAt(off)
			if err != nil {
				return res, fmt.Errorf("read %s: %w", files[i].name, err)
			}
			if st == frameOK && (!started || f.seq == s) {
				if !started {
					started, s, first = true, f.seq, f.seq
				}
				s++
				res.maxSeq = max(res.maxSeq, f.seq)
				off += walHeader + f.n
				if !damaged {
					res.records++
					res.last = f.seq
				}
				continue
			}
			if st == frameNone || (st == frameOK && f.seq < s) {
				// The segment's records end (a zero length or end mark,
				// no room left, or a recycled segment's leftovers).
				segEnded = true
			}
			breakSt = st
			break
		}
		if !damaged && off > from {
			res.spans = append(res.spans, chainSpan{seg: i, from: from, to: off, first: first})
		}
		if !started {
			// No record yet: the first one needed is the one after those
			// Badger holds. A recycled spare's leftovers are older.
			s = applied + 1
		}
		thr := max(s, applied+1)
		if segEnded {
			// Only the rest of this segment can prove a record lost
			// here: the chain may go on in the next segment.
			pi, poff, pf, ok, err := findProof(files, wins, i, off, s, thr, i+1, remaining)
			if err != nil {
				return res, err
			}
			if !ok {
				i, off = i+1, 0
				continue
			}
			res.noteDamage(files, &damaged, i, off, s, fmt.Sprintf("the records stop (a zero length or an older record), but sequence %d at offset %d was written after sequence %d was synced", pf.seq, poff, thr))
			i, off, s, started = pi, poff, pf.seq, true
			continue
		}
		pi, poff, pf, ok, err := findProof(files, wins, i, off, s, thr, len(files), remaining)
		if err != nil {
			return res, err
		}
		if !ok {
			break // a torn tail: the log ends here
		}
		var detail string
		switch {
		case pi == i && poff == off:
			detail = fmt.Sprintf("records are missing: sequence %d where %d was due, written after sequence %d was synced", pf.seq, s, thr)
		case pi == i:
			detail = fmt.Sprintf("a bad record, followed by sequence %d at offset %d, written after sequence %d was synced", pf.seq, poff, thr)
		default:
			detail = fmt.Sprintf("a bad record, followed by sequence %d in %s at offset %d, written after sequence %d was synced", pf.seq, files[pi].name, poff, thr)
		}
		if breakSt == frameOK && !(pi == i && poff == off) {
			detail = fmt.Sprintf("records are missing: sequence %d where %d was due; ", frameSeq(wins[i], off), s) + detail
		}
		res.noteDamage(files, &damaged, i, off, s, detail)
		i, off, s, started = pi, poff, pf.seq, true
	}
	if damaged {
		res.after = countAfter(files, wins, res.damageSeg, res.damageOff, res.damage[0].Seq, remaining)
	}
	return res, nil
}

// frameSeq is the sequence number field of the frame at off.
func frameSeq(w *window, off int64) uint64 {
	h, err := w.at(off, walHeader)
	if err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(h[8:16])
}

func (res *logScan) noteDamage(files []segmentFile, damaged *bool, i int, off int64, s uint64, detail string) {
	if !*damaged {
		*damaged = true
		res.damageSeg, res.damageOff = i, off
	}
	res.damage = append(res.damage, Damage{Segment: files[i].name, Offset: off, Seq: s, Detail: detail})
}

// findProof searches the log from (i, off) to the end of segment endSeg-1
// for a valid record with a sequence number above s that proves every
// record up to thr was synced before it was written. It returns where it
// is and its frame.
func findProof(files []segmentFile, wins []*window, i int, off int64, s, thr uint64, endSeg int,
	remaining func(int, int64) int64) (int, int64, walFrame, bool, error) {
	for j := i; j < endSeg; j++ {
		pos := int64(0)
		if j == i {
			pos = off
		}
		var found walFrame
		var at int64
		var ok bool
		err := eachFrame(wins[j], pos, s, remaining(i, off), func(p int64, f walFrame) bool {
			if f.seq <= s {
				return true // a leftover, or the missing one's place: go on
			}
			proves := f.hasSynced && f.synced >= thr && f.synced < f.seq
			if !f.hasSynced && j > i && p == 0 {
				// The previous format: a later segment's first record
				// (not a recycled spare's leftover, never at its start).
				proves = f.seq >= thr
			}
			if proves {
				found, at, ok = f, p, true
				return false
			}
			return true
		})
		if err != nil {
			return 0, 0, walFrame{}, false, fmt.Errorf("read %s: %w", files[j].name, err)
		}
		if ok {
			return j, at, found, true, nil
		}
	}
	return 0, 0, walFrame{}, false, nil
}

// countAfter counts the valid records with a sequence number of s or more
// from (i, off) to the end of the log.
func countAfter(files []segmentFile, wins []*window, i int, off int64, s uint64, remaining func(int, int64) int64) int {
	n := 0
	for j := i; j < len(files); j++ {
		pos := int64(0)
		if j == i {
			pos = off
		}
		eachFrame(wins[j], pos, s, remaining(i, off), func(_ int64, f walFrame) bool {
			if f.seq >= s {
				n++
			}
			return true
		})
	}
	return n
}

// eachFrame calls fn with each valid frame of w from off on, in order,
// until fn returns false: a frame followed by the one after it, and where
// there is none, the next valid one a byte further on. A frame is believed
// only with a sequence number of at most s plus one per walHeader bytes of
// ahead (the log's bytes from where the search began).
func eachFrame(w *window, off int64, s uint64, ahead int64, fn func(off int64, f walFrame) bool) error {
	limit := s + uint64(ahead/walHeader) + 1
	for off+walHeader <= w.size {
		// Skip zeros: a frame's length is not zero.
		h, err := w.at(off, walHeader)
		if err != nil {
			return err
		}
		if h[0]|h[1]|h[2]|h[3] == 0 {
			q, err := nextNonZero(w, off+4)
			if err != nil {
				return err
			}
			off = max(off+1, q-3)
			continue
		}
		if seq := binary.LittleEndian.Uint64(h[8:16]); seq == 0 || seq > limit {
			off++
			continue
		}
		f, st, err := w.frameAt(off)
		if err != nil {
			return err
		}
		if st != frameOK {
			off++
			continue
		}
		if !fn(off, f) {
			return nil
		}
		off += walHeader + f.n
	}
	return nil
}

// nextNonZero returns the offset of the first byte at or after off that is
// not zero, or the segment's size.
func nextNonZero(w *window, off int64) (int64, error) {
	for off < w.size {
		n := min(int64(walWindow), w.size-off)
		b, err := w.at(off, n)
		if err != nil {
			return 0, err
		}
		for k, c := range b {
			if c != 0 {
				return off + int64(k), nil
			}
		}
		off += n
	}
	return w.size, nil
}
