package badger

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
)

// The reservation log.
//
// With SyncWrites, Badger runs unsynced and the store keeps a log of its
// own in front of it (a write-ahead log, in <dir>/idemproxy-wal/): after
// the writer commits a batch's transaction, it appends every mutation of
// the batch (sets with their value, UserMeta and expiry; deletes) to the
// log as one record, and when the batch holds a write that must be durable
// (a reservation) it fdatasyncs the log before answering. That is one
// fdatasync of a few hundred bytes, where Badger's own sync (DB.Sync)
// msyncs its memtable log and value-log mappings, a full fsync with a
// journal commit on ext4. A later fdatasync covers the unsynced records
// before it: the log is appended to in order.
//
// Replaying the mutations in commit order reproduces the store: on open,
// the log is replayed into Badger before anything is served, and Badger is
// then made durable and the log emptied (a checkpoint). While the store
// runs, a checkpoint every walCheckpointEvery (when anything was written)
// and whenever a segment fills does the same in the background: under the
// writer's exclusive lock the active segment is synced and a new one
// begun, so that the older segments hold everything Badger committed so
// far; then Badger is made durable (an fsync of every memtable log and
// value-log file, and of the directory: syncBadger), the sequence number of
// the oldest record still needed written to <log>/checkpoint (fsynced,
// renamed into place), and only then are the older segments deleted.
//
// Replay by sequence, key by key. Every record a batch writes carries the
// sequence number of the batch's log record (record.LogSeq, stamped by
// putAt), and a replay does not write a log entry over a record that a
// later batch wrote: Badger's files may reach the disk past the log's
// synced tail (the kernel writes mapped pages back when it likes; a power
// cut then keeps Badger's newer state and loses the log's unsynced
// records), and an older reservation must never be written over its
// commit. Badger's state after a cut is not a prefix of its writes (each
// memtable has a log of its own, a table's value pointers name value-log
// data that is synced apart), so nothing Badger holds says "everything
// before this is here": whatever the key's record cannot show (a key
// Badger lost, a value it cannot read) is written from the log, and only
// the checkpoint file (below), written after Badger was synced, says which
// records need no replay. A released key leaves no record to compare
// with: an older reservation of it comes back, in doubt (never forwarded
// again), when its release was not synced. Each batch's transaction also
// sets appliedKey (Badger only, never logged) to its sequence number, so
// that numbers go on across opens: the log an open starts begins after
// the last record replayed, the log's highest and Badger's applied number.
//
// The log is a sequence of segments, files named by a number that grows,
// each created zeroed at its full size and fsynced (file and directory)
// before it is used: appends never change a segment's size nor allocate its
// blocks, so fdatasync writes the data only. A record is framed as
//
//	length  uint32, little-endian: of the payload
//	crc     uint32, little-endian: CRC-32C of the sequence number and payload
//	seq     uint64, little-endian: one more than the record before it
//	payload the record's entries (walRecorder)
//
// and its payload begins with a durable mark (walMark, then 8 bytes,
// little-endian): the highest sequence number fdatasynced when the record
// was written. Records written before the mark was added (by an earlier
// release) have none, and still replay; an earlier release cannot read a
// log with marks (it refuses the unknown entry kind).
//
// Reading the log (walscan.go) follows the records from one to the next
// (by sequence number, across segments) until one fails: a zero length, a
// length past the segment's end, a bad CRC, a sequence number out of
// order. What follows is then searched for a record written after the
// failed one was synced (its durable mark reaching it): found, the log is
// damaged (bytes that were on disk changed or went missing), and the store
// refuses to open with errLogDamaged, naming the segment, offset and
// sequence number, changing nothing; not found, it is a torn tail, written
// but never synced, and the records before it are replayed. Valid records
// may well follow a torn one: after a power loss the kernel may have
// written back later unsynced pages and not an earlier one. A segment
// whose records Badger holds is recycled as the next spare rather than
// deleted: its first record zeroed, renamed, synced. Its older records
// stay: their sequence numbers are lower, and their marks prove nothing
// about the new ones, so they never read as damage. A segment is ended by
// a zero frame when the log moves on from it, and synced whole before the
// next one is written to. A record of the previous format has no mark: a
// failed record followed by a later segment that begins with a valid one
// is damage, as before.

// walDirName is the log's directory, inside the store's.
const walDirName = "idemproxy-wal"

