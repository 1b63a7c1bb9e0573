// Package store is the storage contract of idemproxy: the key record, its
// states, the errors, and the interfaces every backend implements. It
// imports nothing of the HTTP proxy, so that a backend (store/badger,
// store/redis, store/postgres) depends on this package alone, and one
// conformance suite (store/storetest) runs against each of them.
//
// Each backend owns its wire encoding: the types here carry no
// serialization tags.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	// Origin identifies the trace span that forwards the request under
	// this reservation, as "<32 lower-hex trace ID>-<16 lower-hex span
	// ID>" (49 bytes), so that a replay of its answer can link to that
	// span; empty means none (tracing is off). Stores keep it as an opaque
	// string and refuse one longer than MaxOriginLen (ErrOriginTooLong).
	Origin string
}

// MaxOriginLen is the longest Reservation.Origin a store accepts, in bytes.
const MaxOriginLen = 64

// ErrOriginTooLong is returned (wrapped) by Store.Reserve for a
// Reservation.Origin longer than MaxOriginLen; nothing is reserved.
var ErrOriginTooLong = errors.New("reservation origin is longer than 64 bytes")

// CheckOrigin returns ErrOriginTooLong for an origin longer than
// MaxOriginLen: every store calls it before it reserves.
func CheckOrigin(origin string) error {
	if len(origin) > MaxOriginLen {
		return fmt.Errorf("%w: %d bytes", ErrOriginTooLong, len(origin))
	}
	return nil
}

// Response is an upstream answer as stored for replay.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the allow-listed headers only (nil: none).
	Header http.Header
	// Body is the full response body. It is nil when BodyStored is false.
	Body []byte
	// Trailer holds the allow-listed trailers of the answer (nil: none),
	// replayed as trailers. Records stored before trailers were kept
	// have none.
	Trailer http.Header
	// BodyStored is false when the body was larger than the storage cap and
	// was left out: the answer is known to exist but cannot be replayed.
	BodyStored bool
	// Reconciled is set when the answer came from a reconcile lookup, not
	// from the original request.
	Reconciled bool
}

// Record is the stored state of one key.
type Record struct {
	State State
	// Token is the owner token of the reservation that made the record.
	Token       string
	Fingerprint string
	CreatedAt   time.Time
	// LeaseExpiresAt is when an in-flight reservation turns in doubt. It is
	// the zero time for other states.
	LeaseExpiresAt time.Time
	// ExpiresAt is when the store forgets the record; the zero time means the
	// store did not report it.
	ExpiresAt time.Time
	// Response is set for completed records (nil otherwise).
	Response *Response
	// Origin is the Reservation.Origin of the reservation that made the
	// record, kept whatever becomes of it (committed, in doubt, settled by
	// a lookup); empty when it had none, or when it was stored by a
	// release that did not keep origins.
	Origin string
}

// Store keeps key records. Every method is safe for concurrent use, also
// from several processes where the implementation is shared (Redis,
// PostgreSQL).
//
// Keys are opaque strings built by Key. An in-flight record whose lease has
// run out must be reported as StateInDoubt by Reserve and Get.
type Store interface {
	// Reserve atomically records res under key when no record exists and
	// returns (nil, nil): the caller owns the key and may forward the
	// request. When a record exists it is returned unchanged; if that record
	// is an in-flight reservation carrying res.Token (the caller's own,
	// applied before a lost reply), Reserve returns (nil, nil) too. A
	// res.Origin longer than MaxOriginLen is refused (ErrOriginTooLong).
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
	// Get and Reserve fill in Record.Token and Record.Origin.
	Get(ctx context.Context, key string) (*Record, error)
	// Ping reports whether the store can serve requests.
	Ping(ctx context.Context) error
}

