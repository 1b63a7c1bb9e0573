package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// State is the life-cycle state of a key record.
type State string

// The states of a key record. A key with no record has never been seen, or
// was released, or has expired.
const (
	// StateInFlight: a request holding the reservation is being forwarded now.
	StateInFlight State = "in_flight"
	// StateCompleted: the upstream answered and the answer was committed.
	StateCompleted State = "completed"
	// StateInDoubt: the request may have reached the upstream, but no answer
	// came back. An operator, the TTL or, on a route with reconcile, the
	// upstream's answer to a lookup clears it.
	StateInDoubt State = "in_doubt"
)

// ErrNotOwner is returned by Store.Commit, Store.Release and Store.MarkInDoubt
// when the record no longer carries the caller's owner token: the record was
// released, expired or taken over by a newer reservation. The caller must
// leave the record alone.
var ErrNotOwner = errors.New("reservation is not held by this owner")

// Reservation is what a request asks the store to record when it reserves a
// key.
type Reservation struct {
	// Token is a random owner token; commit and release compare it.
	Token string
	// Fingerprint identifies the request's content (method, path, body).
	Fingerprint string
	// Lease is how long the reservation stays in flight. A reservation whose
	// lease has run out is reported as in doubt.
	Lease time.Duration
	// TTL is how long the record is kept at all, counted from now.
	TTL time.Duration
}

// Response is an upstream answer as stored for replay.
type Response struct {
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Header holds the allow-listed headers only.
	Header http.Header `json:"header,omitempty"`
	// Body is the full response body. It is nil when BodyStored is false.
	Body []byte `json:"body,omitempty"`
	// Trailer holds the allow-listed trailers of the answer (nil: none),
	// replayed as trailers. Records stored before trailers were kept
	// have none.
	Trailer http.Header `json:"trailer,omitempty"`
	// BodyStored is false when the body was larger than the storage cap and
	// was left out: the answer is known to exist but cannot be replayed.
	BodyStored bool `json:"body_stored"`
	// Reconciled is set when the answer came from a reconcile lookup, not
	// from the original request.
	Reconciled bool `json:"reconciled,omitempty"`
}

// Record is the stored state of one key.
type Record struct {
	State       State     `json:"state"`
	Token       string    `json:"-"`
	Fingerprint string    `json:"fingerprint"`
	CreatedAt   time.Time `json:"created_at"`
	// LeaseExpiresAt is when an in-flight reservation turns in doubt. It is
	// the zero time for other states.
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	// ExpiresAt is when the store forgets the record; the zero time means the
	// store did not report it.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Response is set for completed records.
	Response *Response `json:"response,omitempty"`
}

// Store keeps key records. Every method is safe for concurrent use, also
// from several processes where the implementation is shared (Redis).
//
// Keys are opaque strings built by the proxy (see StoreKey). An in-flight
// record whose lease has run out must be reported as StateInDoubt by Reserve
// and Get.
type Store interface {
	// Reserve atomically records res under key when no record exists and
	// returns (nil, nil): the caller owns the key and may forward the
	// request. When a record exists it is returned unchanged; if that record
	// is an in-flight reservation carrying res.Token (the caller's own,
	// applied before a lost reply), Reserve returns (nil, nil) too.
	Reserve(ctx context.Context, key string, res Reservation) (*Record, error)
	// Commit replaces the caller's reservation (in flight, or in doubt
	// because its lease ran out: the answer is now known) with a completed
	// record holding resp, kept for ttl. A record the caller already
	// completed keeps its first answer. It returns ErrNotOwner when the
	// record does not carry token.
	Commit(ctx context.Context, key, token string, resp Response, ttl time.Duration) error
	// Release deletes the caller's reservation. It returns ErrNotOwner when
	// the record does not carry token.
	Release(ctx context.Context, key, token string) error
	// MarkInDoubt turns the caller's reservation in doubt, kept for ttl; a
	// completed record is left as it is. It returns ErrNotOwner when the
	// record does not carry token.
	MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error
	// Get returns the record under key, or (nil, nil) when there is none.
	// Get and Reserve fill in Record.Token.
	Get(ctx context.Context, key string) (*Record, error)
	// Delete removes the record under key in any state (operator release).
	// It reports whether a record existed.
	Delete(ctx context.Context, key string) (bool, error)
	// Ping reports whether the store can serve requests.
	Ping(ctx context.Context) error
}
