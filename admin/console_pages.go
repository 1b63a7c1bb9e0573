package admin

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/store"
)

// The console's bounds.
const (
	// overviewScan is the most keys of a route the overview reads per
	// view.
	overviewScan = 10_000
	// consolePageSize is the most keys a page of the in-doubt list shows.
	consolePageSize = 100
	// bodyShown is the most bytes of a stored body the key page shows.
	bodyShown = 64 << 10
)

// scopeHashPattern is a store key's scope part: "-" or a scope's hash.
var scopeHashPattern = regexp.MustCompile(`^(-|[0-9a-f]{32})$`)

// routeNames returns the running routes' names, none when Routes cannot
// list them.
func (c *console) routeNames() []string {
	if n, ok := c.h.opts.Routes.(RouteNamer); ok {
		return n.RouteNames()
	}
	return nil
}

// routeRow is a route's line in the overview.
type routeRow struct {
	Name                         string
	InDoubt, InFlight, Completed string
	Oldest                       string
	Capped                       bool
	Err                          string
	Link                         string
}

func (c *console) overview(w http.ResponseWriter, r *http.Request, se *session) {
	lister := c.h.lister()
	if lister == nil {
		c.fail(w, r, se, http.StatusNotFound, "this store cannot list its keys")
		return
	}
	now := time.Now()
	var rows []routeRow
	for _, name := range c.routeNames() {
		row := routeRow{Name: name, Link: "/ui/keys?" + url.Values{"route": {name}}.Encode()}
		// One store call reads at most overviewScan keys (the listing's
		// own bound): every state, counted here.
		page, err := c.h.listPages(r.Context(), lister, name, store.ListQuery{Prefix: c.h.keyspace(name) + "/", Limit: overviewScan}, 1)
		if err != nil {
			_, row.Err = listProblem(err)
			rows = append(rows, row)
			continue
		}
		counts := map[store.State]int{}
		var oldest time.Time
		for _, k := range page.Keys {
			counts[k.State]++
			if k.State == store.StateInDoubt && (oldest.IsZero() || k.CreatedAt.Before(oldest)) {
				oldest = k.CreatedAt
			}
		}
		row.Capped = page.NextCursor != ""
		count := func(n int) string {
			s := thousands(n)
			if row.Capped {
				s += "+"
			}
			return s
		}
		row.InDoubt, row.InFlight, row.Completed = count(counts[store.StateInDoubt]), count(counts[store.StateInFlight]), count(counts[store.StateCompleted])
		row.Oldest = "none"
		if row.Capped {
			row.Oldest = "none among the first " + thousands(overviewScan)
		}
		if !oldest.IsZero() {
			row.Oldest = ageOf(now.Sub(oldest))
			if row.Capped {
				row.Oldest = "at least " + row.Oldest
			}
		}
		rows = append(rows, row)
	}
	c.render(w, http.StatusOK, "overview", pageView{Title: "Overview", Session: viewOf(se),
		Data: map[string]any{"Routes": rows, "Scan": thousands(overviewScan)}})
}

// keyRow is a key's line in the in-doubt list.
type keyRow struct {
	Key, KeyHash, ScopeHash string
	Created, Age, Expires   string
	Link                    string
	// Sel is the value of its bulk-release checkbox: where the key is and
	// the version shown.
	Sel string
}

// keysView is the in-doubt list.
type keysView struct {
	RouteNames                     []string
	Route, MinAge, KeyHash, Cursor string
	Listed                         bool
	Rows                           []keyRow
	Next                           string
}

