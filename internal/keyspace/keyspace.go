// Package keyspace checks a configuration's routes against the store's
// registry of keyspaces (store.KeyspaceStore), so that a config edit never
// silently starts a keyspace anew: a route renamed away from a keyspace
// that still holds live keys, or a keyspace whose key recipe changed while
// it holds live keys made by the old one. The program refuses a reload
// with findings, holds the routes concerned at start (503 keyspace-held),
// and -check reports them.
package keyspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
)

// Store is what the check needs of a store: its registry, and a listing to
// tell whether a keyspace holds live keys.
type Store interface {
	store.KeyspaceStore
	store.Lister
}

// Digest is the canonical digest of a key recipe (config.Route.KeyRecipe).
func Digest(recipe string) string {
	sum := sha256.Sum256([]byte(recipe))
	return hex.EncodeToString(sum[:16])
}

// Finding is one way a configuration would start a keyspace anew.
type Finding struct {
	// Route is the route that would, "" for a keyspace that no route
	// claims any more and no new keyspace replaces (a route removed).
	Route string
	// Keyspace is the route's keyspace (or the unclaimed one).
	Keyspace string
	// Orphans are the recorded keyspaces that hold live keys and that no
	// route claims, while Route starts a keyspace the registry does not
	// know.
	Orphans []store.Keyspace
	// Recorded is the recipe the keyspace's live keys were made by, when
	// Route makes them otherwise (Recipe).
	Recorded, Recipe string
}

// Reason says in a few words what is wrong, for a problem's detail and
// /readyz.
func (f Finding) Reason() string {
	switch {
	case f.Recorded != "":
		return fmt.Sprintf("route %s makes its keys by %q, but keyspace %s has live keys made by %q", f.Route, f.Recipe, f.Keyspace, f.Recorded)
	case f.Route == "":
		return fmt.Sprintf("keyspace %s (routes %s) has live keys and no route claims it any more", f.Keyspace, f.Orphans[0].Routes)
	}
	return fmt.Sprintf("route %s would start keyspace %s anew while %s has live keys and no route claims it", f.Route, f.Keyspace, orphanNames(f.Orphans))
}

// Fix says what the operator can do about it.
func (f Finding) Fix() string {
	const dropped = " -reason TEXT (its keys are then never found again: their retries are forwarded)"
	switch {
	case f.Recorded != "":
		return fmt.Sprintf("put route %s's key, scope and normalize back, or let the old keys go on purpose: idemproxy keys drop-keyspace %s", f.Route, f.Keyspace) + dropped
	case f.Route == "":
		return fmt.Sprintf("claim it again (keyspace: %s on the route that replaces %s), or let its keys go on purpose: idemproxy keys drop-keyspace %s",
			f.Keyspace, f.Orphans[0].Routes, f.Keyspace) + dropped
	}
	o := f.Orphans[0].Name
	return fmt.Sprintf("keep the old keys with keyspace: %s on route %s (every stored key replays), or let them go on purpose: idemproxy keys drop-keyspace %s",
		o, f.Route, o) + dropped
}

// Error is the finding with its fix, in one line.
func (f Finding) Error() string { return f.Reason() + ": " + f.Fix() }

// orphanNames names the orphans for a message.
func orphanNames(os []store.Keyspace) string {
	names := make([]string, len(os))
	for i, o := range os {
		names[i] = "keyspace " + o.Name + " (routes " + o.Routes + ")"
	}
	return strings.Join(names, ", ")
}

// Result is what Check found.
type Result struct {
	// Findings lists what would start a keyspace anew, by route (a
	// route's first finding only) and then the unclaimed keyspaces.
	Findings []Finding
	// Record lists the entries to write: the keyspaces of routes without
	// a finding that the registry does not hold as they are.
	Record []store.Keyspace
}

// Held maps each route with a finding to its reason.
func (r Result) Held() map[string]string {
	held := map[string]string{}
	for _, f := range r.Findings {
		if f.Route != "" {
			held[f.Route] = f.Reason()
		}
	}
	return held
}