// walSegmentSize is the size of a segment (a variable for tests). A record
// larger than a segment (one huge stored answer) gets a segment of its own,
// sized to fit.
var walSegmentSize int64 = 16 << 20

// walBatchBytes bounds the log bytes of one batch: a batch that would hold
// more is split (as one Badger refuses as too big).
const walBatchBytes = 4 << 20

// walCheckpointEvery is how often the log is checkpointed when anything was
// written since the last checkpoint.
const walCheckpointEvery = 30 * time.Second

// walHeader is the size of a record's frame before its payload.
const walHeader = 16

// Entry kinds in a record's payload. walMark, first in a record's payload
// only, is followed by the durable mark: 8 bytes, little-endian, the
// highest sequence number synced when the record was written (records of
// the previous format have none).
const (
	walSet    byte = 1
	walDelete byte = 2
	walMark   byte = 3
)

// walMarkSize is the bytes of a durable mark, its kind included.
const walMarkSize = 9

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// walRecorder collects the mutations of one transaction as a record's
// payload, behind room for its frame. The writer owns one and resets it
// for each transaction, so the mutations of a discarded transaction are
// dropped with it.
type walRecorder struct {
	buf     []byte // walHeader bytes of frame, then the payload
	entries int
}

func (r *walRecorder) reset() {
	if cap(r.buf) > 2*walBatchBytes {
		r.buf = nil // a huge answer's record: do not keep its buffer
	}
	var frame [walHeader + walMarkSize]byte
	frame[walHeader] = walMark
	r.buf = append(r.buf[:0], frame[:]...)
	r.entries = 0
}

// size is the bytes of the record so far, frame included.
func (r *walRecorder) size() int { return len(r.buf) }

func (r *walRecorder) set(k, v []byte, meta byte, expiresAt uint64) {
	r.buf = append(r.buf, walSet)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(k)))
	r.buf = append(r.buf, k...)
	r.buf = append(r.buf, meta)
	r.buf = binary.AppendUvarint(r.buf, expiresAt)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(v)))
	r.buf = append(r.buf, v...)
	r.entries++
}

func (r *walRecorder) del(k []byte) {
	r.buf = append(r.buf, walDelete)
	r.buf = binary.AppendUvarint(r.buf, uint64(len(k)))
	r.buf = append(r.buf, k...)
	r.entries++
}

// frame fills in the frame of the record for sequence number seq, and its
// durable mark, synced, and returns the whole record.
func (r *walRecorder) frame(seq, synced uint64) []byte {
	binary.LittleEndian.PutUint64(r.buf[walHeader+1:walHeader+walMarkSize], synced)
	return frameRecord(r.buf, seq)
}

// recordSynced returns the durable mark of a record's payload, if it has
// one.
func recordSynced(payload []byte) (uint64, bool) {
	if len(payload) < walMarkSize || payload[0] != walMark {
		return 0, false
	}
	return binary.LittleEndian.Uint64(payload[1:walMarkSize]), true
}

// frameRecord fills in the first walHeader bytes of rec, whose payload
// follows them, and returns rec.
func frameRecord(rec []byte, seq uint64) []byte {
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(rec)-walHeader))
	binary.LittleEndian.PutUint64(rec[8:16], seq)
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[8:], castagnoli))
	return rec
}

// walEntry is one decoded mutation.
type walEntry struct {
	kind      byte
	key, val  []byte
	meta      byte
	expiresAt uint64
}

// errBadPayload is returned for a record whose CRC holds but whose payload
// does not decode: written so by a bug, not torn.
var errBadPayload = errors.New("undecodable record payload")