// keys is the list of a route's keys in doubt, one page of the key API's
// listing (listRoute) filtered by age.
func (c *console) keys(w http.ResponseWriter, r *http.Request, se *session) {
	qv := r.URL.Query()
	v := keysView{RouteNames: c.routeNames(), Route: qv.Get("route"), MinAge: qv.Get("min_age"), KeyHash: qv.Get("key_hash"), Cursor: qv.Get("cursor")}
	if v.Route == "" && len(v.RouteNames) > 0 {
		v.Route = v.RouteNames[0]
	}
	page := pageView{Title: "Keys in doubt", Session: viewOf(se), Data: &v}
	if v.Route == "" {
		page.Error = "name a route"
		c.render(w, http.StatusOK, "keys", page)
		return
	}
	minAge, err := parseAge(v.MinAge)
	if err != nil {
		page.Error = err.Error()
		c.render(w, http.StatusBadRequest, "keys", page)
		return
	}
	list, err := c.h.listRoute(r.Context(), v.Route, url.Values{"state": {string(store.StateInDoubt)}, "key_hash": {v.KeyHash},
		"cursor": {v.Cursor}, "limit": {strconv.Itoa(consolePageSize)}}, listCalls)
	if err != nil {
		prob, detail := listProblem(err)
		page.Error = detail
		c.render(w, prob.Status, "keys", page)
		return
	}
	v.Listed = true
	now := time.Now()
	for _, k := range list.Keys {
		if now.Sub(k.CreatedAt) < minAge {
			continue
		}
		sk := c.h.keyspace(v.Route) + "/" + k.ScopeHash + "/" + k.Key
		// The version the page shows, for a bulk release to refuse a key
		// that changed since; a key gone or settled meanwhile is left out.
		rec, err := c.h.opts.Store.Get(r.Context(), sk)
		if err != nil {
			page.Error = "the store did not answer: " + err.Error()
			c.render(w, problemFor(err).Status, "keys", page)
			return
		}
		if rec == nil || rec.State != store.StateInDoubt {
			continue
		}
		v.Rows = append(v.Rows, keyRow{Key: k.Key, KeyHash: k.KeyHash, ScopeHash: k.ScopeHash,
			Created: timeOf(k.CreatedAt), Age: ageOf(now.Sub(k.CreatedAt)), Expires: whenOf(k.ExpiresAt, now),
			Link: keyLink(v.Route, k.ScopeHash, k.Key),
			Sel:  url.Values{"s": {k.ScopeHash}, "k": {k.Key}, "v": {Version(rec)}}.Encode()})
	}
	if list.NextCursor != "" {
		v.Next = "/ui/keys?" + url.Values{"route": {v.Route}, "min_age": {v.MinAge}, "key_hash": {v.KeyHash}, "cursor": {list.NextCursor}}.Encode()
	}
	c.render(w, http.StatusOK, "keys", page)
}

// keyLink is the key page of a key. A key "." or ".." goes in the query
// (?key=), since a browser, and the router, remove a dot segment from a
// path whether or not it is escaped: in the path, its link would open
// another page.
func keyLink(route, scopeHash, key string) string {
	link, q := "/ui/keys/"+url.PathEscape(route)+"/", url.Values{}
	if key == "." || key == ".." {
		q.Set("key", key)
	} else {
		link += url.PathEscape(key)
	}
	if scopeHash != "-" {
		q.Set("scope_hash", scopeHash)
	}
	if len(q) > 0 {
		link += "?" + q.Encode()
	}
	return link
}

// parseAge reads a minimum age: a Go duration (90m, 1h30m) or a number of
// days (2d); "" is none.
func parseAge(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		// A number of days past time.Duration's range would wrap.
		if n, err := strconv.Atoi(days); err == nil && n >= 0 && n <= int(math.MaxInt64/(24*time.Hour)) {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("min_age %q is not an age such as 30m, 1h or 2d", s)
	}
	return d, nil
}

// keyPlace is a key the console acts on: its route, raw key, scope hash
// and store key.
type keyPlace struct {
	route, key, scopeHash, storeKey string
}

// place resolves a key of route given its scope (the raw scope header
// value) or its scope hash (as a listing shows it); it returns the status
// and message of a refusal.
func (c *console) place(route, key, scope, scopeHash string) (keyPlace, int, string) {
	header, ok := c.h.opts.Routes.RouteScope(route)
	if !ok {
		return keyPlace{}, http.StatusNotFound, "no route named " + strconv.Quote(route)
	}
	if scope != "" {
		scopeHash = strings.TrimSuffix(strings.TrimPrefix(store.Key(route, scope, ""), route+"/"), "/")
	}
	if scopeHash == "" {
		scopeHash = "-"
	}
	switch {
	case !scopeHashPattern.MatchString(scopeHash):
		return keyPlace{}, http.StatusBadRequest, "scope_hash " + strconv.Quote(scopeHash) + " is not the 32 hex digits of a listing's scope_hash"
	case header != "" && scopeHash == "-":
		return keyPlace{}, http.StatusBadRequest, "route " + route + " is scoped by the " + header + " header: pass its value as ?scope=, or a listing's ?scope_hash="
	case header == "" && scopeHash != "-":
		return keyPlace{}, http.StatusBadRequest, "route " + route + " is not scoped: drop ?scope="
	}
	return keyPlace{route: route, key: key, scopeHash: scopeHash, storeKey: c.h.keyspace(route) + "/" + scopeHash + "/" + key}, 0, ""
}

