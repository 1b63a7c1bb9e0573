package admin

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// An operator acts on a key in one of two ways, release and reconcile,
// from the key API (DELETE, POST .../reconcile) or from the console. Both
// go through releaseKey and reconcileKeyAct: the same store calls, the same
// fencing by the record's owner token, the same audit line.

// action is an operator's act on one key, from the key API or the console.
type action struct {
	// Operator and Reason go to the audit line; an empty Operator leaves
	// the attribute out.
	Operator, Reason string
	// Force releases a key in flight (its request is at the upstream now).
	Force bool
	// Version, when set, is the Version of the record the operator saw:
	// the act is refused with errChanged unless the record still is that.
	// Empty: no check.
	Version string
	// RemoteAddr and UserAgent say where the act came from, for the audit
	// line.
	RemoteAddr, UserAgent string
	// Via is "api" or "console", for the audit line.
	Via string
}

// The refusals of an act, before the store is written.
var (
	// errChanged: the record is not the one the operator saw (action.Version).
	errChanged = errors.New("the key changed since it was read")
	// errKeyInFlight: a release of a key in flight without action.Force.
	errKeyInFlight = errors.New("the key is in flight: its request is being forwarded now")
	// errNoRecord: no record under the key.
	errNoRecord = errors.New(noRecord)
	// errNoReconciler: the store cannot reconcile.
	errNoReconciler = errors.New("reconciliation is not available with this store")
)

// Version returns a short digest of what an operator decides on: the
// record's state, owner token (a new reservation has a new one), creation
// and lease times, stored status and origin. Not its expiry, which some
// stores report as a time to live, anew at every read.
func Version(rec *store.Record) string {
	h := sha256.New()
	var b [8]byte
	put := func(s string) {
		binary.BigEndian.PutUint64(b[:], uint64(len(s)))
		h.Write(b[:])
		h.Write([]byte(s))
	}
	put(string(rec.State))
	put(rec.Token)
	put(rec.Fingerprint)
	put(rec.Origin)
	for _, t := range []time.Time{rec.CreatedAt, rec.LeaseExpiresAt} {
		binary.BigEndian.PutUint64(b[:], uint64(t.UnixMilli()))
		h.Write(b[:])
	}
	status := 0
	if rec.Response != nil {
		status = rec.Response.Status
	}
	binary.BigEndian.PutUint64(b[:], uint64(status))
	h.Write(b[:])
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// errBadText is wrapped by an act refused for its reason or operator: too
// long, not UTF-8, or holding a control or bidirectional character that
// would make its audit line read otherwise than it is.
var errBadText = errors.New("invalid text")

// checkText refuses an act whose reason or operator (each optional here;
// the console requires both) the audit line could not hold as it is.
func (act action) checkText() error {
	if act.Reason != "" {
		if why := checkReason(act.Reason); why != "" {
			return fmt.Errorf("%w: %s", errBadText, why)
		}
	}
	if act.Operator != "" {
		if why := checkOperator(act.Operator); why != "" {
			return fmt.Errorf("%w: the operator %s", errBadText, strings.TrimPrefix(why, "your name "))
		}
	}
	return nil
}

// current reads the record under storeKey for act: errNoRecord when there
// is none, errChanged when it is not the version act names.
func (h *Handler) current(ctx context.Context, storeKey string, act action) (*store.Record, error) {
	if err := act.checkText(); err != nil {
		return nil, err
	}
	rec, err := h.opts.Store.Get(ctx, storeKey)
	switch {
	case err != nil:
		return nil, err
	case rec == nil:
		return nil, errNoRecord
	case act.Version != "" && Version(rec) != act.Version:
		return rec, errChanged
	}
	return rec, nil
}

// releaseKey releases the record under storeKey (a key of route) for act,
// and writes the audit line; it returns the record it released. Only that
// record is released, fenced by its owner token: a record that replaced it
// meanwhile (a reservation made after a lookup or the TTL removed it,
// whose request may be at the upstream now) is left alone (store.ErrNotOwner),
// or a retry would be forwarded while that request is still processed.
func (h *Handler) releaseKey(ctx context.Context, route, storeKey string, act action) (*store.Record, error) {
	prev, err := h.current(ctx, storeKey, act)
	if err != nil {
		return prev, err
	}
	if prev.State == store.StateInFlight && !act.Force {
		// Its request is at the upstream right now: a retry let through
		// by a release would be forwarded a second time.
		return prev, errKeyInFlight
	}
	if h.opts.MarkReleased != nil {
		// First: from the release on, a replica that answered the key
		// must find the mark when it sees the key free.
		if err := h.opts.MarkReleased(ctx, storeKey); err != nil {
			return prev, err
		}
	}
	if err := h.opts.Store.Release(ctx, storeKey, prev.Token); err != nil {
		return prev, err
	}
	h.audit("key released by an operator", route, storeKey, act,
		slog.String("previous_state", string(prev.State)))
	return prev, nil
}

// reconcileKeyAct asks the upstream, through the route's lookup, whether
// the in-doubt record under storeKey was applied, settles it by the answer
// and writes the audit line.
func (h *Handler) reconcileKeyAct(ctx context.Context, route, storeKey string, act action) (reconcile.Outcome, error) {
	if h.opts.Reconciler == nil {
		return reconcile.Outcome{}, errNoReconciler
	}
	if _, err := h.current(ctx, storeKey, act); err != nil {
		return reconcile.Outcome{}, err
	}
	out, err := h.opts.Reconciler.Reconcile(ctx, storeKey)
	if err != nil {
		return out, err
	}
	h.audit("key reconciled by an operator", route, storeKey, act, slog.String("result", out.Result))
	return out, nil
}

// audit writes an act's audit line: what was done (msg, attrs), to which
// key (its hash, never the key), by whom, why, from where and how.
func (h *Handler) audit(msg, route, storeKey string, act action, attrs ...slog.Attr) {
	sum := sha256.Sum256([]byte(storeKey))
	line := append([]slog.Attr{
		slog.String("route", route),
		slog.String("key_hash", hexPrefix(sum[:6])),
	}, attrs...)
	line = append(line,
		operatorAttr(act.Operator),
		slog.String("reason", act.Reason),
		slog.String("via", act.Via),
		slog.String("remote_addr", act.RemoteAddr),
		slog.String("user_agent", act.UserAgent),
		slog.String("at", time.Now().UTC().Format(time.RFC3339Nano)))
	h.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn, msg, line...)
}
