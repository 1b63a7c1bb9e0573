package check

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Cut is a power cut of one proxy's store (the chaos run's power-loss
// fault): the proxy was frozen at At, its data directory lost everything
// not synced by Off (the proxy killed), and it served again, on what was
// left, at Up. Times are nanoseconds since the start of the run.
type Cut struct {
	// Proxy names the proxy whose store lost power.
	Proxy string `json:"proxy"`
	// At is when the proxy was frozen, just before the power went.
	At int64 `json:"at"`
	// Off is when the cut was complete: the proxy dead, the disk holding
	// only what was synced.
	Off int64 `json:"off"`
	// Up is when the restarted proxy was ready; 0: it was not.
	Up int64 `json:"up"`
	// Starts counts the processes started until one was ready: more than
	// one means the proxy exited at start on what the cut left (a
	// supervisor restarts it; the run does the same).
	Starts int `json:"starts"`
}

// CutCounts is what the power cuts did to the keys of the proxies they hit.
// A key counts once, at the first cut after it was answered (Answered) or
// after its request was forwarded without an answer (Reserved); "after" is
// the first answer its clients got once the power was off that tells
// (a replay, in doubt, a forward), unless the key's final probe (its last,
// sent once the faults had stopped and the keys settled) got none of
// these: then the key counts as unavailable (a 503 or another answer of
// the proxy's own, or no answer at all, where a replay was due). "Not
// asked" is left for the keys never probed after the cut with nothing
// that tells.
type CutCounts struct {
	Cuts int `json:"cuts"`
	// Answered counts the keys whose client received the upstream's answer
	// (or a replay of it) before a cut. Synced counts those of them that a
	// later synced reservation covered before the cut (a request forwarded
	// after the answer was received): their commit was on disk.
	Answered, Synced int
	// After the cut, the keys of Synced were replayed, came back in doubt
	// (a violation), were forwarded again (a violation), were unavailable
	// at the final probe (a violation), or were not asked again.
	SyncedReplayed, SyncedInDoubt, SyncedForwarded, SyncedUnavailable, SyncedUnasked int
	// The same for the answered keys no sync covered: in doubt is allowed
	// (the commit was not on disk yet), forwarded again or unavailable at
	// the final probe is not.
	UnsyncedReplayed, UnsyncedInDoubt, UnsyncedForwarded, UnsyncedUnavailable, UnsyncedUnasked int
	// Reserved counts the keys forwarded before a cut whose client got no
	// answer (502 upstream-reset, 504 upstream-timeout, or no answer at all
	// on a key the upstream charged before the cut: the statement's
	// createdAt, placed by History.StartUnixNano). After the cut they were
	// replayed (their commit survived, or a lookup reconciled them), were
	// in doubt, were forwarded again (a violation of property 7, unless
	// the statement says the request before the cut charged nothing and
	// the route's lookup released the key: ReservedUncharged; a double
	// charge if the upstream charged again, property 1), were unavailable
	// at the final probe (a violation of property 7: the reservation
	// neither survived nor left its key in doubt), or were not asked.
	Reserved, ReservedReplayed, ReservedInDoubt, ReservedForwarded, ReservedUnavailable, ReservedUnasked int
	// ReservedUncharged counts those of ReservedForwarded on the route
	// with reconcile whose request before the cut the statement does not
	// hold: the lookup found it not applied and released the key, and the
	// forward after the cut is its one charge (no violation).
	ReservedUncharged int
	// Recharged counts the keys of the cut proxies charged more often than
	// the outcome table allows (property 1's violations among them).
	Recharged int
	// FailedStarts counts the starts after a cut that exited before the
	// proxy was ready.
	FailedStarts int
}

func (c CutCounts) String() string {
	return fmt.Sprintf("%d power cuts; answered before a cut: %d keys, %d covered by a later sync "+
		"(after the cut: %d replayed, %d in doubt, %d forwarded again, %d unavailable at the final probe, %d not asked), "+
		"%d not yet synced (%d replayed, %d in doubt as allowed, %d forwarded again, %d unavailable at the final probe, %d not asked); "+
		"forwarded before a cut, no answer received: %d keys (%d replayed, %d in doubt, %d forwarded again (%d of them not charged before the cut, reconciled as not applied), %d unavailable at the final probe, %d not asked); "+
		"%d keys charged more than once; %d starts after a cut exited before ready",
		c.Cuts, c.Answered, c.Synced, c.SyncedReplayed, c.SyncedInDoubt, c.SyncedForwarded, c.SyncedUnavailable, c.SyncedUnasked,
		c.Answered-c.Synced, c.UnsyncedReplayed, c.UnsyncedInDoubt, c.UnsyncedForwarded, c.UnsyncedUnavailable, c.UnsyncedUnasked,
		c.Reserved, c.ReservedReplayed, c.ReservedInDoubt, c.ReservedForwarded, c.ReservedUncharged, c.ReservedUnavailable, c.ReservedUnasked, c.Recharged, c.FailedStarts)
}