// Err is nil without findings, else every finding in one error.
func (r Result) Err() error {
	if len(r.Findings) == 0 {
		return nil
	}
	msgs := make([]string, len(r.Findings))
	for i, f := range r.Findings {
		msgs[i] = f.Error()
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// claim is a keyspace as a configuration claims it.
type claim struct {
	recipe string
	routes []string
}

// Check compares routes with st's registry. It writes nothing: Record
// writes Result.Record. A keyspace's live keys are looked for only where
// it matters (one List call of one key each).
func Check(ctx context.Context, st Store, routes []config.Route, now time.Time) (Result, error) {
	recorded, err := st.Keyspaces(ctx)
	if err != nil {
		return Result{}, err
	}
	byName := map[string]store.Keyspace{}
	for _, k := range recorded {
		byName[k.Name] = k
	}
	claims := map[string]*claim{}
	var order []string
	for _, r := range routes {
		c := claims[r.Keyspace]
		if c == nil {
			c = &claim{recipe: r.KeyRecipe()}
			claims[r.Keyspace] = c
			order = append(order, r.Keyspace)
		}
		c.routes = append(c.routes, r.Name)
	}
	live := func(keyspace string) (bool, error) { return hasLiveKeys(ctx, st, keyspace) }
	var orphans []store.Keyspace
	for _, k := range recorded {
		if claims[k.Name] != nil {
			continue
		}
		l, err := live(k.Name)
		if err != nil {
			return Result{}, err
		}
		if l {
			orphans = append(orphans, k)
		}
	}
	slices.SortFunc(orphans, func(a, b store.Keyspace) int { return strings.Compare(a.Name, b.Name) })
	var res Result
	for _, name := range order {
		c := claims[name]
		entry := store.Keyspace{Name: name, Digest: Digest(c.recipe), Recipe: c.recipe, Routes: strings.Join(c.routes, ","), UpdatedAt: now}
		rec, known := byName[name]
		var f *Finding
		switch {
		case !known && len(orphans) > 0:
			f = &Finding{Keyspace: name, Orphans: orphans}
		case !known, rec.Digest == entry.Digest:
		case compatible(rec, c.recipe):
		default:
			l, err := live(name)
			if err != nil {
				return Result{}, err
			}
			if l {
				f = &Finding{Keyspace: name, Recorded: rec.Recipe, Recipe: c.recipe}
			}
		}
		if f != nil {
			for _, r := range c.routes {
				g := *f
				g.Route = r
				res.Findings = append(res.Findings, g)
			}
			continue
		}
		if !known || rec.Digest != entry.Digest || rec.Recipe != entry.Recipe || rec.Routes != entry.Routes {
			res.Record = append(res.Record, entry)
		}
	}
	// Unclaimed keyspaces that no new one replaces: a route removed.
	if !slices.ContainsFunc(res.Findings, func(f Finding) bool { return len(f.Orphans) > 0 }) {
		for _, o := range orphans {
			res.Findings = append(res.Findings, Finding{Keyspace: o.Name, Orphans: []store.Keyspace{o}})
		}
	}
	return res, nil
}

// MaxListCalls bounds the listing calls that look for a keyspace's live
// keys: a store that lists by key order (Badger, PostgreSQL) answers in
// one, but Redis SCANs the whole database, store.ListBudget keys a call.
// A keyspace whose listing is not over after that many calls is taken to
// have live keys: a false alarm costs an operator's drop, a miss a charge
// made twice.
const MaxListCalls = 16

// hasLiveKeys reports whether keyspace holds a live key.
func hasLiveKeys(ctx context.Context, st store.Lister, keyspace string) (bool, error) {
	q := store.ListQuery{Prefix: keyspace + "/", Limit: 1}
	for range MaxListCalls {
		recs, next, err := st.List(ctx, q)
		if err != nil {
			return false, fmt.Errorf("look for live keys of keyspace %s: %w", keyspace, err)
		}
		if len(recs) > 0 {
			return true, nil
		}
		if next == "" {
			return false, nil
		}
		q.Cursor = next
	}
	return true, nil
}

// compatible reports whether keys made by the recorded recipe are still
// found under recipe: the same but for normalize turned from none to nfc
// (the proxy looks a key up as sent too, where such a record is).
func compatible(rec store.Keyspace, recipe string) bool {
	const from, to = "; normalize " + config.NormalizeNone, "; normalize " + config.NormalizeNFC
	old, ok := strings.CutSuffix(recipe, to)
	return ok && rec.Digest == Digest(old+from)
}

// Record writes the entries of res.Record.
func Record(ctx context.Context, st store.KeyspaceStore, res Result) error {
	for _, k := range res.Record {
		if err := st.PutKeyspace(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
