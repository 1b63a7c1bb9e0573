package check

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The properties of issue 18, by number.
const (
	PropChargedOnce   = 1 // no order charged more than once (release-on-5xx: as the outcome table allows)
	PropTwoXX         = 2 // every 2xx carries the one charge; replays are byte-identical
	PropNothingLost   = 3 // an answered charge is never forgotten; keys end completed or in doubt
	PropLinearizable  = 4 // each key's history is linearizable against the key's state machine
	PropLiveness      = 5 // keys settle, proxies are ready, goroutines and memory come back
	PropLossRefused   = 6 // a store that forgot its keys forwards nothing until the loss is accepted
	PropPowerCut      = 7 // an answer a later sync covered survives a power cut: never in doubt, never forwarded again
	linearizeTimeout  = 20 * time.Second
	goroutineSlack    = 200
	heapSlackBytes    = 64 << 20
	visualisationFile = "linearizability.html"
)

// Violation is one property that the history and the statement break.
type Violation struct {
	Property int    `json:"property"`
	Order    string `json:"order,omitempty"`
	Msg      string `json:"msg"`
}

func (v Violation) String() string {
	if v.Order == "" {
		return fmt.Sprintf("property %d: %s", v.Property, v.Msg)
	}
	return fmt.Sprintf("property %d: order %s: %s", v.Property, v.Order, v.Msg)
}

// Result is the checker's verdict.
type Result struct {
	Violations    []Violation
	Keys          int
	Visualisation string // the file porcupine's visualisation was written to, if any
	// Exposed counts the keys a store forgot (h.Losses): keys sent to its
	// proxies before the loss. Recharged counts those of them charged
	// again after the operator accepted the loss, which the acceptance
	// allows.
	Exposed, Recharged int
	// Cuts counts what the power cuts of h.Cuts did to the keys their
	// proxy held (property 7).
	Cuts CutCounts
	// FailoverExposed counts the keys written through a store's proxies
	// while a lossy failover (h.Failovers) may have lost their writes;
	// FailoverRecharged those of them charged again by an attempt that
	// started after the failover began, which a lossy failover allows.
	FailoverExposed, FailoverRecharged int
	// WindowRetried counts the keys a partial loss took (Loss.Partial)
	// that were retried through the store's proxies between the loss and
	// the end of its detection window; WindowRecharged those of them
	// charged again by such a retry on a replica that could not know the
	// key (another replica than the one that answered it, or one started
	// since): the window's cost by design, not a violation.
	WindowRetried, WindowRecharged int
	// InDoubt counts the keys some client was answered in doubt (409
	// outcome-in-doubt, 504 upstream-timeout, 502 upstream-reset);
	// Reconciled the keys the reconciler resolved (a replay with
	// Idempotent-Reconciled).
	InDoubt, Reconciled int
}

// Options tunes Check.
type Options struct {
	// Dir, if set, is where the visualisation of a non-linearizable key is
	// written.
	Dir string
}

