package admin

import (
	"errors"
	"net/http"
	"slices"

	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// The admin API's error answers, written by problem.Write as the proxy's
// are. This table is the one place where an admin error gets its HTTP
// status, and problemFor the one place where an error of the store or the
// reconciler becomes one of them.
var (
	probUnauthorized    = problem.Type{Name: "unauthorized", Status: http.StatusUnauthorized, Title: "Bearer token missing or wrong"}
	probDisabled        = problem.Type{Name: "admin-api-disabled", Status: http.StatusForbidden, Title: "Admin API disabled: no token configured"}
	probAuthThrottled   = problem.Type{Name: "too-many-auth-failures", Status: http.StatusTooManyRequests, Title: "Too many failed authentications from this address"}
	probNotFound        = problem.Type{Name: "not-found", Status: http.StatusNotFound, Title: "No such admin endpoint"}
	probMethod          = problem.Type{Name: "method-not-allowed", Status: http.StatusMethodNotAllowed, Title: "Method not allowed"}
	probUnknownRoute    = problem.Type{Name: "unknown-route", Status: http.StatusNotFound, Title: "No route with this name"}
	probScopeRequired   = problem.Type{Name: "scope-required", Status: http.StatusBadRequest, Title: "Scope parameter required"}
	probScopeNotAllowed = problem.Type{Name: "scope-not-allowed", Status: http.StatusBadRequest, Title: "Route is not scoped"}
	probNoRecord        = problem.Type{Name: "no-record", Status: http.StatusNotFound, Title: "No record for this key"}
	probKeyInFlight     = problem.Type{Name: "key-in-flight", Status: http.StatusConflict, Title: "Key in flight"}
	probKeyChanged      = problem.Type{Name: "key-changed", Status: http.StatusConflict, Title: "Key changed while it was being released"}
	probStale           = problem.Type{Name: "key-changed-since-read", Status: http.StatusPreconditionFailed, Title: "Key changed since it was read"}
	probNotInDoubt      = problem.Type{Name: "key-not-in-doubt", Status: http.StatusConflict, Title: "Key not in doubt"}
	probLookupBusy      = problem.Type{Name: "lookup-running", Status: http.StatusConflict, Title: "Another lookup of this key is running"}
	probNoReconcile     = problem.Type{Name: "no-reconcile-lookup", Status: http.StatusBadRequest, Title: "Route has no reconcile lookup"}
	probNoReconciler    = problem.Type{Name: "reconcile-unavailable", Status: http.StatusNotFound, Title: "Reconciliation not available"}
	probBadParameter    = problem.Type{Name: "invalid-parameter", Status: http.StatusBadRequest, Title: "Invalid query parameter"}
	probNoLister        = problem.Type{Name: "listing-unavailable", Status: http.StatusNotFound, Title: "Listing keys not available"}
	probNoReload        = problem.Type{Name: "reload-unavailable", Status: http.StatusNotFound, Title: "Reload not available"}
	probReloadFailed    = problem.Type{Name: "reload-failed", Status: http.StatusBadRequest, Title: "Reload failed; the running configuration is kept"}
	probNoKeyspace      = problem.Type{Name: "unknown-keyspace", Status: http.StatusNotFound, Title: "No keyspace of this name in the store's registry"}
	// The proxy's problem of the same name: the store did not answer.
	probStoreUnavailable = problem.StoreUnavailable
	probInternal         = problem.Type{Name: "internal-error", Status: http.StatusInternalServerError, Title: "Answer could not be encoded"}
)

// problemFor maps an error of the store or the reconciler to its problem;
// an error it does not know is the store's failure.
func problemFor(err error) problem.Type {
	switch {
	case errors.Is(err, store.ErrNotOwner):
		return probKeyChanged
	case errors.Is(err, store.ErrNotInDoubt):
		return probNotInDoubt
	case errors.Is(err, store.ErrLookupBusy):
		return probLookupBusy
	case errors.Is(err, store.ErrBadCursor):
		return probBadParameter
	case errors.Is(err, reconcile.ErrNoLookup):
		return probNoReconcile
	case errors.Is(err, errBadText):
		return probBadParameter
	case errors.Is(err, errNoRecord):
		return probNoRecord
	case errors.Is(err, errKeyInFlight):
		return probKeyInFlight
	case errors.Is(err, errChanged):
		return probStale
	case errors.Is(err, errNoReconciler):
		return probNoReconciler
	case errors.Is(err, ErrNoKeyspace):
		return probNoKeyspace
	default:
		return probStoreUnavailable
	}
}

// problems is every problem the admin API can answer with.
var problems = []problem.Type{probUnauthorized, probDisabled, probAuthThrottled, probNotFound, probMethod, probUnknownRoute, probScopeRequired,
	probScopeNotAllowed, probNoRecord, probKeyInFlight, probKeyChanged, probStale, probNotInDoubt, probLookupBusy,
	probNoReconcile, probNoReconciler, probBadParameter, probNoLister, probNoReload, probReloadFailed, probNoKeyspace, probStoreUnavailable, probInternal}

// Problems lists every problem the admin API can answer with, for the docs
// and tests: name, status and title.
func Problems() []problem.Type { return slices.Clone(problems) }