// decodeRecord calls fn with each entry of payload, in order. The slices
// point into payload.
func decodeRecord(payload []byte, fn func(e walEntry) error) error {
	if len(payload) > 0 && payload[0] == walMark {
		if len(payload) < walMarkSize {
			return errBadPayload
		}
		payload = payload[walMarkSize:]
	}
	for len(payload) > 0 {
		var e walEntry
		e.kind = payload[0]
		payload = payload[1:]
		var ok bool
		if e.key, payload, ok = walBytes(payload); !ok {
			return errBadPayload
		}
		switch e.kind {
		case walDelete:
		case walSet:
			if len(payload) < 1 {
				return errBadPayload
			}
			e.meta = payload[0]
			payload = payload[1:]
			exp, n := binary.Uvarint(payload)
			if n <= 0 {
				return errBadPayload
			}
			e.expiresAt, payload = exp, payload[n:]
			if e.val, payload, ok = walBytes(payload); !ok {
				return errBadPayload
			}
		default:
			return errBadPayload
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// walBytes reads a uvarint length and that many bytes.
func walBytes(p []byte) (b, rest []byte, ok bool) {
	n, w := binary.Uvarint(p)
	if w <= 0 || n > uint64(len(p)-w) {
		return nil, p, false
	}
	return p[w : w+int(n)], p[w+int(n):], true
}

// walStop is why reading a segment stopped.
type walStop int

const (
	stopEnd  walStop = iota // a zero length, or no room for a frame: nothing follows
	stopTorn                // a frame past the end, a bad CRC or sequence number
)

// scanSegment reads the records of data, a segment's bytes, the first
// expected to carry sequence number seq, and calls fn with each payload.
// It returns the sequence number after the last record read, the offset
// after it, and why it stopped; an error only from fn.
func scanSegment(data []byte, seq uint64, fn func(seq uint64, payload []byte) error) (next uint64, end int, why walStop, err error) {
	next, end64, why, err := scanReader(bytes.NewReader(data), int64(len(data)), seq, fn)
	return next, int(end64), why, err
}

// scanReader is scanSegment reading size bytes from r, a record at a time
// (replay does not hold a whole segment in memory). The payload passed to
// fn is reused for the next record. Its error is fn's or r's.
func scanReader(r io.ReaderAt, size int64, seq uint64, fn func(seq uint64, payload []byte) error) (next uint64, end int64, why walStop, err error) {
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10)
	var rec []byte // seq and payload
	var h [walHeader]byte
	off := int64(0)
	for {
		if size-off < walHeader {
			return seq, off, stopEnd, nil
		}
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return seq, off, stopTorn, err
		}
		n := binary.LittleEndian.Uint32(h[0:4])
		if n == 0 {
			return seq, off, stopEnd, nil
		}
		if int64(n) > size-off-walHeader {
			return seq, off, stopTorn, nil
		}
		if cap(rec) < 8+int(n) {
			rec = make([]byte, 8+int(n))
		}
		rec = rec[:8+int(n)]
		copy(rec, h[8:16])
		if _, err := io.ReadFull(br, rec[8:]); err != nil {
			return seq, off, stopTorn, err
		}
		if crc32.Checksum(rec, castagnoli) != binary.LittleEndian.Uint32(h[4:8]) {
			return seq, off, stopTorn, nil
		}
		if got := binary.LittleEndian.Uint64(h[8:16]); got != seq {
			if got < seq {
				// A record of the segment's earlier use (recycled):
				// the new records end here.
				return seq, off, stopEnd, nil
			}
			return seq, off, stopTorn, nil
		}
		if fn != nil {
			if err := fn(seq, rec[8:]); err != nil {
				return seq, off, stopTorn, err
			}
		}
		seq++
		off += walHeader + int64(n)
	}
}

// firstSeq returns the sequence number of data's first record, if its
// frame and CRC hold.
func firstSeq(data []byte) (uint64, bool) {
	return firstSeqAt(bytes.NewReader(data), int64(len(data)))
}

// firstSeqAt is firstSeq of the size bytes of r.
func firstSeqAt(r io.ReaderAt, size int64) (seq uint64, ok bool) {
	var h [walHeader]byte
	if size < walHeader {
		return 0, false
	}
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return 0, false
	}
	n := binary.LittleEndian.Uint32(h[0:4])
	if n == 0 || int64(n) > size-walHeader {
		return 0, false
	}
	rec := make([]byte, 8+int(n))
	copy(rec, h[8:16])
	if _, err := r.ReadAt(rec[8:], walHeader); err != nil {
		return 0, false
	}
	if crc32.Checksum(rec, castagnoli) != binary.LittleEndian.Uint32(h[4:8]) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(h[8:16]), true
}

// segment is one file of the log.
type segment struct {
	f    *os.File
	path string
	num  uint64
	size int64
	off  int64 // where the next record goes
}