// cutClient is the porcupine client of the first power cut's operations
// (the visualisation wants client numbers from zero; the run's are below).
const cutClient = 1000

// cutOps returns the model's operations for the power cuts that hit the
// key of ops: one for each cut of a proxy the key was sent to before it.
func cutOps(cuts []Cut, order string, ops []Op) []porcupine.Operation {
	var out []porcupine.Operation
	for i, c := range cuts {
		for _, o := range ops {
			if o.Proxy == c.Proxy && o.Start < c.Off {
				out = append(out, porcupine.Operation{
					ClientId: cutClient + i,
					Input:    input{Op: -(i + 1), C: cPowerCut},
					Call:     c.At,
					Return:   c.Off,
					Metadata: order,
				})
				break
			}
		}
	}
	return out
}

// upstreamAnswered reports whether o is the upstream's own answer (not a
// replay, not a problem of the proxy): its reservation was synced before
// it was forwarded.
func upstreamAnswered(o Op) bool {
	return o.Err == "" && !o.Replay && problemType(o) == ""
}

// answered reports whether o's client received the key's answer: the
// upstream's, which the route commits, or a replay of it.
func answered(o Op, r Route) bool {
	c := classify(o, r)
	return o.Err == "" && (c == cCommit || c == cReplay)
}

// after-the-cut outcomes of a key, as CutCounts counts them.
const (
	aReplayed = iota
	aInDoubt
	aForwarded
	aUnavailable
	aUnasked
)

// unavailableAtEnd returns the key's final probe (its last probe, which
// property 5 reads too) if it started after the cut c was complete and got
// neither a replay, nor in doubt, nor a forward: a 503 (store-unavailable
// or another problem of the proxy's own), another answer that is not the
// key's, or no answer at all. A 503 while the power is off or the proxy
// restarts is not the final probe; the probe phase asks a key that is not
// settled again until lease and grace are over, so a 503 there is the
// key's state for as long as the run watched it.
func unavailableAtEnd(ops []Op, route Route, c Cut) *Op {
	last := lastProbe(ops)
	if last == nil || last.Start <= c.Off {
		return nil
	}
	if cl := classify(*last, route); cl == cReplay || cl == cInDoubt || forwarded(cl) {
		return nil
	}
	return last
}

// lastProbe returns the latest probe of ops, nil if none.
func lastProbe(ops []Op) *Op {
	var last *Op
	for i := range ops {
		if ops[i].Kind == "probe" && (last == nil || ops[i].Start > last.Start) {
			last = &ops[i]
		}
	}
	return last
}

// since describes what the key's clients got from the start of the cut c
// on: the first few attempts and the last, with each one's answer.
func since(ops []Op, c Cut, last *Op) string {
	const shown = 4
	var parts []string
	skipped := 0
	for i := range ops {
		o := &ops[i]
		if o.Start <= c.At || o == last {
			continue
		}
		if len(parts) >= shown {
			skipped++
			continue
		}
		parts = append(parts, describe(*o))
	}
	if skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d more", skipped))
	}
	parts = append(parts, describe(*last)+" (the final probe)")
	return strings.Join(parts, ", ")
}

// describe is one attempt and its answer, for a violation's message.
func describe(o Op) string {
	what := fmt.Sprintf("%d %s", o.Status, problemType(o))
	switch {
	case o.Err != "":
		what = "no answer: " + o.Err
	case o.Replay:
		what = fmt.Sprintf("%d replayed", o.Status)
	case problemType(o) == "":
		what = fmt.Sprintf("%d %s", o.Status, trim(o.Body))
	}
	return fmt.Sprintf("#%d (%s via %s, %.3fs) %s", o.ID, o.Kind, o.Proxy, sec(o.Start), what)
}

