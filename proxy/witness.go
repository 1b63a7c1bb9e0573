package proxy

import (
	"context"
	"net/http"

	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/store"
)

// witnessLost judges a reservation that just succeeded (a.token set) by
// the witness of the keys this replica answered (internal/witness), and
// reports whether it answered the request. A key answered here within the
// window, that nobody released on purpose, was lost by the store: the
// store is marked lost (the witness tells the epoch watcher, after a round
// of canaries), and the request, a retry of an answered request, is
// refused with 503 store-lost-keys, never forwarded. Its reservation is
// kept, in doubt: released, the key would be free for a retry on a
// replica that has not seen the loss yet, which would charge it again; in
// doubt, a person (or the route's reconcile lookup) settles it, as any key
// whose outcome is not known here. A route in observe mode, which never
// refuses, forwards the request all the same: the loss is reported just
// as well. When the release marks cannot be read, whether the key was
// released on purpose is not known: the reservation is released and the
// request answered as a store failure.
func (a *attempt) witnessLost(w http.ResponseWriter, body []byte) bool {
	if a.p.witness == nil || !a.p.witness.Seen(a.storeKey) {
		return false // the normal path: one look at the table
	}
	ctx, cancel := context.WithTimeout(a.detached(), storeTimeout)
	defer cancel()
	reason := "a key of route " + a.routeName() + " (key_hash " + store.KeyHash(a.storeKey) +
		") that this replica answered within the witness window (" + a.p.witness.Window().String() +
		") was free again, released by no one: the store lost it"
	v, err := a.p.witness.Judge(ctx, a.storeKey, reason)
	switch {
	case v == witness.Unknown:
		a.release()
		a.token = ""
		a.storeFailed(w, body, "get", err)
		return true
	case v != witness.Lost || a.observing():
		return false
	}
	a.markInDoubt()
	a.problem(w, OutcomeStoreError, probStoreLostKeys, "the idempotency store lost this key, which this replica "+
		"answered before: nothing was forwarded, and the key is in doubt; retry later (an operator must accept the loss)", 5, nil)
	return true
}