// recordView is a record as the key page shows it: everything the store
// has.
type recordView struct {
	State                   store.State
	Created, Expires, Lease string
	Token, Fingerprint      string
	Origin, TraceID, SpanID string
	Status                  string
	Headers, Trailers       string
	Body                    bodyView
	// NoAnswer, for a record without an answer, says why there is none,
	// in place of the stored headers and body.
	NoAnswer string
}

// keyPageView is the key page.
type keyPageView struct {
	Route, Key, KeyHash, ScopeHash string
	Rec                            *recordView
	Version                        string
	InFlight, CanReconcile         bool
	ReconcileNote                  string
}

func (c *console) key(w http.ResponseWriter, r *http.Request, se *session) {
	qv := r.URL.Query()
	key := r.PathValue("key")
	if key == "" {
		key = qv.Get("key") // "." or ".." (keyLink)
	}
	p, status, msg := c.place(r.PathValue("route"), key, qv.Get("scope"), qv.Get("scope_hash"))
	if status != 0 {
		c.fail(w, r, se, status, msg)
		return
	}
	status, res := http.StatusOK, (*resultView)(nil)
	if f, ok := se.takeFlash(qv.Get("done")); ok {
		status, res = f.status, f.result
	}
	c.showKey(w, r, se, p, status, res)
}

// actDone answers an act on the key p with a redirect to its key page,
// which shows res once, with status (post/redirect/get): reloading the
// page shows the key as it is, and submits nothing again.
func (c *console) actDone(w http.ResponseWriter, r *http.Request, se *session, p keyPlace, status int, res *resultView) {
	link := keyLink(p.route, p.scopeHash, p.key)
	sep := "?"
	if strings.Contains(link, "?") {
		sep = "&"
	}
	http.Redirect(w, r, link+sep+"done="+se.putFlash(flash{status: status, result: res}), http.StatusSeeOther)
}

// showKey answers the key page of p, read now, with the result of an act
// on it when there was one.
func (c *console) showKey(w http.ResponseWriter, r *http.Request, se *session, p keyPlace, status int, res *resultView) {
	v := keyPageView{Route: p.route, Key: p.key, KeyHash: store.KeyHash(p.storeKey), ScopeHash: p.scopeHash}
	page := pageView{Title: "Key " + p.key, Session: viewOf(se), Result: res, Data: &v}
	rec, err := c.h.opts.Store.Get(r.Context(), p.storeKey)
	if err != nil {
		page.Error = "the store did not answer: " + err.Error()
		c.render(w, problemFor(err).Status, "key", page)
		return
	}
	if rec == nil && res == nil {
		status = http.StatusNotFound // a page asked for, not the outcome of a release
	}
	if rec != nil {
		v.Rec, v.Version, v.InFlight = showRecord(rec, time.Now()), Version(rec), rec.State == store.StateInFlight
		switch {
		case c.h.opts.Reconciler == nil:
			v.ReconcileNote = "Reconcile is not available with this store."
		case rec.State != store.StateInDoubt:
			v.ReconcileNote = "Only a key in doubt is reconciled; this one is " + string(rec.State) + "."
		default:
			v.CanReconcile = true
		}
	}
	c.render(w, status, "key", page)
}