// Check checks h against the statement st and returns every violation.
func Check(h History, st Statement, opts Options) Result {
	var res Result
	add := func(p int, order, format string, args ...any) {
		res.Violations = append(res.Violations, Violation{Property: p, Order: order, Msg: fmt.Sprintf(format, args...)})
	}

	charges := map[string][]Charge{}
	for _, c := range st {
		charges[c.OrderID] = append(charges[c.OrderID], c)
	}
	byOrder := map[string][]Op{}
	var orders []string
	for _, o := range h.Ops {
		if _, ok := byOrder[o.Order]; !ok {
			orders = append(orders, o.Order)
		}
		byOrder[o.Order] = append(byOrder[o.Order], o)
	}
	sort.Strings(orders)
	res.Keys = len(orders)
	for order := range charges {
		if _, ok := byOrder[order]; !ok {
			add(PropChargedOnce, order, "charged %d times, but no client ever sent it", len(charges[order]))
		}
	}

	var end int64
	for _, o := range h.Ops {
		end = max(end, o.End, o.Start)
	}
	checkLosses(h, add)
	var lin []porcupine.Operation
	for _, order := range orders {
		ops := byOrder[order]
		sort.SliceStable(ops, func(i, j int) bool { return ops[i].Start < ops[j].Start })
		route, ok := h.Routes[ops[0].Route]
		if !ok {
			add(PropLinearizable, order, "route %q is not in the history's routes", ops[0].Route)
			continue
		}
		var doubt, recon bool
		for _, o := range ops {
			c := classify(o, route)
			doubt = doubt || c == cDoubt || c == cInDoubt
			recon = recon || (c == cReplay && o.Recon)
		}
		if doubt {
			res.InDoubt++
		}
		if recon {
			res.Reconciled++
		}
		if loss := exposedTo(h.Losses, ops, route); loss != nil {
			res.Exposed++
			l := *loss
			if f := exposedToFailover(h.Failovers, ops); f != nil && f.At < l.Accepted {
				// A lossy failover before the acceptance may have
				// lost the key already.
				l.Accepted = f.At
			}
			e := checkExposed(h, order, ops, route, charges[order], l, "loss was accepted (or a failover without wait_replicas began)", add)
			if e.recharged {
				res.Recharged++
			}
			if e.retried {
				res.WindowRetried++
			}
			if e.windowRecharged {
				res.WindowRecharged++
			}
			continue
		}
		if f := exposedToFailover(h.Failovers, ops); f != nil {
			res.FailoverExposed++
			if checkExposed(h, order, ops, route, charges[order], Loss{Store: f.Store, Proxies: f.Proxies, At: f.At, Accepted: f.At}, "began a failover without wait_replicas", add).recharged {
				res.FailoverRecharged++
			}
			continue
		}
		checkOrder(order, ops, route, charges[order], add)
		for _, o := range ops {
			ret := o.End
			c := classify(o, route)
			if c == cUnknown {
				ret = end + 1 // it may take effect at any time after it started
			}
			lin = append(lin, porcupine.Operation{
				ClientId: o.Client,
				Input: input{Op: o.ID, C: c, Answer: answerOf(o), Recon: o.Recon, Reconcile: route.Reconcile,
					Stranded: c == cNoop && problemType(o) == "store-unavailable" && inOutage(h.Outages, o)},
				Call:     o.Start,
				Return:   ret,
				Metadata: order,
			})
		}
		lin = append(lin, cutOps(h.Cuts, order, ops)...)
	}
	res.Cuts = checkCuts(h, byOrder, orders, charges, add)

	model := keyModel.ToModel()
	model.Partition = func(history []porcupine.Operation) [][]porcupine.Operation {
		parts := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Metadata.(string)
			if _, ok := parts[k]; !ok {
				keys = append(keys, k)
			}
			parts[k] = append(parts[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, parts[k])
		}
		return out
	}
	model.DescribeOperationMetadata = func(info any) string { return fmt.Sprint(info) }
	// Check key by key, so a violation names its key.
	bad := map[string]bool{}
	for _, part := range model.Partition(lin) {
		r := porcupine.CheckOperationsTimeout(model, part, linearizeTimeout)
		order := part[0].Metadata.(string)
		switch r {
		case porcupine.Illegal:
			bad[order] = true
			add(PropLinearizable, order, "the key's history is not linearizable against its state machine (%d operations)", len(part))
		case porcupine.Unknown:
			add(PropLinearizable, order, "the linearizability check timed out after %v", linearizeTimeout)
		}
	}
	if len(bad) > 0 && opts.Dir != "" {
		var sub []porcupine.Operation
		for _, op := range lin {
			if bad[op.Metadata.(string)] {
				sub = append(sub, op)
			}
		}
		_, info := porcupine.CheckOperationsVerbose(model, sub, linearizeTimeout)
		path := filepath.Join(opts.Dir, visualisationFile)
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			add(PropLinearizable, "", "write the visualisation: %v", err)
		} else {
			res.Visualisation = path
		}
	}

	checkHealth(h, add)
	return res
}

