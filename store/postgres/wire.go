package postgres

import (
	"encoding/json"
	"net/http"

	"github.com/idemproxy/idemproxy/store"
)

// wireMeta is the JSON in a record's response column: the stored answer
// without its body, which has a bytea column of its own (base64 in JSON
// would cost a third more, and jsonb would parse it). Records in the table
// use these names, so they must never change.
type wireMeta struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header,omitempty"`
	Trailer    http.Header `json:"trailer,omitempty"`
	BodyStored bool        `json:"body_stored"`
	Reconciled bool        `json:"reconciled,omitempty"`
}

// encodeMeta returns the response column of r. It is a string, not a
// []byte: pgx sends a string as text in every query exec mode, which jsonb
// parses, while a []byte is sent as bytea's text ('\x7b...') in the modes
// that do not ask the server for the parameters' types (exec and
// simple_protocol, used behind PgBouncer), which jsonb refuses.
func encodeMeta(r store.Response) (string, error) {
	b, err := json.Marshal(wireMeta{
		Status: r.Status, Header: r.Header, Trailer: r.Trailer,
		BodyStored: r.BodyStored, Reconciled: r.Reconciled,
	})
	return string(b), err
}

func decodeMeta(b []byte) (store.Response, error) {
	var w wireMeta
	if err := json.Unmarshal(b, &w); err != nil {
		return store.Response{}, err
	}
	return store.Response{
		Status: w.Status, Header: w.Header, Trailer: w.Trailer,
		BodyStored: w.BodyStored, Reconciled: w.Reconciled,
	}, nil
}

// body returns the body column of r: NULL for an answer whose body was not
// stored, an empty bytea for an empty body.
func body(r store.Response) []byte {
	if !r.BodyStored {
		return nil
	}
	if r.Body == nil {
		return []byte{}
	}
	return r.Body
}