// showRecord is rec as the key page shows it.
func showRecord(rec *store.Record, now time.Time) *recordView {
	v := &recordView{State: rec.State, Created: timeOf(rec.CreatedAt), Expires: whenOf(ptrTime(rec.ExpiresAt), now),
		Lease: whenOf(ptrTime(rec.LeaseExpiresAt), now), Token: rec.Token, Fingerprint: rec.Fingerprint, Origin: "none (not traced)",
		Status: "none", NoAnswer: noAnswer(rec.State)}
	if rec.Origin != "" {
		v.Origin = rec.Origin
		if trace, span, ok := strings.Cut(rec.Origin, "-"); ok {
			v.TraceID, v.SpanID = trace, span
		} else {
			v.TraceID = rec.Origin
		}
	}
	if resp := rec.Response; resp != nil {
		v.NoAnswer = ""
		v.Status = strconv.Itoa(resp.Status)
		if t := http.StatusText(resp.Status); t != "" {
			v.Status += " " + t
		}
		if resp.Reconciled {
			v.Status += " (from a reconcile lookup)"
		}
		v.Headers, v.Trailers = showHeader(resp.Header), showHeader(resp.Trailer)
		if v.Headers == "" {
			v.Headers = "(none stored)"
		}
		if resp.BodyStored {
			v.Body = showBody(resp.Body)
		} else {
			v.Body = bodyView{Note: "the body was not stored: it was larger than the storage cap, so the answer cannot be replayed"}
		}
	}
	return v
}

// noAnswer says why a record in state has no stored answer.
func noAnswer(state store.State) string {
	switch state {
	case store.StateInDoubt:
		return "No answer is stored, and none will come: the request reached the upstream, but its answer was lost " +
			"(a timeout, a reset, a crash or a shutdown of the proxy). Whether the upstream processed it is what " +
			"you decide here: ask the upstream (reconcile, where the route has a lookup), or release the key once " +
			"you know it did not; until then retries get 409 outcome-in-doubt."
	case store.StateInFlight:
		return "No answer is stored yet: the request is being forwarded now, and its answer is stored when it comes " +
			"(or the key turns in doubt when its lease ends without one)."
	}
	return "No answer is stored: the key is " + string(state) + "."
}

// showHeader is h as lines "Name: value", sorted by name.
func showHeader(h http.Header) string {
	var b strings.Builder
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}) {
		for _, v := range h[name] {
			b.WriteString(name + ": " + v + "\n")
		}
	}
	return b.String()
}

// bodyView is a stored body as the key page shows it: text when it is
// UTF-8 without control characters, else a hex dump; the first bodyShown
// bytes at most.
type bodyView struct {
	Text string
	Hex  bool
	Note string
}

// showBody is b as the key page shows it.
func showBody(b []byte) bodyView {
	shown := b[:min(len(b), bodyShown)]
	text := shown
	if len(shown) < len(b) {
		// A cut through a character is not binary: leave the character
		// out.
		for i := 0; i < utf8.UTFMax-1 && len(text) > 0 && !utf8.Valid(text); i++ {
			text = text[:len(text)-1]
		}
	}
	var v bodyView
	if utf8.Valid(text) && !strings.ContainsFunc(string(text), func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' }) {
		v.Text, shown = string(text), text
		v.Note = thousands(len(b)) + " bytes, text"
	} else {
		v.Text, v.Hex = hex.Dump(shown), true
		v.Note = thousands(len(b)) + " bytes, binary (not UTF-8 text, or holding control characters): shown as a hex dump"
	}
	switch {
	case len(b) == 0:
		v.Note = "empty"
	case len(shown) < len(b):
		v.Note += "; the first " + thousands(len(shown)) + " bytes are shown, " + thousands(len(b)-len(shown)) + " more bytes are not"
	}
	return v
}

// actForm is the key an act's form names, and its act.
func (c *console) actForm(r *http.Request, se *session) (keyPlace, action, int, string) {
	f := r.PostForm
	p, status, msg := c.place(f.Get("route"), f.Get("key"), "", f.Get("scope_hash"))
	if status != 0 {
		return p, action{}, status, msg + ": nothing was done"
	}
	act := action{Operator: se.operator, Reason: strings.TrimSpace(f.Get("reason")), Force: f.Get("force") == "true",
		Version: f.Get("version"), RemoteAddr: r.RemoteAddr, UserAgent: r.UserAgent(), Via: "console"}
	if msg := checkReason(act.Reason); msg != "" {
		return p, act, http.StatusBadRequest, msg + ": nothing was done"
	}
	switch {
	case act.Version == "":
		return p, act, http.StatusBadRequest, "the form does not say which version of the key you saw: nothing was done; look again"
	}
	return p, act, 0, ""
}

