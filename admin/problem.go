package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

// problem is a kind of admin error answer: an RFC 9457 problem whose type
// is proxy.ProblemTypePrefix followed by name, as the proxy's own.
type problem struct {
	name   string
	status int
	title  string
}

// The admin API's error answers. This table is the one place where an
// admin error gets its HTTP status, and problemFor the one place where an
// error of the store or the reconciler becomes one of them.
var (
	probUnauthorized    = problem{"unauthorized", http.StatusUnauthorized, "Bearer token missing or wrong"}
	probDisabled        = problem{"admin-api-disabled", http.StatusForbidden, "Admin API disabled: no token configured"}
	probAuthThrottled   = problem{"too-many-auth-failures", http.StatusTooManyRequests, "Too many failed authentications from this address"}
	probNotFound        = problem{"not-found", http.StatusNotFound, "No such admin endpoint"}
	probMethod          = problem{"method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed"}
	probUnknownRoute    = problem{"unknown-route", http.StatusNotFound, "No route with this name"}
	probScopeRequired   = problem{"scope-required", http.StatusBadRequest, "Scope parameter required"}
	probScopeNotAllowed = problem{"scope-not-allowed", http.StatusBadRequest, "Route is not scoped"}
	probNoRecord        = problem{"no-record", http.StatusNotFound, "No record for this key"}
	probKeyInFlight     = problem{"key-in-flight", http.StatusConflict, "Key in flight"}
	probKeyChanged      = problem{"key-changed", http.StatusConflict, "Key changed while it was being released"}
	probNotInDoubt      = problem{"key-not-in-doubt", http.StatusConflict, "Key not in doubt"}
	probLookupBusy      = problem{"lookup-running", http.StatusConflict, "Another lookup of this key is running"}
	probNoReconcile     = problem{"no-reconcile-lookup", http.StatusBadRequest, "Route has no reconcile lookup"}
	probNoReconciler    = problem{"reconcile-unavailable", http.StatusNotFound, "Reconciliation not available"}
	probBadParameter    = problem{"invalid-parameter", http.StatusBadRequest, "Invalid query parameter"}
	probNoLister        = problem{"listing-unavailable", http.StatusNotFound, "Listing keys not available"}
	probNoReload        = problem{"reload-unavailable", http.StatusNotFound, "Reload not available"}
	probReloadFailed    = problem{"reload-failed", http.StatusBadRequest, "Reload failed; the running configuration is kept"}
	// The proxy's problem of the same name: the store did not answer.
	probStoreUnavailable = problem{"store-unavailable", http.StatusServiceUnavailable, "Idempotency store unavailable"}
	probInternal         = problem{"internal-error", http.StatusInternalServerError, "Answer could not be encoded"}
)

// problemFor maps an error of the store or the reconciler to its problem;
// an error it does not know is the store's failure.
func problemFor(err error) problem {
	switch {
	case errors.Is(err, store.ErrNotOwner):
		return probKeyChanged
	case errors.Is(err, store.ErrNotInDoubt):
		return probNotInDoubt
	case errors.Is(err, store.ErrLookupBusy):
		return probLookupBusy
	case errors.Is(err, store.ErrBadCursor):
		return probBadParameter
	case errors.Is(err, proxy.ErrNoReconcile):
		return probNoReconcile
	default:
		return probStoreUnavailable
	}
}

// Problems lists every problem the admin API can answer with, for the docs
// and tests: name, status and title.
func Problems() []struct {
	Name   string
	Status int
	Title  string
} {
	all := []problem{probUnauthorized, probDisabled, probAuthThrottled, probNotFound, probMethod, probUnknownRoute, probScopeRequired,
		probScopeNotAllowed, probNoRecord, probKeyInFlight, probKeyChanged, probNotInDoubt, probLookupBusy,
		probNoReconcile, probNoReconciler, probBadParameter, probNoLister, probNoReload, probReloadFailed, probStoreUnavailable, probInternal}
	out := make([]struct {
		Name   string
		Status int
		Title  string
	}, len(all))
	for i, p := range all {
		out[i].Name, out[i].Status, out[i].Title = p.name, p.status, p.title
	}
	return out
}

// writeProblem answers with an RFC 9457 problem body, in the proxy's form:
// type, title, status, the request's path as instance, detail when not
// empty, and the extension members of ext.
func writeProblem(w http.ResponseWriter, r *http.Request, p problem, detail string, ext map[string]string) {
	body := map[string]any{
		"type":     proxy.ProblemTypePrefix + p.name,
		"title":    p.title,
		"status":   p.status,
		"instance": r.URL.Path,
	}
	if detail != "" {
		body["detail"] = detail
	}
	for k, v := range ext {
		body[k] = v
	}
	b, _ := json.Marshal(body) // only strings and numbers: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.status)
	w.Write(b)
}
