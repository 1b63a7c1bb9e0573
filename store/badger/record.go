package badger

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemproxy/idemproxy/store"
)

// The record encoding.
//
// A record is stored as a version byte followed by fields, each a tag byte,
// a uvarint length and that many bytes of payload:
//
//	record  = version *field
//	field   = tag uvarint(len) payload
//
// Integers are varint payloads (zig-zag, encoding/binary), strings and the
// body raw bytes, a header value is uvarint(len(name)) name value, one field
// per value in order. A decoder skips tags it does not know, so a field can
// be added without a new version:
//
//  1. pick the next unused tag below (never reuse or renumber one; a
//     removed field's tag stays reserved);
//  2. write it in marshal, only when it is set, so records without it
//     stay as short as before;
//  3. read it in unmarshal's switch.
//
// Older binaries then ignore the new field and newer ones read records
// without it as the zero value. Bump recordVersion only for a change an
// old decoder must not misread (changing a tag's meaning); unmarshal
// rejects versions it does not know.
//
// Records written by earlier releases as JSON (they begin with '{') are
// still read.
const recordVersion byte = 1

// Field tags of recordVersion 1.
const (
	tagState       = 1 // one byte: stateCode
	tagToken       = 2
	tagFingerprint = 3
	tagCreatedAt   = 4 // varint, unix ms
	tagLease       = 5 // varint, unix ms
	tagStatus      = 6 // varint; present iff the record has a response
	tagHeader      = 7 // one per header value
	tagBody        = 8
	tagBodyStored  = 9  // one byte, 1
	tagNextLookup  = 10 // varint, unix ms: the reconcile lookup's due time
	tagLookupToken = 11 // the reconcile lookup lease's owner token
	tagLookupLease = 12 // varint, unix ms: the lookup lease's end
	tagReconciled  = 13 // one byte, 1: the response came from a lookup
	tagTrailer     = 14 // one per trailer value, encoded as tagHeader
	tagLogSeq      = 15 // uvarint: the reservation log sequence number of the batch that wrote it
	tagOrigin      = 16 // the reservation's origin span (store.Reservation.Origin); absent when empty
)

// State codes of tagState.
var stateCodes = map[store.State]byte{store.StateInFlight: 1, store.StateCompleted: 2, store.StateInDoubt: 3}

func stateOf(c byte) (store.State, bool) {
	switch c {
	case 1:
		return store.StateInFlight, true
	case 2:
		return store.StateCompleted, true
	case 3:
		return store.StateInDoubt, true
	}
	return "", false
}

// marshal encodes rec in one allocation.
func (rec *record) marshal() ([]byte, error) {
	code, ok := stateCodes[rec.State]
	if !ok {
		return nil, fmt.Errorf("unknown state %q", rec.State)
	}
	var e enc
	for pass := 0; pass < 2; pass++ {
		if pass == 1 {
			e.b = make([]byte, 0, e.n)
		}
		e.byte(recordVersion)
		e.bytesField(tagState, []byte{code})
		e.stringField(tagToken, rec.Token)
		e.stringField(tagFingerprint, rec.Fingerprint)
		e.varintField(tagCreatedAt, rec.CreatedAt)
		if rec.Lease != 0 {
			e.varintField(tagLease, rec.Lease)
		}
		if rec.NextLookup != 0 {
			e.varintField(tagNextLookup, rec.NextLookup)
		}
		if rec.LookupToken != "" {
			e.stringField(tagLookupToken, rec.LookupToken)
		}
		if rec.LookupLease != 0 {
			e.varintField(tagLookupLease, rec.LookupLease)
		}
		if rec.LogSeq != 0 {
			e.uvarintField(tagLogSeq, rec.LogSeq)
		}
		if rec.Origin != "" {
			e.stringField(tagOrigin, rec.Origin)
		}
		if r := rec.Response; r != nil {
			e.varintField(tagStatus, int64(r.Status))
			for name, vs := range r.Header {
				for _, v := range vs {
					e.headerField(tagHeader, name, v)
				}
			}
			for name, vs := range r.Trailer {
				for _, v := range vs {
					e.headerField(tagTrailer, name, v)
				}
			}
			if len(r.Body) > 0 {
				e.bytesField(tagBody, r.Body)
			}
			if r.BodyStored {
				e.bytesField(tagBodyStored, []byte{1})
			}
			if r.Reconciled {
				e.bytesField(tagReconciled, []byte{1})
			}
		}
	}
	return e.b, nil
}

