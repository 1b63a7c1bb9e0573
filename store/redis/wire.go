package redis

import (
	"encoding/json"
	"net/http"

	"github.com/idemproxy/idemproxy/store"
)

// wireResponse is the JSON form of a stored answer in a record's response
// field (and in a lookup's applied answer). Records written by earlier
// releases use these names, so they must never change.
type wireResponse struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header,omitempty"`
	Body       []byte      `json:"body,omitempty"`
	Trailer    http.Header `json:"trailer,omitempty"`
	BodyStored bool        `json:"body_stored"`
	Reconciled bool        `json:"reconciled,omitempty"`
}

func encodeResponse(r store.Response) ([]byte, error) { return json.Marshal(wireResponse(r)) }

func decodeResponse(b []byte) (store.Response, error) {
	var w wireResponse
	err := json.Unmarshal(b, &w)
	return store.Response(w), err
}