// chargesAllowed is how many charges the outcome table allows a key with
// these attempts: one, and under release-on-5xx one more for each 5xx that
// released the key (it may have come after the charge) and each attempt
// without an answer (it may have been such a 5xx).
func chargesAllowed(ops []Op, route Route) int {
	allowed := 1
	if route.Policy == ReleaseOn5xx {
		for _, o := range ops {
			c := classify(o, route)
			if (c == cRelease && o.Status >= 500 && problemType(o) == "") || c == cUnknown {
				allowed++
			}
		}
	}
	return allowed
}

// checkOrder checks properties 1, 2, 3 and the settling part of 5 for one
// key: its attempts, oldest first, and the statement's charges for it.
func checkOrder(order string, ops []Op, route Route, charges []Charge, add func(int, string, string, ...any)) {
	// Property 1.
	allowed := chargesAllowed(ops, route)
	if len(charges) > allowed {
		add(PropChargedOnce, order, "charged %d times on a %s route (%d allowed by the outcome table): %s",
			len(charges), route.Policy, allowed, chargeIDs(charges))
	}

	// Property 2: every 2xx is the charge of the statement.
	var canonical string // the answer replays must repeat
	var reconciled string
	for _, o := range ops {
		c := classify(o, route)
		if o.Err == "" && o.Status >= 200 && o.Status < 300 {
			if !matchesCharge(o.Body, charges) {
				add(PropTwoXX, order, "attempt #%d (%s via %s) answered %d %s, which is not a charge of the statement (%s)",
					o.ID, o.Kind, o.Proxy, o.Status, trim(o.Body), chargeIDs(charges))
			} else if route.Policy == ReserveThenCommit && len(charges) != 1 {
				add(PropTwoXX, order, "attempt #%d answered %d, but the statement holds %d charges", o.ID, o.Status, len(charges))
			}
		}
		switch {
		case c == cCommit && canonical == "":
			canonical = answerOf(o)
		case c == cReplay && o.Recon:
			if reconciled == "" {
				reconciled = answerOf(o)
			} else if answerOf(o) != reconciled {
				add(PropTwoXX, order, "attempt #%d replayed the reconciled answer %q, another replay was %q", o.ID, trim(answerOf(o)), trim(reconciled))
			}
		case c == cReplay:
			if canonical == "" {
				canonical = answerOf(o)
			} else if answerOf(o) != canonical {
				add(PropTwoXX, order, "attempt #%d replayed %q, not byte-identical to the first answer %q", o.ID, trim(answerOf(o)), trim(canonical))
			}
		}
	}

	// Property 3: once a 2xx was answered, the key never forwards again.
	var answeredAt int64 = -1
	for _, o := range ops {
		c := classify(o, route)
		if answeredAt >= 0 && o.Start > answeredAt && (c == cCommit || c == cRelease || c == cDoubt) && route.Policy == ReserveThenCommit {
			add(PropNothingLost, order, "attempt #%d was forwarded (%d) after the charge was answered: the answer was lost", o.ID, o.Status)
			break
		}
		if o.Err == "" && o.Status >= 200 && o.Status < 300 && (answeredAt < 0 || o.End < answeredAt) {
			answeredAt = o.End
		}
	}

	// Properties 3 and 5: how the key ended, read from its last probe.
	last := lastProbe(ops)
	if last == nil {
		add(PropLiveness, order, "the key was never probed after the faults stopped")
		return
	}
	switch c := classify(*last, route); c {
	case cInFlight, cNoop, cUnknown:
		add(PropLiveness, order, "did not settle: the last probe (#%d) got %s %d %s", last.ID, c, last.Status, trim(last.Body+last.Err))
	case cIllegal:
		add(PropLinearizable, order, "the last probe (#%d) got %d %s", last.ID, last.Status, trim(last.Body))
	case cInDoubt:
		if route.Reconcile {
			add(PropNothingLost, order, "still in doubt after lease and grace on a route that reconciles (probe #%d)", last.ID)
		}
	case cCommit, cRelease, cDoubt:
		// A probe forwarded on a charged order: the key was lost, unless the
		// probe's own forward made the charge (then property 1 counts).
		if len(charges) > 0 && route.Policy == ReserveThenCommit && !matchesCharge(last.Body, charges) {
			add(PropNothingLost, order, "charged, yet the last probe (#%d) was forwarded again (%d): the key was lost", last.ID, last.Status)
		}
	}
}