// enc writes fields into b, or, while b is nil, only counts their size in n.
type enc struct {
	b []byte
	n int
}

func (e *enc) byte(c byte) {
	if e.b == nil {
		e.n++
		return
	}
	e.b = append(e.b, c)
}

func (e *enc) uvarint(v uint64) {
	if e.b == nil {
		var tmp [binary.MaxVarintLen64]byte
		e.n += binary.PutUvarint(tmp[:], v)
		return
	}
	e.b = binary.AppendUvarint(e.b, v)
}

func (e *enc) raw(p []byte) {
	if e.b == nil {
		e.n += len(p)
		return
	}
	e.b = append(e.b, p...)
}

func (e *enc) rawString(s string) {
	if e.b == nil {
		e.n += len(s)
		return
	}
	e.b = append(e.b, s...)
}

func (e *enc) bytesField(tag byte, p []byte) {
	e.byte(tag)
	e.uvarint(uint64(len(p)))
	e.raw(p)
}

func (e *enc) stringField(tag byte, s string) {
	e.byte(tag)
	e.uvarint(uint64(len(s)))
	e.rawString(s)
}

func (e *enc) uvarintField(tag byte, v uint64) {
	var b [binary.MaxVarintLen64]byte
	e.bytesField(tag, b[:binary.PutUvarint(b[:], v)])
}

func (e *enc) varintField(tag byte, v int64) {
	var tmp [binary.MaxVarintLen64]byte
	e.bytesField(tag, tmp[:binary.PutVarint(tmp[:], v)])
}

func (e *enc) headerField(tag byte, name, value string) {
	var tmp [binary.MaxVarintLen64]byte
	nl := binary.PutUvarint(tmp[:], uint64(len(name)))
	e.byte(tag)
	e.uvarint(uint64(nl + len(name) + len(value)))
	e.raw(tmp[:nl])
	e.rawString(name)
	e.rawString(value)
}

var errCorrupt = errors.New("corrupt record")

// corrupt marks a decoding error as a corrupt record, one key's problem
// rather than the store's.
func corrupt(err error) error {
	if errors.Is(err, errCorrupt) {
		return err
	}
	return fmt.Errorf("%w: %w", errCorrupt, err)
}