func (c *console) reconcile(w http.ResponseWriter, r *http.Request, se *session) {
	p, act, status, msg := c.actForm(r, se)
	if status != 0 {
		c.refuse(w, r, se, p, status, msg)
		return
	}
	out, err := c.h.reconcileKeyAct(r.Context(), p.route, p.storeKey, act)
	if err != nil {
		c.actDone(w, r, se, p, problemFor(err).Status, &resultView{Message: "reconcile refused: " + actMessage(err)})
		return
	}
	res := &resultView{OK: out.Result != reconcile.ResultError, Message: "reconcile: " + out.Result}
	switch out.Result {
	case reconcile.ResultApplied:
		res.Message += ": the upstream processed the request; the key is completed with the lookup's answer, replayed to retries"
	case reconcile.ResultNotApplied:
		res.Message += ": the upstream did not process the request; the key was released, and the next retry is forwarded"
	default:
		res.Message += ": the lookup gave no answer to decide on; the key stays in doubt"
	}
	if out.LookupStatus != 0 {
		res.Lines = append(res.Lines, "lookup status: "+strconv.Itoa(out.LookupStatus))
	}
	if out.Error != "" {
		res.Lines = append(res.Lines, "error: "+out.Error)
	}
	c.actDone(w, r, se, p, http.StatusOK, res)
}

func (c *console) release(w http.ResponseWriter, r *http.Request, se *session) {
	p, act, status, msg := c.actForm(r, se)
	if status != 0 {
		c.refuse(w, r, se, p, status, msg)
		return
	}
	prev, err := c.h.releaseKey(r.Context(), p.route, p.storeKey, act)
	if err != nil {
		c.actDone(w, r, se, p, problemFor(err).Status, &resultView{Message: "release refused: " + actMessage(err)})
		return
	}
	c.actDone(w, r, se, p, http.StatusOK, &resultView{OK: true,
		Message: "released: the key was " + string(prev.State) + "; the next retry with it is forwarded"})
}

// refuse answers an act refused before it was tried: the key page with
// the reason, or an error page when the form names no key.
func (c *console) refuse(w http.ResponseWriter, r *http.Request, se *session, p keyPlace, status int, msg string) {
	if p.storeKey == "" {
		c.fail(w, r, se, status, msg)
		return
	}
	c.actDone(w, r, se, p, status, &resultView{Message: msg})
}

// actMessage says why an act was refused or failed, and what to do.
func actMessage(err error) string {
	switch {
	case errors.Is(err, errChanged):
		return "this key changed since you loaded the page: look again; nothing was done"
	case errors.Is(err, errKeyInFlight):
		return "the key is in flight: its request is being forwarded now; wait for it to settle, or tick force"
	case errors.Is(err, errNoRecord):
		return "there is no record for this key (never seen, released or expired)"
	case errors.Is(err, store.ErrNotOwner):
		return "the key changed while it was being released (settled, expired or reserved again): look again; nothing was done"
	case errors.Is(err, store.ErrNotInDoubt):
		return "the key is not in doubt: only a key in doubt is reconciled"
	case errors.Is(err, store.ErrLookupBusy):
		return "another lookup of this key is running: look again in a moment"
	case errors.Is(err, reconcile.ErrNoLookup):
		return "the route has no reconcile lookup"
	case errors.Is(err, errNoReconciler):
		return err.Error()
	}
	return "the store did not answer: " + err.Error()
}

// bulkOutcome is a key's line in a bulk release's result.
type bulkOutcome struct {
	Key, KeyHash, Message string
	OK                    bool
}