// wal is the reservation log of an open store. append and sync are called
// by the writer; cut, drop and prepare by the checkpointer (cut under the
// writer's exclusive lock, which the writer holds around append and sync).
type wal struct {
	dir string

	prepMu sync.Mutex // held by prepare
	ckptMu sync.Mutex // held by a checkpoint (Store.checkpoint): one at a time

	mu    sync.Mutex // guards segs, spare and nextNum
	segs  []*segment // oldest first; the last is the active one
	spare *segment   // a zeroed segment ready to become the active one
	// nextNum is the number of the next segment created.
	nextNum uint64
	// recycled counts the segments recycled as spares.
	recycled uint64

	// Used by the writer, under exclusive.
	seq      uint64 // the next record's sequence number
	synced   uint64 // the highest sequence number fdatasynced (the durable mark)
	unsynced bool   // the active segment has records not fdatasynced
	records  bool   // the active segment has records
	broken   error  // a write or sync failed: the log is not trusted again

	// full is signalled (without blocking) when a segment filled, to wake
	// the checkpointer; half when the active one is half full, so that a
	// spare is ready before it fills (halfSaid: said for the active one).
	full     chan struct{}
	half     chan struct{}
	halfSaid bool
}

// segmentName is the file name of segment num.
func segmentName(num uint64) string { return fmt.Sprintf("%016x.wal", num) }

// walSegments lists the segments in dir, by number.
func walSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var nums []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".wal")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		n, err := strconv.ParseUint(name, 16, 64)
		if err != nil {
			continue
		}
		nums = append(nums, n)
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	return nums, nil
}

// appliedKey holds, in Badger, the sequence number of the last log record
// whose batch Badger applied: every batch's transaction sets it to the
// sequence number its record gets (the writer), and a replay to the last
// record it applied. It only keeps sequence numbers going on across opens:
// after a power cut Badger may hold it without the writes before it, so
// nothing is skipped for it. It is written to Badger only, never to the log. It
// begins with a zero byte (List passes it by) and carries UserMeta
// metaApplied, which no scan for records selects.
const appliedKey = "\x00walseq"

// metaApplied is the UserMeta of appliedKey.
const metaApplied byte = 6

// appliedKeyBytes is appliedKey, for entries (Badger copies keys).
var appliedKeyBytes = []byte(appliedKey)

// appliedEntry is the entry that sets appliedKey to seq.
func appliedEntry(seq uint64) *bdg.Entry {
	e := new(bdg.Entry)
	setApplied(e, make([]byte, 8), seq)
	return e
}

// setApplied makes e the entry that sets appliedKey to seq, its value in
// buf (8 bytes). The writer reuses one entry and buffer: Badger holds
// neither once the transaction is committed or discarded.
func setApplied(e *bdg.Entry, buf []byte, seq uint64) {
	binary.BigEndian.PutUint64(buf, seq)
	*e = bdg.Entry{Key: appliedKeyBytes, Value: buf[:8], UserMeta: metaApplied}
}

// readApplied returns the sequence number appliedKey holds; 0 when none.
func readApplied(txn getter) (uint64, error) {
	item, err := txn.Get([]byte(appliedKey))
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var seq uint64
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("the applied sequence number is %d bytes, want 8", len(v))
		}
		seq = binary.BigEndian.Uint64(v)
		return nil
	})
	return seq, err
}

