package redis

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// TestWireResponse: answers are stored under the JSON names earlier
// releases wrote, and such a stored answer reads back as it was, so an
// upgrade replays every completed key.
func TestWireResponse(t *testing.T) {
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