// bulkRelease releases each key selected on a page of the in-doubt list
// through releaseKey, as a single release does, once the operator typed
// "release N keys".
func (c *console) bulkRelease(w http.ResponseWriter, r *http.Request, se *session) {
	f := r.PostForm
	route := f.Get("route")
	back := "/ui/keys?" + url.Values{"route": {route}, "min_age": {f.Get("min_age")}, "key_hash": {f.Get("key_hash")}, "cursor": {f.Get("cursor")}}.Encode()
	data := map[string]any{"Back": back}
	done := func(status int, res *resultView) {
		http.Redirect(w, r, "/ui/bulk-release?done="+se.putFlash(flash{status: status, result: res, data: data}), http.StatusSeeOther)
	}
	refuse := func(status int, msg string) { done(status, &resultView{Message: msg + ": nothing was done"}) }
	sel := f["sel"]
	reason, confirm := strings.TrimSpace(f.Get("reason")), strings.Join(strings.Fields(f.Get("confirm")), " ")
	want := "release " + strconv.Itoa(len(sel)) + " keys"
	switch {
	case len(sel) == 0:
		refuse(http.StatusBadRequest, "no key is selected")
		return
	case len(sel) > maxListLimit:
		refuse(http.StatusBadRequest, "more than "+strconv.Itoa(maxListLimit)+" keys are selected")
		return
	case checkReason(reason) != "":
		refuse(http.StatusBadRequest, checkReason(reason))
		return
	case confirm != want && !(len(sel) == 1 && confirm == "release 1 key"):
		refuse(http.StatusBadRequest, "the confirmation does not match: type "+strconv.Quote(want)+" ("+strconv.Itoa(len(sel))+" keys are selected)")
		return
	}
	var places []keyPlace
	var versions []string
	for _, s := range sel {
		v, err := url.ParseQuery(s)
		if err != nil {
			refuse(http.StatusBadRequest, "a selected key is not one this console listed")
			return
		}
		p, status, msg := c.place(route, v.Get("k"), "", v.Get("s"))
		if status != 0 {
			refuse(status, msg)
			return
		}
		if v.Get("v") == "" {
			refuse(http.StatusBadRequest, "a selected key does not say which version of it you saw")
			return
		}
		places, versions = append(places, p), append(versions, v.Get("v"))
	}
	var outcomes []bulkOutcome
	released := 0
	for i, p := range places {
		act := action{Operator: se.operator, Reason: reason, Version: versions[i], RemoteAddr: r.RemoteAddr, UserAgent: r.UserAgent(), Via: "console"}
		o := bulkOutcome{Key: p.key, KeyHash: store.KeyHash(p.storeKey)}
		if prev, err := c.h.releaseKey(r.Context(), p.route, p.storeKey, act); err != nil {
			o.Message = "refused: " + actMessage(err)
		} else {
			o.OK, o.Message = true, "released (was "+string(prev.State)+")"
			released++
		}
		outcomes = append(outcomes, o)
	}
	data["Outcomes"] = outcomes
	done(http.StatusOK, &resultView{OK: released == len(places),
		Message: "released " + strconv.Itoa(released) + " of " + strconv.Itoa(len(places)) + " keys"})
}

// bulkResult shows a bulk release's outcome once, the page its POST
// redirects to; shown already, or never made, it says so.
func (c *console) bulkResult(w http.ResponseWriter, r *http.Request, se *session) {
	f, ok := se.takeFlash(r.URL.Query().Get("done"))
	if !ok {
		c.render(w, http.StatusNotFound, "bulk", pageView{Title: "Bulk release", Session: viewOf(se),
			Error: "no outcome of a bulk release to show: an outcome is shown once, after the release; the keys as they are now are on the list",
			Data:  map[string]any{"Back": "/ui/keys"}})
		return
	}
	c.render(w, f.status, "bulk", pageView{Title: "Bulk release", Session: viewOf(se), Result: f.result, Data: f.data})
}

// ptrTime is t, nil for the zero time.
func ptrTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// timeOf shows a time in UTC.
func timeOf(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// whenOf shows a time and how far it is from now; nil is "none".
func whenOf(t *time.Time, now time.Time) string {
	if t == nil {
		return "none"
	}
	if d := t.Sub(now); d >= 0 {
		return timeOf(*t) + " (in " + ageOf(d) + ")"
	}
	return timeOf(*t) + " (" + ageOf(now.Sub(*t)) + " ago)"
}

// ageOf shows a duration to the second, or beyond a day to the minute
// (1d4h05m).
func ageOf(d time.Duration) string {
	if d >= 24*time.Hour {
		m := int(d / time.Minute)
		return fmt.Sprintf("%dd%dh%02dm", m/(24*60), m/60%24, m%60)
	}
	return d.Truncate(time.Second).String()
}

// thousands shows n with a comma between thousands.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