// exposedTo returns the first loss that may have taken the key of ops: a
// loss of the store of a proxy that one of ops was sent to before it. A
// partial loss took only some keys: one that was not forwarded (or may
// have been) through the store's proxies since is held to every property.
func exposedTo(losses []Loss, ops []Op, route Route) *Loss {
	for i, l := range losses {
		before, since := false, !l.Partial
		for _, o := range ops {
			if !slices.Contains(l.Proxies, o.Proxy) {
				continue
			}
			c := classify(o, route)
			before = before || o.Start < l.At
			since = since || inLossFrom(o, l) && (forwarded(c) || c == cUnknown)
		}
		if before && since {
			return &losses[i]
		}
	}
	return nil
}

// inLossFrom reports whether o may have reserved its key after the loss l
// began: it started since, or, for a partial loss, it was still running
// then (a duplicate waiting on the key, concurrent: wait, reserves it
// again when the reservation it waited on is gone).
func inLossFrom(o Op, l Loss) bool {
	return o.Start >= l.At || l.Partial && o.End >= l.At
}

// witnessWindow is how long a replica's witness of recent answers is
// held to remember a key it answered: less than the "few minutes" it
// promises, more than the run's retries take.
const witnessWindow = int64(60 * time.Second)

// witness returns the attempt by which o's proxy answered the key of ops
// before the loss l, within witnessWindow of o and with no start of that
// proxy in between (a start forgets), or nil: that proxy's witness must
// refuse o, a retry of a key it answered that the store no longer holds.
func witness(h History, ops []Op, route Route, l Loss, o Op) *Op {
	for i := len(ops) - 1; i >= 0; i-- {
		a := &ops[i]
		if a.Proxy != o.Proxy || a.Err != "" || classify(*a, route) != cCommit || a.End >= l.At || o.Start-a.End > witnessWindow {
			continue
		}
		for _, s := range h.Starts {
			if s.Proxy == o.Proxy && s.At > a.End && s.At < o.Start {
				return nil
			}
		}
		return a
	}
	return nil
}

// exposure is what a loss let happen to a key.
type exposure struct {
	recharged       bool // charged again by an attempt after the acceptance
	retried         bool // retried in a partial loss's detection window
	windowRecharged bool // charged again by such a retry
}

// exposedToFailover returns the first lossy failover that may have lost a
// write of the key of ops: one of its attempts, through a proxy of the
// failed-over store, overlaps the failover's window.
func exposedToFailover(fs []Failover, ops []Op) *Failover {
	for i, f := range fs {
		if !f.Lossy {
			continue
		}
		for _, o := range ops {
			if o.Start < f.End && (o.End > f.At || o.End == 0) && slices.Contains(f.Proxies, o.Proxy) {
				return &fs[i]
			}
		}
	}
	return nil
}

// inOutage reports whether o went through a proxy of a store during one of
// its outages.
func inOutage(outages []Outage, o Op) bool {
	for _, w := range outages {
		if o.Start < w.End && o.End > w.At && slices.Contains(w.Proxies, o.Proxy) {
			return true
		}
	}
	return false
}

// forwarded reports whether the attempt reached the upstream, as far as its
// answer tells: an upstream's answer, or a problem about the upstream's.
func forwarded(c class) bool { return c == cCommit || c == cRelease || c == cDoubt }