// checkCuts checks property 7 and counts what the power cuts did. An
// answer received before a cut is on disk once a reservation the store
// made after it was synced: the store has one writer and one log, so that
// reservation's sync covers the commit queued before it. The witness is a
// request forwarded (its reservation synced) that started after the
// answer was received and got the upstream's answer before the cut. Such
// an answer must come back as a replay after every later cut: in doubt or
// forwarded again is a violation. An answer no sync covered may come back
// in doubt (docs/operations.md), never forwarded again (property 3). For
// both, and for a reservation forwarded before the cut, the key's final
// probe after the cut must replay (or, where allowed, say in doubt): a
// 503 or no answer there is a key whose answer the store could not read
// for as long as the run watched it, which is neither replayed nor in
// doubt (a violation, whatever came earlier after the cut).
func checkCuts(h History, byOrder map[string][]Op, orders []string, charges map[string][]Charge, add func(int, string, string, ...any)) CutCounts {
	n := CutCounts{Cuts: len(h.Cuts)}
	for _, c := range h.Cuts {
		n.FailedStarts += max(c.Starts-1, 0)
	}
	if len(h.Cuts) == 0 {
		return n
	}
	cuts := append([]Cut(nil), h.Cuts...)
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].At < cuts[j].At })
	// witness[i]: the latest start of a request forwarded through the cut
	// proxy that got the upstream's answer before cut i, and its ID.
	type wit struct {
		start int64
		id    int
	}
	witness := make([]wit, len(cuts))
	for _, o := range h.Ops {
		if !upstreamAnswered(o) {
			continue
		}
		for i, c := range cuts {
			if o.Proxy == c.Proxy && o.End < c.At && o.Start > witness[i].start {
				witness[i] = wit{o.Start, o.ID}
			}
		}
	}
	// cutAfter returns the index of the first cut of proxy p not complete
	// when an attempt started at t, or -1: the cut that may undo what the
	// attempt did (an answer received while the power went, from a proxy
	// that had not stopped yet, belongs to that cut, and no sync before it
	// can have covered it).
	cutAfter := func(p string, t int64) int {
		for i, c := range cuts {
			if c.Proxy == p && c.Off > t {
				return i
			}
		}
		return -1
	}
	for _, order := range orders {
		ops := byOrder[order] // sorted by start
		route, ok := h.Routes[ops[0].Route]
		if !ok {
			continue
		}
		hit := false
		for _, o := range ops {
			for _, c := range cuts {
				if o.Proxy == c.Proxy && o.Start < c.Off {
					hit = true
				}
			}
		}
		if !hit {
			continue
		}
		if len(charges[order]) > chargesAllowed(ops, route) {
			n.Recharged++
		}
		// after returns what cut i did to the key (aReplayed, ...): the
		// first answer after it that tells, unless the final probe found
		// the key unavailable (a key forwarded again counts as that).
		after := func(i int) int {
			what := aUnasked
			for _, o := range ops {
				if o.Start <= cuts[i].Off {
					continue
				}
				switch c := classify(o, route); {
				case c == cReplay:
					what = aReplayed
				case c == cInDoubt:
					what = aInDoubt
				case forwarded(c):
					what = aForwarded
				default:
					continue
				}
				break
			}
			if what != aForwarded && unavailableAtEnd(ops, route, cuts[i]) != nil {
				return aUnavailable
			}
			return what
		}

		// The earliest answer a sync covered, else the first answer.
		var first, synced *Op
		cutOf, syncedCut := -1, -1
		for j := range ops {
			o := &ops[j]
			if !answered(*o, route) {
				continue
			}
			i := cutAfter(o.Proxy, o.Start)
			if i < 0 {
				continue
			}
			if first == nil {
				first, cutOf = o, i
			}
			if o.End < witness[i].start {
				synced, syncedCut = o, i
				break
			}
		}
		if synced != nil {
			// Property 7: after the cut that followed it, never in doubt,
			// never forwarded again, and replayed at the final probe.
			c := cuts[syncedCut]
			reported := false
			for _, o := range ops {
				if o.Start <= c.Off {
					continue
				}
				cl := classify(o, route)
				if cl == cInDoubt || forwarded(cl) {
					what := "came back in doubt"
					if forwarded(cl) {
						what = "was forwarded again"
					}
					add(PropPowerCut, order, "attempt #%d (%s via %s, %.3fs) got %d %s: the key %s after the power cut of %s at %.3fs, "+
						"yet attempt #%d (%.3fs) had received %d %s and request #%d, forwarded after it (%.3fs), was synced before the cut",
						o.ID, o.Kind, o.Proxy, sec(o.Start), o.Status, trim(o.Body+o.Err), what, c.Proxy, sec(c.At),
						synced.ID, sec(synced.End), synced.Status, trim(synced.Body), witness[syncedCut].id, sec(witness[syncedCut].start))
					reported = true
					break
				}
			}
			if last := unavailableAtEnd(ops, route, c); last != nil && !reported {
				add(PropPowerCut, order, "the key's answer was not replayed after the power cut of %s at %.3fs: attempt #%d (%.3fs) had received %d %s "+
					"and request #%d, forwarded after it (%.3fs), was synced before the cut; since the cut: %s",
					c.Proxy, sec(c.At), synced.ID, sec(synced.End), synced.Status, trim(synced.Body),
					witness[syncedCut].id, sec(witness[syncedCut].start), since(ops, c, last))
			}
		} else if first != nil {
			// An answer no sync covered: in doubt is allowed, a final
			// probe without the answer is not (a forward is property 3's).
			c := cuts[cutOf]
			if last := unavailableAtEnd(ops, route, c); last != nil && !forwardedAfter(ops, route, c) {
				add(PropPowerCut, order, "the key's answer was neither replayed nor in doubt after the power cut of %s at %.3fs: attempt #%d (%.3fs) had received %d %s "+
					"(no sync covered it before the cut, so in doubt was allowed); since the cut: %s",
					c.Proxy, sec(c.At), first.ID, sec(first.End), first.Status, trim(first.Body), since(ops, c, last))
			}
		}
		if first != nil {
			n.Answered++
			i, counts := cutOf, [5]*int{&n.UnsyncedReplayed, &n.UnsyncedInDoubt, &n.UnsyncedForwarded, &n.UnsyncedUnavailable, &n.UnsyncedUnasked}
			if synced != nil {
				n.Synced++
				i, counts = syncedCut, [5]*int{&n.SyncedReplayed, &n.SyncedInDoubt, &n.SyncedForwarded, &n.SyncedUnavailable, &n.SyncedUnasked}
			}
			*counts[after(i)]++
			continue
		}

		// Forwarded without an answer before a cut.
		for j := range ops {
			o := &ops[j]
			c := classify(*o, route)
			i := cutAfter(o.Proxy, o.Start)
			if i < 0 || !(c == cDoubt && o.End < cuts[i].At || c == cUnknown && chargedBefore(h, charges[order], cuts[i].At)) {
				continue
			}
			n.Reserved++
			what := after(i)
			*[5]*int{&n.ReservedReplayed, &n.ReservedInDoubt, &n.ReservedForwarded, &n.ReservedUnavailable, &n.ReservedUnasked}[what]++
			if what == aUnavailable {
				last := unavailableAtEnd(ops, route, cuts[i])
				add(PropPowerCut, order, "the key was neither replayed nor in doubt after the power cut of %s at %.3fs, "+
					"yet its request #%d (%.3fs) had been forwarded before it (%s); since the cut: %s",
					cuts[i].Proxy, sec(cuts[i].At), o.ID, sec(o.Start), chargeIDs(charges[order]), since(ops, cuts[i], last))
			}
			// Forwarded again: a second charge only if the request before
			// the cut made one (the statement is the authority). On the
			// route with reconcile the lookup releases a key the upstream
			// never charged, and its next request charges it once; on a
			// route without, nothing but an operator releases a key in
			// doubt, so a forward after the cut means the cut lost the
			// synced reservation. release-on-5xx may have released it.
			if what == aForwarded && route.Reconcile && !chargedBeforeCut(h, ops, route, charges[order], cuts[i]) {
				n.ReservedUncharged++
			} else if what == aForwarded && route.Policy == ReserveThenCommit {
				for _, a := range ops {
					if cl := classify(a, route); a.Start > cuts[i].Off && forwarded(cl) {
						add(PropPowerCut, order, "attempt #%d (%s via %s, %.3fs) was forwarded (%d) after the power cut of %s at %.3fs, "+
							"yet the key's request #%d (%.3fs) had been forwarded before it (%s)",
							a.ID, a.Kind, a.Proxy, sec(a.Start), a.Status, cuts[i].Proxy, sec(cuts[i].At), o.ID, sec(o.Start), chargeIDs(charges[order]))
						break
					}
				}
			}
			break
		}
	}
	return n
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