// replayWAL applies the log in dir (if any) to db in commit order, the
// records after the checkpoint, each entry unless its key holds a record a
// later batch wrote (replayer.apply), makes db durable, and deletes the
// log's segments. It returns
// the number of records applied, the number the next segment should have
// and the sequence number the next record should carry (after both what
// Badger holds and the log). A damaged log (walscan.go) is refused with an
// error wrapping errLogDamaged that names the segment, offset and sequence
// number, and everything is left as it was.
func replayWAL(db *bdg.DB, dbDir, dir string, now time.Time) (records int, nextNum, nextSeq uint64, err error) {
	var applied uint64
	if err := db.View(func(txn *bdg.Txn) error {
		var err error
		applied, err = readApplied(txn)
		return err
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("read the applied sequence number: %w", err)
	}
	// Only the checkpoint says what Badger holds durably: its applied
	// number may have reached the disk in a memtable log or table whose
	// older writes (another memtable's tail, the value-log data its
	// pointers name) did not.
	var floor uint64
	if c := readCheckpoint(dir); c > 0 {
		floor = c - 1
	}
	nums, err := walSegments(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, max(floor, applied) + 1, nil
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read the reservation log: %w", err)
	}
	if len(nums) == 0 {
		return 0, 0, max(floor, applied) + 1, nil
	}
	nextNum = nums[len(nums)-1] + 1
	files, closeAll, err := openSegments(dir, nums)
	if err != nil {
		return 0, 0, 0, err
	}
	defer closeAll()
	scan, err := scanLog(files, floor)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read the reservation log: %w", err)
	}
	if len(scan.damage) > 0 {
		return 0, 0, 0, damageError(scan.damage[0])
	}
	ap := newReplayer(db, now)
	last := applied
	for _, sp := range scan.spans {
		sf := files[sp.seg]
		_, _, _, err := scanReader(io.NewSectionReader(sf.r, sp.from, sp.to-sp.from), sp.to-sp.from, sp.first, func(seq uint64, payload []byte) error {
			if seq <= floor {
				return nil // before the checkpoint: durable in Badger
			}
			records++
			last = max(last, seq)
			if err := decodeRecord(payload, func(e walEntry) error { return ap.apply(seq, e) }); err != nil {
				return fmt.Errorf("replay %s: %w", sf.name, err)
			}
			return nil
		})
		if err != nil {
			ap.discard()
			return 0, 0, 0, fmt.Errorf("replay the reservation log: %w", err)
		}
	}
	if last > applied {
		if err := ap.setApplied(last); err != nil {
			ap.discard()
			return 0, 0, 0, fmt.Errorf("replay the reservation log: %w", err)
		}
	}
	if err := ap.flush(); err != nil {
		return 0, 0, 0, fmt.Errorf("replay the reservation log: %w", err)
	}
	if err := syncBadger(dbDir); err != nil {
		return 0, 0, 0, fmt.Errorf("replay the reservation log: %w", err)
	}
	nextSeq = max(last, scan.maxSeq, floor) + 1
	if err := writeCheckpoint(dir, nextSeq); err != nil {
		return 0, 0, 0, err
	}
	for _, n := range nums {
		if err := os.Remove(filepath.Join(dir, segmentName(n))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, 0, 0, fmt.Errorf("remove a replayed reservation log segment: %w", err)
		}
	}
	if err := syncDir(dir); err != nil {
		return 0, 0, 0, fmt.Errorf("replay the reservation log: %w", err)
	}
	return records, nextNum, nextSeq, nil
}

// walCheckpointName is the file, in the log's directory, that holds the
// sequence number of the oldest record the log still needs: every record
// before it is durable in Badger. A checkpoint writes it after syncing
// Badger and before deleting the segments it emptied, a replay after its
// sync. Replay, Check and Quarantine judge the log with it: the records
// before it need no replay, and damage among them loses nothing.
const walCheckpointName = "checkpoint"

// writeCheckpoint records seq as the oldest record the log in dir needs:
// written to a temporary file, fsynced, renamed over the old one, the
// directory fsynced.
func writeCheckpoint(dir string, seq uint64) error {
	tmp := filepath.Join(dir, walCheckpointName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%d\n", seq)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, walCheckpointName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("record the reservation log's checkpoint: %w", err)
	}
	return nil
}

// readCheckpoint returns the sequence number writeCheckpoint recorded in
// dir; 0 when there is none (a log of the previous format) or it does not
// read.
func readCheckpoint(dir string) uint64 {
	b, err := os.ReadFile(filepath.Join(dir, walCheckpointName))
	if err != nil {
		return 0
	}
	seq, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return seq
}

// damageError is Open's error for damage d.
func damageError(d Damage) error {
	return fmt.Errorf("%w: segment %s, offset %d, sequence %d: %s; synced writes would be lost, refusing to open (idemproxy store check reports the damage, idemproxy store quarantine moves the damaged segments aside)",
		errLogDamaged, d.Segment, d.Offset, d.Seq, d.Detail)
}

// openSegments opens the segments nums of dir for reading; closeAll closes
// them.
func openSegments(dir string, nums []uint64) (files []segmentFile, closeAll func(), err error) {
	var opened []*os.File
	closeAll = func() {
		for _, f := range opened {
			f.Close()
		}
	}
	for _, n := range nums {
		name := filepath.Join(dir, segmentName(n))
		f, err := os.Open(name)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("read the reservation log: %w", err)
		}
		opened = append(opened, f)
		fi, err := f.Stat()
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("read the reservation log: %w", err)
		}
		files = append(files, segmentFile{name: name, r: f, size: fi.Size()})
	}
	return files, closeAll, nil
}