// unmarshal decodes v (binary or legacy JSON) into rec; it copies what it
// keeps, so v may be reused afterwards.
func (rec *record) unmarshal(v []byte) error {
	*rec = record{}
	if len(v) > 0 && v[0] == '{' {
		var l legacyRecord
		if err := json.Unmarshal(v, &l); err != nil {
			return err
		}
		*rec = l.record()
		return nil
	}
	if len(v) == 0 {
		return fmt.Errorf("%w: empty", errCorrupt)
	}
	if v[0] != recordVersion {
		return fmt.Errorf("%w: unknown version %d", errCorrupt, v[0])
	}
	v = v[1:]
	var resp store.Response
	hasResp, hasState := false, false
	for len(v) > 0 {
		tag := v[0]
		n, w := binary.Uvarint(v[1:])
		if w <= 0 || n > uint64(len(v)-1-w) {
			return fmt.Errorf("%w: field %d: bad length", errCorrupt, tag)
		}
		p := v[1+w : 1+w+int(n)]
		v = v[1+w+int(n):]
		switch tag {
		case tagState:
			var ok bool
			if len(p) != 1 {
				return fmt.Errorf("%w: state", errCorrupt)
			}
			if rec.State, ok = stateOf(p[0]); !ok {
				return fmt.Errorf("%w: unknown state %d", errCorrupt, p[0])
			}
			hasState = true
		case tagToken:
			rec.Token = string(p)
		case tagFingerprint:
			rec.Fingerprint = string(p)
		case tagLookupToken:
			rec.LookupToken = string(p)
		case tagOrigin:
			rec.Origin = string(p)
		case tagCreatedAt, tagLease, tagStatus, tagNextLookup, tagLookupLease:
			x, w := binary.Varint(p)
			if w <= 0 || w != len(p) {
				return fmt.Errorf("%w: field %d: bad integer", errCorrupt, tag)
			}
			switch tag {
			case tagCreatedAt:
				rec.CreatedAt = x
			case tagLease:
				rec.Lease = x
			case tagNextLookup:
				rec.NextLookup = x
			case tagLookupLease:
				rec.LookupLease = x
			default:
				if x < 0 || x > 999 {
					return fmt.Errorf("%w: status %d", errCorrupt, x)
				}
				resp.Status, hasResp = int(x), true
			}
		case tagHeader, tagTrailer:
			nl, w := binary.Uvarint(p)
			if w <= 0 || nl > uint64(len(p)-w) {
				return fmt.Errorf("%w: header", errCorrupt)
			}
			name := string(p[w : w+int(nl)])
			h := &resp.Header
			if tag == tagTrailer {
				h = &resp.Trailer
			}
			if *h == nil {
				*h = http.Header{}
			}
			(*h)[name] = append((*h)[name], string(p[w+int(nl):]))
		case tagBody:
			resp.Body = append([]byte(nil), p...)
		case tagBodyStored:
			resp.BodyStored = len(p) == 1 && p[0] == 1
		case tagReconciled:
			resp.Reconciled = len(p) == 1 && p[0] == 1
		case tagLogSeq:
			x, w := binary.Uvarint(p)
			if w <= 0 || w != len(p) {
				return fmt.Errorf("%w: field %d: bad integer", errCorrupt, tag)
			}
			rec.LogSeq = x
		default:
			// A field of a newer release: skipped.
		}
	}
	if !hasState {
		return fmt.Errorf("%w: no state", errCorrupt)
	}
	if hasResp || resp.Header != nil || resp.Trailer != nil || resp.Body != nil || resp.BodyStored || resp.Reconciled {
		rec.Response = &resp
	}
	return nil
}

// legacyRecord is the JSON form of a record, written by releases before the
// binary encoding and still read, so that an upgrade loses no key. Its
// names must never change.
type legacyRecord struct {
	State       store.State     `json:"st"`
	Token       string          `json:"tok"`
	Fingerprint string          `json:"fp"`
	CreatedAt   int64           `json:"cr"`
	Lease       int64           `json:"le,omitempty"`
	Response    *legacyResponse `json:"resp,omitempty"`
	NextLookup  int64           `json:"nl,omitempty"`
	LookupToken string          `json:"lt,omitempty"`
	LookupLease int64           `json:"ll,omitempty"`
}

// legacyResponse is the JSON form of a stored answer in a legacyRecord.
type legacyResponse struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header,omitempty"`
	Body       []byte      `json:"body,omitempty"`
	Trailer    http.Header `json:"trailer,omitempty"`
	BodyStored bool        `json:"body_stored"`
	Reconciled bool        `json:"reconciled,omitempty"`
}

func (l legacyRecord) record() record {
	rec := record{
		State: l.State, Token: l.Token, Fingerprint: l.Fingerprint, CreatedAt: l.CreatedAt, Lease: l.Lease,
		NextLookup: l.NextLookup, LookupToken: l.LookupToken, LookupLease: l.LookupLease,
	}
	if l.Response != nil {
		r := store.Response(*l.Response)
		rec.Response = &r
	}
	return rec
}

// recordLogSeq returns the reservation log sequence number of the batch
// that wrote the record encoded in v (tagLogSeq), reading no other field;
// 0 when it has none (written without a log, by an earlier release, or
// as JSON) or does not decode.
func recordLogSeq(v []byte) uint64 {
	if len(v) == 0 || v[0] != recordVersion {
		return 0
	}
	v = v[1:]
	for len(v) > 0 {
		tag := v[0]
		n, w := binary.Uvarint(v[1:])
		if w <= 0 || n > uint64(len(v)-1-w) {
			return 0
		}
		p := v[1+w : 1+w+int(n)]
		v = v[1+w+int(n):]
		if tag == tagLogSeq {
			x, w := binary.Uvarint(p)
			if w <= 0 || w != len(p) {
				return 0
			}
			return x
		}
	}
	return 0
}