// checkExposed checks property 1 for a key that a store forgot: it may be
// charged again only after the operator accepted the loss, once for each
// attempt forwarded since (or that may have been), and, for a partial
// loss, by an attempt in its detection window on a replica that could not
// know the key (a retry on the replica that answered it, which its
// witness must refuse, breaks property 6). The other properties do not
// hold across a loss by design: the accepted store no longer knows the
// first answer.
func checkExposed(h History, order string, ops []Op, route Route, charges []Charge, loss Loss, what string, add func(int, string, string, ...any)) exposure {
	allowed := chargesAllowed(ops, route)
	var e exposure
	again, window := 0, 0
	for _, o := range ops {
		c := classify(o, route)
		may := forwarded(c) || c == cUnknown
		switch {
		case loss.Accepted > 0 && o.Start > loss.Accepted:
			if may {
				again++
			}
		case inLossFrom(o, loss) && o.Start < loss.detected() && slices.Contains(loss.Proxies, o.Proxy):
			e.retried = true
			if !may {
				break
			}
			if w := witness(h, ops, route, loss, o); w != nil && forwarded(c) {
				add(PropLossRefused, order, "attempt #%d (%s via %s, %.3fs) was forwarded (%d) %.3fs after %s lost keys (%s), yet %s had answered the key (#%d, %.3fs) "+
					"and not restarted since: its witness of recent answers must refuse the retry",
					o.ID, o.Kind, o.Proxy, sec(o.Start), o.Status, sec(o.Start-loss.At), loss.Store, loss.Kind, o.Proxy, w.ID, sec(w.End))
				break
			}
			window++
		}
	}
	if len(charges) > allowed+again+window {
		add(PropChargedOnce, order, "charged %d times on a %s route: %d allowed by the outcome table, %d attempts after the %s %s and %d in the detection window of a partial loss: %s",
			len(charges), route.Policy, allowed, again, loss.Store, what, window, chargeIDs(charges))
	}
	e.recharged = again > 0 && len(charges) > allowed
	e.windowRecharged = window > 0 && len(charges) > allowed
	return e
}

// checkLosses checks property 6: between a store's loss of its keys and the
// operator's acceptance, its proxies forward nothing on a protected route
// (they answer 503 store-lost-keys), whether or not the key was sent
// before. For a partial loss the refusal starts when its detection window
// ends, and only if a proxy marked the store lost (else the keys it took
// and charged again are property 1's).
func checkLosses(h History, add func(int, string, string, ...any)) {
	for _, l := range h.Losses {
		if l.Partial && l.Accepted == 0 {
			continue
		}
		for _, o := range h.Ops {
			route, ok := h.Routes[o.Route]
			if !ok || !slices.Contains(l.Proxies, o.Proxy) || o.Start < l.detected() || (l.Accepted > 0 && o.End > l.Accepted) {
				continue
			}
			if c := classify(o, route); forwarded(c) {
				add(PropLossRefused, o.Order, "attempt #%d (%s via %s) was forwarded (%d) after %s forgot its keys, before the loss was accepted",
					o.ID, o.Kind, o.Proxy, o.Status, l.Store)
			}
		}
	}
}

// checkHealth checks the liveness samples: every proxy ready at the end,
// goroutines and heap near their baseline.
func checkHealth(h History, add func(int, string, string, ...any)) {
	base := map[string]Sample{}
	for _, s := range h.Baseline {
		base[s.Proxy] = s
	}
	for _, s := range h.Final {
		if !s.Ready {
			add(PropLiveness, "", "proxy %s is not ready after the faults stopped", s.Proxy)
		}
		b, ok := base[s.Proxy]
		if !ok {
			continue
		}
		if s.Goroutines > b.Goroutines+goroutineSlack {
			add(PropLiveness, "", "proxy %s has %.0f goroutines, baseline %.0f", s.Proxy, s.Goroutines, b.Goroutines)
		}
		if s.HeapBytes > b.HeapBytes+heapSlackBytes {
			add(PropLiveness, "", "proxy %s has %.0f MiB of heap in use, baseline %.0f MiB", s.Proxy, s.HeapBytes/(1<<20), b.HeapBytes/(1<<20))
		}
	}
}

// matchesCharge reports whether body is, as JSON, one of charges.
func matchesCharge(body string, charges []Charge) bool {
	var got bytes.Buffer
	if json.Compact(&got, []byte(body)) != nil {
		return false
	}
	for _, c := range charges {
		var want bytes.Buffer
		if json.Compact(&want, c.Raw) == nil && bytes.Equal(got.Bytes(), want.Bytes()) {
			return true
		}
	}
	return false
}

func chargeIDs(cs []Charge) string {
	if len(cs) == 0 {
		return "no charge"
	}
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += ", "
		}
		s += c.ChargeID
	}
	return s
}

func trim(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