// segmentFile is a segment being read.
type segmentFile struct {
	name string
	r    io.ReaderAt
	size int64
}

// replayer applies decoded entries to Badger in transactions as large as
// Badger takes.
type replayer struct {
	db  *bdg.DB
	now uint64
	txn *bdg.Txn
}

func newReplayer(db *bdg.DB, now time.Time) *replayer {
	return &replayer{db: db, now: uint64(now.Unix())}
}

// apply applies e, an entry of the log record with sequence number seq,
// unless its key holds a record a later batch wrote (recordLogSeq): Badger's
// files may hold writes the log lost (its unsynced tail), and an older
// reservation must not be written over its commit or release. Whatever
// Badger cannot show (a key it lost, a value it cannot read) is written
// from the log. Keys that are not records (they begin with a zero byte)
// are written as the log says.
func (r *replayer) apply(seq uint64, e walEntry) error {
	if r.txn == nil {
		r.txn = r.db.NewTransaction(true)
	}
	if len(e.key) > 0 && e.key[0] != 0 {
		if held, err := r.heldSeq(e.key); err != nil {
			return err
		} else if held > seq {
			return nil
		}
	}
	// An expired set is applied as a delete: an older version that Badger
	// may still hold must not come back.
	isDelete := e.kind == walDelete || (e.expiresAt != 0 && e.expiresAt <= r.now)
	set := func() error {
		k := append([]byte(nil), e.key...)
		if isDelete {
			return r.txn.Delete(k)
		}
		ne := bdg.NewEntry(k, append([]byte(nil), e.val...)).WithMeta(e.meta)
		ne.ExpiresAt = e.expiresAt
		return r.txn.SetEntry(ne)
	}
	err := set()
	if errors.Is(err, bdg.ErrTxnTooBig) {
		err = r.txn.Commit()
		r.txn = r.db.NewTransaction(true)
		if err != nil {
			return err
		}
		err = set()
	}
	return err
}

// heldSeq returns the log sequence number of the record Badger holds under
// key, as the replay's transaction sees it (with what it applied): 0 when
// there is none, it has none, or its value cannot be read (a value-log
// file whose data a power cut took).
func (r *replayer) heldSeq(key []byte) (uint64, error) {
	item, err := r.txn.Get(key)
	if errors.Is(err, bdg.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var seq uint64
	if err := item.Value(func(v []byte) error {
		seq = recordLogSeq(v)
		return nil
	}); err != nil {
		return 0, nil
	}
	return seq, nil
}

// setApplied sets appliedKey to seq, in the replay's last transaction.
func (r *replayer) setApplied(seq uint64) error {
	if r.txn == nil {
		r.txn = r.db.NewTransaction(true)
	}
	err := r.txn.SetEntry(appliedEntry(seq))
	if errors.Is(err, bdg.ErrTxnTooBig) {
		if err = r.txn.Commit(); err != nil {
			r.txn = nil
			return err
		}
		r.txn = r.db.NewTransaction(true)
		err = r.txn.SetEntry(appliedEntry(seq))
	}
	return err
}

func (r *replayer) flush() error {
	if r.txn == nil {
		return nil
	}
	err := r.txn.Commit()
	r.txn = nil
	return err
}

func (r *replayer) discard() {
	if r.txn != nil {
		r.txn.Discard()
		r.txn = nil
	}
}

// syncBadger makes everything Badger committed so far durable: every
// memtable log (*.mem: the active one and those waiting to be flushed)
// and value-log file (*.vlog) is fsynced, then the directory. Badger
// writes both through shared mappings, and an fsync writes a mapping's
// dirty pages back as msync(MS_SYNC) does. A file removed meanwhile was
// flushed into a table (synced by Badger) or collected.
//
// DB.Sync is not called: it takes Badger's lock and then reads the active
// memtable, which is nil once Badger failed to create the next one (out
// of file descriptors or of disk), and the panic leaves the lock taken:
// the store's Close, and so the Guard's reopen, then wait for ever
// (TestCheckpointAfterAFailedRotation).
func syncBadger(dir string) error {
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return err
		}
		for _, name := range files {
			if err := syncFile(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("sync badger: %w", err)
			}
		}
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("sync badger: %w", err)
	}
	return nil
}

func syncFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// openWAL starts an empty log in dir, its segments numbered from nextNum,
// its sequence numbers from seq (after those of the log replayed and of
// Badger's applied record, which is durable, and so everything before
// seq: replayWAL). Sequence numbers go on across opens: a replay skips
// the records whose number Badger holds.
func openWAL(dir string, nextNum, seq uint64) (*wal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the reservation log: %w", err)
	}
	// The log's directory entry is durable before anything is acknowledged
	// from it: a segment's fsync and its directory's do not make the
	// directory itself a durable name in the store's (a power cut would
	// take the whole log).
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return nil, fmt.Errorf("create the reservation log: %w", err)
	}
	seq = max(seq, 1)
	l := &wal{dir: dir, nextNum: nextNum, seq: seq, synced: seq - 1, full: make(chan struct{}, 1), half: make(chan struct{}, 1)}
	seg, err := l.create(walSegmentSize)
	if err != nil {
		return nil, err
	}
	l.segs = []*segment{seg}
	return l, nil
}

// create makes the next segment, of size bytes: written with zeros and
// fsynced, and its directory entry fsynced.
func (l *wal) create(size int64) (*segment, error) {
	l.mu.Lock()
	num := l.nextNum
	l.nextNum++
	l.mu.Unlock()
	path := filepath.Join(l.dir, segmentName(num))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create reservation log segment: %w", err)
	}
	fail := func(err error) (*segment, error) {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("create reservation log segment %s: %w", path, err)
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fail(err)
		}
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := syncDir(l.dir); err != nil {
		return fail(err)
	}
	return &segment{f: f, path: path, num: num, size: size}, nil
}

// append writes the record in r as the next one, in the active segment or,
// when it does not fit there, in a new one (the active one synced first).
// A failed write breaks the log: every later append and sync fails, as its
// tail is unknown.
func (l *wal) append(r *walRecorder) error {
	if l.broken != nil {
		return l.broken
	}
	act := l.active()
	if need := int64(r.size()); act.off+need > act.size {
		var err error
		if act, err = l.rotate(need); err != nil {
			return err
		}
	}
	rec := r.frame(l.seq, l.synced) // after a rotation, which syncs
	if _, err := act.f.WriteAt(rec, act.off); err != nil {
		l.broken = fmt.Errorf("write the reservation log: %w", err)
		return l.broken
	}
	act.off += int64(len(rec))
	l.seq++
	l.unsynced, l.records = true, true
	if !l.halfSaid && act.off > act.size/2 {
		l.halfSaid = true
		select {
		case l.half <- struct{}{}:
		default:
		}
	}
	return nil
}

// room makes the active segment one with room for a record of need bytes,
// rotating to the next one if it has not: the writer calls it before a
// batch's commit, so that a segment that cannot be made (a full disk) or
// a broken log fails the batch before Badger applies it. append then
// finds the room.
func (l *wal) room(need int64) error {
	if l.broken != nil {
		return l.broken
	}
	if act := l.active(); act.off+need > act.size {
		if _, err := l.rotate(need); err != nil {
			return err
		}
	}
	return nil
}

// sync makes the appended records durable: one fdatasync of the active
// segment, none when everything appended is synced already.
func (l *wal) sync() error {
	if l.broken != nil {
		return l.broken
	}
	if !l.unsynced {
		return nil
	}
	if err := fdatasync(l.active().f); err != nil {
		l.broken = fmt.Errorf("sync the reservation log: %w", err)
		return l.broken
	}
	l.unsynced, l.synced = false, l.seq-1
	return nil
}

func (l *wal) active() *segment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.segs[len(l.segs)-1]
}