// ReconcileStore is what reconciliation needs of the store besides Store:
// a schedule of lookups kept on the records themselves (so that it survives
// restarts and is shared by replicas on one shared store), a way to find
// the records that are due, and a lookup lease fenced by a token like a
// reservation, so that one lookup per key runs at a time.
//
// A record is "in doubt" for these methods when its state is in_doubt or
// when it is in flight with a lapsed lease; methods that change such a
// record store it as in_doubt. Times are the store's own clock (Redis'
// TIME for Redis, now() for PostgreSQL), durations are counted from it.
type ReconcileStore interface {
	// ScheduleLookup sets the next lookup of the in-doubt record under key
	// to after from now, unless it has one already. It does nothing to a
	// record that is not in doubt, or to no record.
	ScheduleLookup(ctx context.Context, key string, after time.Duration) error
	// Unscheduled returns the keys beginning with prefix (a route's
	// "name/", or "name/-/" for its unscoped keys) of in-doubt records that
	// have no lookup scheduled (a crash's orphans, lapsed leases), at most
	// limit of them.
	Unscheduled(ctx context.Context, prefix string, limit int) ([]string, error)
	// DueLookups returns the keys of in-doubt records whose next lookup
	// is due, at most limit of them.
	DueLookups(ctx context.Context, limit int) ([]string, error)
	// ClaimLookup takes the lookup lease of the in-doubt record under key
	// for lease, tagged with token. Unless force, the record's lookup must
	// be due. It returns ErrNotInDoubt, ErrLookupBusy (another lookup holds
	// a live lease) or ErrNotDue.
	ClaimLookup(ctx context.Context, key, token string, lease time.Duration, force bool) error
	// ResolveLookup settles a claimed lookup; it returns ErrNotOwner when the
	// record no longer is in doubt under the caller's lookup token (the
	// original request settled it, an operator released it, another lookup
	// took over).
	ResolveLookup(ctx context.Context, key, token string, res LookupResult) error
	// UnscheduleLookup removes the record's next lookup (its route no
	// longer reconciles).
	UnscheduleLookup(ctx context.Context, key string) error
}

// LookupResult is how a lookup settles an in-doubt record: exactly one of
// Applied (the record becomes completed with it, keeping its expiry),
// Release (the record is deleted) or RetryAfter (the next lookup).
type LookupResult struct {
	Applied    *Response
	Release    bool
	RetryAfter time.Duration
}

// Errors of ReconcileStore.ClaimLookup.
var (
	ErrNotInDoubt = errors.New("the key is not in doubt")
	ErrLookupBusy = errors.New("another lookup of this key is running")
	ErrNotDue     = errors.New("the key's lookup is not due yet")
)

// Key returns the store key of an idempotency key on a route:
// "route/scope/key". A non-empty scope (the raw value of the route's scope
// header) is hashed, so that the store never holds it and one client's keys
// cannot be reached with another's scope; an empty scope is "-".
func Key(route, scope, key string) string {
	s := "-"
	if scope != "" {
		sum := sha256.Sum256([]byte(scope))
		s = hex.EncodeToString(sum[:16])
	}
	return route + "/" + s + "/" + key
}

// KeyHash is a short, one-way digest of a store key, for logs: the key
// itself may carry a customer reference.
func KeyHash(storeKey string) string {
	sum := sha256.Sum256([]byte(storeKey))
	return hex.EncodeToString(sum[:6])
}

// ListQuery selects the records Lister.List returns.
type ListQuery struct {
	// Prefix keeps the keys beginning with it: a route's "name/" (every
	// scope), "name/-/" (its unscoped keys) or "name/<scope hash>/".
	Prefix string
	// State keeps the records in this state; empty keeps every state. A
	// reservation whose lease has run out is in_doubt, as Get reports it.
	State State
	// KeyHash keeps the key whose KeyHash is this; empty keeps every key.
	KeyHash string
	// Limit is the most records one call returns; it must be positive.
	Limit int
	// Cursor is empty for the first page, and the next cursor a call
	// returned for the following one, with the same Prefix.
	Cursor string
}

// Matches reports whether the record under key, in state st, is one that
// q selects (Prefix, State and KeyHash; not Limit or Cursor).
func (q ListQuery) Matches(key string, st State) bool {
	if len(key) < len(q.Prefix) || key[:len(q.Prefix)] != q.Prefix {
		return false
	}
	if q.State != "" && st != q.State {
		return false
	}
	return q.KeyHash == "" || KeyHash(key) == q.KeyHash
}

