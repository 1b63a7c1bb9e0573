package badger

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

var recordCases = []struct {
	name string
	rec  record
}{
	{"in flight", record{State: store.StateInFlight, Token: "tok", Fingerprint: "fp", CreatedAt: 1764583200000, Lease: 1764583235000}},
	{"in doubt, empty strings", record{State: store.StateInDoubt, CreatedAt: -1}},
	{"completed", record{State: store.StateCompleted, Token: "t", Fingerprint: "f", CreatedAt: 1, Response: &store.Response{
		Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}},
		Body: []byte(`{"chargeId":"ch_1"}`), BodyStored: true}}},
	{"completed, not replayable", record{State: store.StateCompleted, Response: &store.Response{Status: 200}}},
	{"completed, binary body", record{State: store.StateCompleted, Response: &store.Response{
		Status: 500, Body: []byte{0, 1, 2, 255, '{'}, BodyStored: true}}},
	{"in doubt, lookup scheduled and leased", record{State: store.StateInDoubt, Token: "t", CreatedAt: 5,
		NextLookup: 1764583500000, LookupToken: "lookup-tok", LookupLease: 1764583535000}},
	{"completed, with trailers", record{State: store.StateCompleted, Token: "t", CreatedAt: 7, Response: &store.Response{
		Status: 200, Header: http.Header{"Trailer": {"X-Checksum"}}, Body: []byte("abc"), BodyStored: true,
		Trailer: http.Header{"X-Checksum": {"sha256=1"}, "Server-Timing": {"db;dur=5", "app;dur=9"}}}}},
	{"completed by a reconcile lookup", record{State: store.StateCompleted, Token: "t", CreatedAt: 6, Response: &store.Response{
		Status: 200, Body: []byte(`{"charge":1}`), BodyStored: true, Reconciled: true}}},
	{"completed, with its origin span", record{State: store.StateCompleted, Token: "tok", Fingerprint: "fp", CreatedAt: 1764583200000,
		Origin: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", Response: &store.Response{
			Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"chargeId":"ch_1"}`), BodyStored: true}}},
}

// TestRecordRoundTrip: every record decodes to what was encoded.
func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tt := range recordCases {
		t.Run(tt.name, func(t *testing.T) {
			v, err := tt.rec.marshal()
			if err != nil {
				t.Fatal(err)
			}
			if v[0] != recordVersion {
				t.Fatalf("first byte %d, want the version %d", v[0], recordVersion)
			}
			var got record
			if err := got.unmarshal(v); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.rec) {
				t.Errorf("got %+v\nwant %+v", got, tt.rec)
			}
			js, _ := json.Marshal(legacyOf(tt.rec))
			if len(v) >= len(js) {
				t.Errorf("binary %d bytes, JSON %d: want it smaller", len(v), len(js))
			}
		})
	}
}

// TestRecordReadsLegacyJSON: records written as JSON by earlier releases
// are still read, so an upgrade loses no key.
func TestRecordReadsLegacyJSON(t *testing.T) {
	t.Parallel()
	for _, tt := range recordCases {
		t.Run(tt.name, func(t *testing.T) {
			js, err := json.Marshal(legacyOf(tt.rec))
			if err != nil {
				t.Fatal(err)
			}
			var got record
			if err := got.unmarshal(js); err != nil {
				t.Fatal(err)
			}
			want := tt.rec
			want.Origin = "" // the JSON form never had one
			if want.Response != nil && len(want.Response.Body) == 0 {
				r := *want.Response
				r.Body = nil
				want.Response = &r
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestRecordReadsLegacyJSONFixture: a record exactly as an earlier release
// wrote it in JSON decodes to the record it meant.
func TestRecordReadsLegacyJSONFixture(t *testing.T) {
	t.Parallel()
	const js = `{"st":"completed","tok":"t1","fp":"fp1","cr":1764583200000,` +
		`"resp":{"status":201,"header":{"Content-Type":["application/json"]},"body":"eyJpZCI6MX0=","body_stored":true}}`
	want := record{State: store.StateCompleted, Token: "t1", Fingerprint: "fp1", CreatedAt: 1764583200000,
		Response: &store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"id":1}`), BodyStored: true}}
	var got record
	if err := got.unmarshal([]byte(js)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// legacyOf is rec in the JSON form earlier releases wrote.
func legacyOf(rec record) legacyRecord {
	l := legacyRecord{State: rec.State, Token: rec.Token, Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt, Lease: rec.Lease,
		NextLookup: rec.NextLookup, LookupToken: rec.LookupToken, LookupLease: rec.LookupLease}
	if rec.Response != nil {
		r := legacyResponse(*rec.Response)
		l.Response = &r
	}
	return l
}

// TestRecordWithoutTrailers: a record written before answers kept their
// trailers (testdata, encoded by that release) decodes as before, with no
// trailers. (An older release skips the trailers' tag, as any unknown one:
// TestRecordSkipsUnknownFields.)
func TestRecordWithoutTrailers(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/record-v1-before-trailers.hex")
	if err != nil {
		t.Fatal(err)
	}
	v, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var got record
	if err := got.unmarshal(v); err != nil {
		t.Fatal(err)
	}
	want := record{State: store.StateCompleted, Token: "tok", Fingerprint: "fp", CreatedAt: 1764583200000, Response: &store.Response{
		Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"chargeId":"ch_1"}`), BodyStored: true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// Encoded again, without trailers, it is byte for byte what that release wrote.
	if again, _ := want.marshal(); !bytes.Equal(again, v) {
		t.Errorf("a record without trailers encodes to %x, want %x as before", again, v)
	}
}

// TestRecordOriginCosts: a record without an origin is encoded byte for
// byte as the releases before origins wrote it (so they read each other's
// records), and an origin adds its length and two bytes, no more.
func TestRecordOriginCosts(t *testing.T) {
	t.Parallel()
	// An in-flight record as the release before origins encoded it:
	// version, state, token, fingerprint, created, lease end.
	previous := []byte{recordVersion,
		tagState, 1, 1,
		tagToken, 3, 't', 'o', 'k',
		tagFingerprint, 2, 'f', 'p',
		tagCreatedAt, 1, 2, // varint 1
		tagLease, 1, 4, // varint 2
	}
	rec := record{State: store.StateInFlight, Token: "tok", Fingerprint: "fp", CreatedAt: 1, Lease: 2}
	var got record
	if err := got.unmarshal(previous); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("the previous release's record decodes to %+v, want %+v (no origin)", got, rec)
	}
	if v, _ := rec.marshal(); !bytes.Equal(v, previous) {
		t.Errorf("a record without origin encodes to % x, want % x as before", v, previous)
	}
	rec.Origin = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	v, _ := rec.marshal()
	if got, want := len(v), len(previous)+2+len(rec.Origin); got != want {
		t.Errorf("a record with a %d-byte origin is %d bytes, want %d", len(rec.Origin), got, want)
	}
}

// TestRecordSkipsUnknownFields: a field added by a newer release is
// skipped, so that a rollback still reads the records.
func TestRecordSkipsUnknownFields(t *testing.T) {
	t.Parallel()
	rec := recordCases[2].rec
	v, err := rec.marshal()
	if err != nil {
		t.Fatal(err)
	}
	v = append(v, 200, 3, 'n', 'e', 'w') // tag 200, 3 bytes
	v = append(v[:1], append([]byte{201, 0}, v[1:]...)...)
	var got record
	if err := got.unmarshal(v); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("got %+v\nwant %+v", got, rec)
	}
}

// TestRecordRejectsCorruption: truncations and bad values are errors, never
// a panic or a record read wrong.
func TestRecordRejectsCorruption(t *testing.T) {
	t.Parallel()
	good, err := recordCases[2].rec.marshal()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		v    []byte
	}{
		{"empty", nil},
		{"unknown version", append([]byte{9}, good[1:]...)},
		{"no state", []byte{recordVersion, tagToken, 1, 'x'}},
		{"unknown state", []byte{recordVersion, tagState, 1, 7}},
		{"length beyond the end", []byte{recordVersion, tagState, 5, 1}},
		{"bad length varint", []byte{recordVersion, tagState, 0xff}},
		{"bad integer", []byte{recordVersion, tagState, 1, 1, tagCreatedAt, 0}},
		{"status out of range", []byte{recordVersion, tagState, 1, 2, tagStatus, 2, 0xd0, 0x0f}},
		{"bad header", []byte{recordVersion, tagState, 1, 2, tagHeader, 1, 9}},
		{"bad JSON", []byte(`{"st":`)},
	}
	for i := 1; i < len(good); i++ {
		if i < len(good)-1 { // truncated inside the last field (the stored flag) or earlier
			tests = append(tests, struct {
				name string
				v    []byte
			}{"truncated", good[:i]})
		}
	}
	for _, tt := range tests {
		var rec record
		err := rec.unmarshal(tt.v)
		if err == nil {
			// A cut exactly between fields is a shorter valid record; only
			// cuts inside a field must fail.
			if tt.name == "truncated" && fieldBoundary(good, len(tt.v)) {
				continue
			}
			t.Errorf("%s (% x): decoded %+v, want an error", tt.name, tt.v, rec)
		} else if tt.name != "bad JSON" && !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", tt.name, err)
		}
	}
}

// fieldBoundary reports whether n is where a field of v begins.
func fieldBoundary(v []byte, n int) bool {
	i := 1
	for i < len(v) {
		if i == n {
			return true
		}
		l, w := uvarintAt(v[i+1:])
		i += 1 + w + l
	}
	return i == n
}

func uvarintAt(b []byte) (int, int) {
	var x, s uint
	for i, c := range b {
		if c < 0x80 {
			return int(x | uint(c)<<s), i + 1
		}
		x |= uint(c&0x7f) << s
		s += 7
	}
	return 0, len(b)
}

// FuzzRecordUnmarshal: any value decodes without panicking, and whatever
// decodes encodes and decodes again to the same record.
func FuzzRecordUnmarshal(f *testing.F) {
	for _, tt := range recordCases {
		v, _ := tt.rec.marshal()
		f.Add(v)
		js, _ := json.Marshal(legacyOf(tt.rec))
		f.Add(js)
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		var rec record
		if err := rec.unmarshal(v); err != nil {
			return
		}
		if _, ok := stateCodes[rec.State]; !ok {
			return // legacy JSON may carry any state string; marshal refuses it
		}
		again, err := rec.marshal()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", rec, err)
		}
		var rec2 record
		if err := rec2.unmarshal(again); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(normal(rec), normal(rec2)) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", rec, rec2)
		}
	})
}

// normal maps the forms the encoding does not tell apart (an empty body or
// header and none) to one.
func normal(rec record) record {
	if r := rec.Response; r != nil {
		c := *r
		if len(c.Body) == 0 {
			c.Body = nil
		}
		h := http.Header{}
		for k, vs := range c.Header {
			if len(vs) > 0 {
				h[k] = vs
			}
		}
		c.Header = h
		rec.Response = &c
	}
	return rec
}

// TestRecordEncodesEveryField: every field of record survives the
// encoding. A field added to record without a tag in marshal and
// unmarshal fails here instead of being silently dropped on disk.
func TestRecordEncodesEveryField(t *testing.T) {
	t.Parallel()
	var rec record
	v := reflect.ValueOf(&rec).Elem()
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		switch {
		case sf.Type == reflect.TypeOf(store.State("")):
			f.SetString(string(store.StateInDoubt))
		case sf.Type == reflect.TypeOf(&store.Response{}):
			f.Set(reflect.ValueOf(recordCases[2].rec.Response))
		case f.Kind() == reflect.String:
			f.SetString("value of " + sf.Name)
		case f.CanInt():
			f.SetInt(int64(1000 + i))
		case f.CanUint():
			f.SetUint(uint64(1000 + i))
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		default:
			t.Fatalf("record.%s (%s): give it a tag in marshal and unmarshal, then a value here", sf.Name, sf.Type)
		}
	}
	b, err := rec.marshal()
	if err != nil {
		t.Fatal(err)
	}
	var got record
	if err := got.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	gv := reflect.ValueOf(got)
	for i := range v.NumField() {
		if !reflect.DeepEqual(gv.Field(i).Interface(), v.Field(i).Interface()) {
			t.Errorf("record.%s = %v after a round trip, want %v: is it in marshal and unmarshal?",
				v.Type().Field(i).Name, gv.Field(i).Interface(), v.Field(i).Interface())
		}
	}
}