// rotate syncs the active segment and makes a segment with room for need
// bytes the active one: the spare, or a new one. It signals the
// checkpointer. A failure to create a segment (a full disk) fails the
// batch, not the log: nothing was written.
func (l *wal) rotate(need int64) (*segment, error) {
	if act := l.active(); act.off+walHeader <= act.size {
		// An end mark: a recycled segment holds older records past
		// its new ones, which must read as the end, not as damage.
		var zero [walHeader]byte
		if _, err := act.f.WriteAt(zero[:], act.off); err != nil {
			l.broken = fmt.Errorf("write the reservation log: %w", err)
			return nil, l.broken
		}
		l.unsynced = true
	}
	if l.unsynced {
		if err := fdatasync(l.active().f); err != nil {
			l.broken = fmt.Errorf("sync the reservation log: %w", err)
			return nil, l.broken
		}
		l.unsynced = false
	}
	l.synced = l.seq - 1
	l.mu.Lock()
	seg, cur := l.spare, l.segs[len(l.segs)-1]
	l.spare = nil
	l.mu.Unlock()
	if seg != nil && (seg.size < need || seg.num < cur.num) {
		// Too small for a huge record, or numbered before a segment made
		// while it was being prepared: segments are used in number order.
		seg.f.Close()
		os.Remove(seg.path)
		seg = nil
	}
	if seg == nil {
		var err error
		size := walSegmentSize
		if need > size {
			size = (need + 1<<20 - 1) &^ (1<<20 - 1) // a huge record's own
		}
		if seg, err = l.create(size); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	l.segs = append(l.segs, seg)
	l.mu.Unlock()
	l.records, l.halfSaid = false, false
	select {
	case l.full <- struct{}{}:
	default:
	}
	return seg, nil
}

// cut begins a new segment if the active one holds records, and returns
// the segments before the active one: everything committed before the cut
// is in them. Called under the writer's exclusive lock.
func (l *wal) cut() ([]*segment, error) {
	if l.broken != nil {
		return nil, l.broken
	}
	if l.records {
		if _, err := l.rotate(0); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.segs[:len(l.segs)-1]), nil
}

// drop deletes old, the oldest segments, once Badger holds their records
// durably (oldest first, so a crash leaves no gap), and fsyncs the
// directory. The newest of them becomes the spare segment when there is
// none (recycle): that spares writing a new segment's zeros.
func (l *wal) drop(old []*segment) error {
	for i, seg := range old {
		l.mu.Lock()
		if len(l.segs) > 0 && l.segs[0] == seg {
			l.segs = l.segs[1:]
		}
		wantSpare := l.spare == nil
		l.mu.Unlock()
		if i == len(old)-1 && wantSpare && seg.size == walSegmentSize {
			if err := l.recycle(seg); err == nil {
				continue
			}
		}
		seg.f.Close()
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove reservation log segment: %w", err)
		}
	}
	return syncDir(l.dir)
}

// recycle makes seg, whose records Badger holds, the spare segment: its
// first record is zeroed (so it holds none) and synced, and it is renamed
// to the next segment number, the directory synced, before it is used. The
// records after the first stay: reading stops at them, as their sequence
// numbers are lower than those written after them (scanReader). On error,
// seg is left for drop to delete.
func (l *wal) recycle(seg *segment) error {
	var zero [walHeader]byte
	if _, err := seg.f.WriteAt(zero[:], 0); err != nil {
		return err
	}
	if err := fdatasync(seg.f); err != nil {
		return err
	}
	l.mu.Lock()
	num := l.nextNum
	l.nextNum++
	l.mu.Unlock()
	path := filepath.Join(l.dir, segmentName(num))
	if err := os.Rename(seg.path, path); err != nil {
		return err
	}
	seg.path, seg.num, seg.off = path, num, 0
	if err := syncDir(l.dir); err != nil {
		return err
	}
	l.mu.Lock()
	if l.spare == nil && seg.num > l.segs[len(l.segs)-1].num {
		l.spare, seg = seg, nil
		l.recycled++
	}
	l.mu.Unlock()
	if seg != nil {
		seg.f.Close()
		os.Remove(seg.path)
	}
	return nil
}

// prepare creates the spare segment if there is none; one at a time.
func (l *wal) prepare() error {
	l.prepMu.Lock()
	defer l.prepMu.Unlock()
	l.mu.Lock()
	have := l.spare != nil
	l.mu.Unlock()
	if have {
		return nil
	}
	seg, err := l.create(walSegmentSize)
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.spare == nil && seg.num > l.segs[len(l.segs)-1].num {
		l.spare = seg
		seg = nil
	}
	l.mu.Unlock()
	if seg != nil {
		seg.f.Close()
		os.Remove(seg.path)
	}
	return nil
}

// close closes the log's files; the log stays, replayed on the next open.
func (l *wal) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.segs {
		s.f.Close()
	}
	if l.spare != nil {
		l.spare.f.Close()
	}
}