// Listed is a record as Lister.List shows it: what an operator needs to
// find a key, never its token, fingerprint or stored answer.
type Listed struct {
	// Key is the store key, as Key builds it.
	Key   string
	State State
	// CreatedAt is when the reservation was made.
	CreatedAt time.Time
	// ExpiresAt is when the store forgets the record (zero: not reported).
	ExpiresAt time.Time
	// LeaseExpiresAt is when an in-flight reservation turns in doubt; zero
	// for other states.
	LeaseExpiresAt time.Time
	// StoredStatus is the status of a completed record's stored answer; 0
	// for other states.
	StoredStatus int
}

// ListBudget is the most keys one Lister.List call examines, unless its
// limit is larger (then limit keys). A call with a State or KeyHash filter
// may examine that many keys and select few or none of them: it returns
// them with a next cursor all the same, so a page may be short, or empty,
// while there are more pages. The cost of a call is bounded; the cost of
// listing every page is that of reading every key under the prefix (and,
// on some stores, beyond it: see each store's List).
const ListBudget = 4096

// Budget is the most keys a List call for q examines: ListBudget, or
// q.Limit when that is larger.
func (q ListQuery) Budget() int { return max(q.Limit, ListBudget) }

// ErrBadCursor is returned by Lister.List for a cursor that is not one the
// store returned for this prefix.
var ErrBadCursor = errors.New("the cursor is not one this store returned for this listing")

// Lister is implemented by the stores that can list their keys, for
// operators: every store of idemproxy.
type Lister interface {
	// List returns up to q.Limit live records that q selects, in an order
	// of the store's own, and the cursor of the next page ("" on the last
	// one). Expired records are never listed. While no key under the
	// prefix changes, following the cursors from an empty one lists every
	// selected record exactly once; a key created, changed or removed
	// meanwhile may be listed or not, in the state it had when its page was
	// read. Each call examines a bounded number of keys (ListBudget), so
	// a page may be short or empty while the next cursor is set. A cursor
	// the store did not return for q.Prefix is ErrBadCursor.
	List(ctx context.Context, q ListQuery) (recs []Listed, next string, err error)
}

// EpochState is the state of a store's epoch marker.
type EpochState string

// The states of an epoch marker.
const (
	// EpochNew: a replica found the store without a marker and wrote this
	// one; it trusts it only after a grace period in which the replicas
	// that remember an older epoch can object (by marking it lost).
	EpochNew EpochState = "new"
	// EpochEstablished: a new marker that outlasted its grace period
	// without an objection.
	EpochEstablished EpochState = "established"
	// EpochLost: a replica saw the marker it remembered missing or
	// replaced: the store forgot keys it had. No replica serves protected
	// requests until an operator accepts the loss.
	EpochLost EpochState = "lost"
	// EpochAccepted: an operator accepted a loss (idemproxy store
	// accept-loss, or the admin API); replicas adopt it.
	EpochAccepted EpochState = "accepted"
)

// Epoch is a shared store's epoch marker: a record the store keeps beside
// the key records, with no expiry, that disappears with them when the
// store forgets its keys (a restart without persistence, FLUSHALL, a
// truncated table, a replaced data directory). Every replica remembers the
// epoch it trusts and checks the marker; a missing or different marker
// means the keys it vouched for are gone.
type Epoch struct {
	// ID is random, new for every marker written.
	ID string
	// State is the marker's state.
	State EpochState
	// Gen orders markers: each one written has a Gen above that of the
	// marker it replaces (or the replica remembered), and at least its
	// writer's clock in Unix milliseconds. A marker restored from an old
	// backup has a lower Gen than the one replicas remember, so an old
	// acceptance is never adopted by mistake.
	Gen uint64
	// CreatedAt is when the marker was written (the writer's clock).
	CreatedAt time.Time
	// Previous is the ID of the epoch the writer remembered or replaced
	// ("" for none).
	Previous string
	// Note says why the marker was written: what a replica saw, or an
	// operator's name and reason. Empty for a new store.
	Note string
}