// chargedBeforeCut reports whether the statement holds a charge that the
// key's request before the cut c made: a charge that no attempt forwarded
// after the cut received as its answer and that the upstream recorded
// before the cut was complete (its createdAt; when the history cannot
// place it, any such charge counts).
func chargedBeforeCut(h History, ops []Op, route Route, charges []Charge, c Cut) bool {
	for _, ch := range charges {
		one := []Charge{ch}
		later := slices.ContainsFunc(ops, func(o Op) bool {
			return o.Start > c.Off && forwarded(classify(o, route)) && matchesCharge(o.Body, one)
		})
		if !later && (h.StartUnixNano == 0 || chargedBefore(h, one, c.Off)) {
			return true
		}
	}
	return false
}

// forwardedAfter reports whether an attempt of ops that started after the
// cut c was complete was forwarded.
func forwardedAfter(ops []Op, route Route, c Cut) bool {
	for _, o := range ops {
		if o.Start > c.Off && forwarded(classify(o, route)) {
			return true
		}
	}
	return false
}

// chargedBefore reports whether the upstream recorded one of charges
// before at (run time), as its createdAt says; false when the history
// does not know its start.
func chargedBefore(h History, charges []Charge, at int64) bool {
	if h.StartUnixNano == 0 {
		return false
	}
	for _, c := range charges {
		var v struct {
			CreatedAt time.Time `json:"createdAt"`
		}
		if json.Unmarshal(c.Raw, &v) == nil && !v.CreatedAt.IsZero() && v.CreatedAt.UnixNano()-h.StartUnixNano < at {
			return true
		}
	}
	return false
}
