package redis

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// TestWireResponse: answers are stored under the JSON names earlier
// releases wrote, and such a stored answer reads back as it was, so an
// upgrade replays every completed key.
func TestWireResponse(t *testing.T) {
	t.Parallel()
	const stored = `{"status":201,"header":{"Content-Type":["application/json"]},"body":"eyJpZCI6MX0=",` +
		`"trailer":{"X-Checksum":["1"]},"body_stored":true,"reconciled":true}`
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":1}`), Trailer: http.Header{"X-Checksum": {"1"}}, BodyStored: true, Reconciled: true}
	b, err := encodeResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != stored {
		t.Errorf("encoded\n%s\nwant\n%s", b, stored)
	}
	got, err := decodeResponse([]byte(stored))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, resp) {
		t.Errorf("decoded %+v, want %+v", got, resp)
	}
	if _, err := decodeResponse([]byte(`{"status":`)); err == nil {
		t.Error("a truncated answer decodes without an error")
	}
}

// TestEncodeResponseIsJSON: the stored answer is, byte for byte, the JSON
// that encoding/json writes for it (the form every release wrote and
// reads), whatever its headers and body hold.
func TestEncodeResponseIsJSON(t *testing.T) {
	t.Parallel()
	tests := []store.Response{
		{},
		{Status: 200},
		{Status: 201, BodyStored: true, Body: []byte(`{"id":1}`), Header: http.Header{"Content-Type": {"application/json"}}},
		{Status: 204, Header: http.Header{}, Trailer: http.Header{}, Body: []byte{}},
		{Status: 500, Header: http.Header{"X-Nil": nil, "X-Empty": {}, "X-Two": {"a", "b"}, "A": {""}}},
		{Status: 200, Header: http.Header{"X-Html": {"<a href=\"x\">&amp;</a>"}, "X-Ctl": {"a\tb\nc\x00\x7f\b\f"}}},
		{Status: 200, Header: http.Header{"X-Utf8": {"café ✓ \u2028\u2029"}, "X-Bad": {"\xff\xfe ok \xc3"}, "Back\\slash": {`"q"`}}},
		{Status: 299, Body: []byte{0, 1, 2, 0xff}, Trailer: http.Header{"X-Checksum": {"1"}, "Grpc-Status": {"0"}},
			BodyStored: true, Reconciled: true},
		{Status: -1, Reconciled: true},
	}
	for i := range 20 { // more keys than appendHeader's array holds
		tests[2].Header.Set("X-H"+strconv.Itoa(i), strings.Repeat("v", i))
	}
	for _, resp := range tests {
		want, err := json.Marshal(wireResponse(resp))
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeResponse(resp)
		if err != nil || string(got) != string(want) {
			t.Errorf("encodeResponse(%+v) = %s, %v\nwant %s", resp, got, err, want)
		}
	}
}

// FuzzEncodeResponse: encodeResponse writes what encoding/json writes for
// any header name, value and body.
func FuzzEncodeResponse(f *testing.F) {
	f.Add(201, "Content-Type", "application/json", []byte(`{"id":1}`), true)
	f.Add(200, "X-A", "<\xff\u2028>", []byte{}, false)
	f.Fuzz(func(t *testing.T, status int, name, value string, body []byte, stored bool) {
		resp := store.Response{Status: status, Header: http.Header{name: {value, name}}, Body: body,
			Trailer: http.Header{value: nil}, BodyStored: stored, Reconciled: !stored}
		want, err := json.Marshal(wireResponse(resp))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := encodeResponse(resp); string(got) != string(want) {
			t.Errorf("encodeResponse = %s\nwant %s", got, want)
		}
	})
}