// EpochStore is implemented by the stores that keep an epoch marker: every
// store of idemproxy. The marker is kept where the key records are, so that
// whatever forgets them forgets the marker too, and it is never listed,
// expired or swept as a key record.
type EpochStore interface {
	// Epoch returns the marker, or (nil, nil) when there is none.
	Epoch(ctx context.Context) (*Epoch, error)
	// SwapEpoch atomically writes e when the marker's ID is old ("": when
	// there is no marker), and reports whether it wrote. It returns the
	// marker as it is after the call (e when written; nil when there is
	// none).
	SwapEpoch(ctx context.Context, old string, e Epoch) (cur *Epoch, swapped bool, err error)
}

// ErrKeysLost is returned (wrapped) for a reservation refused because the
// store lost its keys (its epoch marker went missing or was replaced) and
// no operator has accepted the loss yet, or because the replica is still
// waiting for other replicas to object to a new marker.
var ErrKeysLost = errors.New("the idempotency store lost its keys")

// ErrUnsafeSettings is returned (wrapped, usually in a *SettingError) for
// a reservation refused because the store runs with a setting that loses
// keys (Redis' eviction policy, no persistence) and the operator has not
// opted in to it: nothing was written, and the request must not be
// forwarded.
var ErrUnsafeSettings = errors.New("the idempotency store runs with a setting that may lose keys")

// SettingError says which setting of the store may lose keys and how to
// fix it. It wraps Err, which wraps ErrUnsafeSettings.
type SettingError struct {
	// Err is the backend's sentinel (for example redis.ErrEvictionPolicy).
	Err error
	// Setting names the store's setting, as its own configuration spells
	// it ("maxmemory-policy", "appendonly").
	Setting string
	// Seen is what was seen, without where ("allkeys-lru with maxmemory
	// 1048576 bytes").
	Seen string
	// Node is where it was seen (a Redis address), for logs; "" when not
	// known. It is never shown to a client.
	Node string
	// Why says how the setting loses keys.
	Why string
	// Fix says what the operator does: the setting's safe value, and the
	// opt-in that accepts it.
	Fix string
}

func (e *SettingError) Error() string {
	where := ""
	if e.Node != "" {
		where = " on " + e.Node
	}
	return fmt.Sprintf("%v: %s is %s%s; %s: %s", e.Err, e.Setting, e.Seen, where, e.Why, e.Fix)
}

func (e *SettingError) Unwrap() error { return e.Err }

// Keyspace is a keyspace's entry in a store's registry: the prefix under
// which routes store their keys (store.Key's first part) and the recipe
// those keys are made by. A key stored by one recipe is not found by
// another, so a keyspace whose recipe changed, or that no route claims
// any more while it still holds live keys, would forget answered requests:
// the program refuses or holds such a configuration until an operator
// decides.
type Keyspace struct {
	// Name is the keyspace (a route's keyspace, by default its name).
	Name string
	// Digest is a canonical digest of Recipe (lower-case hex).
	Digest string
	// Recipe says, for people, how the keys are made: the key's sources,
	// the scope and the normalisation.
	Recipe string
	// Routes names the routes that claimed the keyspace when it was
	// recorded, comma-separated.
	Routes string
	// UpdatedAt is when the entry was written (the writer's clock).
	UpdatedAt time.Time
}

// KeyspaceStore is implemented by the stores that keep a registry of
// keyspaces: every store of idemproxy. Like the epoch marker, the registry
// is kept where the key records are, so that whatever forgets them forgets
// it too, and it is never listed, expired, swept or reconciled as a key
// record.
type KeyspaceStore interface {
	// Keyspaces returns every entry of the registry, in no particular
	// order; none when it is empty.
	Keyspaces(ctx context.Context) ([]Keyspace, error)
	// PutKeyspace writes k, replacing the entry of the same name.
	PutKeyspace(ctx context.Context, k Keyspace) error
	// DropKeyspace removes the entry named name, and reports whether there
	// was one. The keys under the keyspace are left as they are (they
	// expire by their TTL).
	DropKeyspace(ctx context.Context, name string) (bool, error)
}
