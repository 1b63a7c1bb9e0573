package check

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// class is what an answer says happened to its key, read from the answer
// alone (status, problem type, Idempotent-Replayed).
type class int

const (
	cCommit   class = iota // the upstream's answer, which the route's policy commits
	cRelease               // the upstream's answer released, or 502 upstream-unreachable
	cDoubt                 // 502 upstream-reset or 504 upstream-timeout: the key is in doubt
	cReplay                // a stored answer, replayed
	cInFlight              // 409 request-in-flight
	cInDoubt               // 409 outcome-in-doubt
	cNoop                  // nothing was stored or sent: a 503, a 408, a connection refused
	cUnknown               // no answer at all: anything may have happened
	cIllegal               // an answer the run's requests can never deserve (400, 422, ...)
	cPowerCut              // not an answer: the power of the key's proxy was cut (History.Cuts)
)

var classNames = [...]string{"commit", "release", "doubt", "replay", "in-flight", "in-doubt", "noop", "unknown", "illegal", "power-cut"}

func (c class) String() string { return classNames[c] }

// releaseSet is the default set of statuses released under
// reserve-then-commit: refused before any work.
var releaseSet = map[int]bool{400: true, 401: true, 403: true, 404: true, 405: true, 409: true, 413: true, 415: true, 422: true, 429: true}

// classify reads one attempt's answer on a route.
func classify(o Op, r Route) class {
	if o.Err != "" {
		if o.NotSent {
			return cNoop
		}
		return cUnknown
	}
	if o.Replay {
		return cReplay
	}
	switch problemType(o) {
	case "":
		if releaseSet[o.Status] || (r.Policy == ReleaseOn5xx && o.Status >= 500) {
			return cRelease
		}
		return cCommit
	case "request-in-flight":
		return cInFlight
	case "outcome-in-doubt":
		return cInDoubt
	case "upstream-unreachable":
		return cRelease
	case "upstream-reset", "upstream-timeout":
		return cDoubt
	case "store-unavailable", "store-lost-keys", "overloaded", "shutting-down", "body-timeout":
		return cNoop
	default:
		if o.Status == 503 {
			// A refusal of the proxy's own (a setting that loses keys,
			// a keyspace left unclaimed): nothing forwarded.
			return cNoop
		}
		return cIllegal
	}
}

// The states of a key as its clients can see them.
const (
	sFree    = 'F' // no record: the next request is forwarded
	sPending = 'P' // answered to its client, commit still under way (a store fault)
	sDone    = 'D' // completed: the answer is replayed
	sDoubt   = '?' // in doubt
	// sMarking: answered in doubt (502 upstream-reset, 504
	// upstream-timeout), the in-doubt mark still under way (the store
	// failed when the proxy wrote it, and the proxy retries it while the
	// lease holds): the record is still in flight, and becomes in doubt
	// at any moment.
	sMarking = 'M'
)

// anyAnswer stands for an answer that no client saw (its client got no
// answer): the first replay says what it was.
const anyAnswer = "*"

// state is one key's state in the model.
type state struct {
	K byte
	A string // the stored answer, for sPending and sDone
}

// input is one operation of the model: the attempt's class and answer.
type input struct {
	Op        int
	C         class
	Answer    string
	Recon     bool // the replay carried Idempotent-Reconciled
	Reconcile bool // the route reconciles in-doubt keys
	// Stranded: a 503 store-unavailable during an outage of the store
	// (History.Outages), whose reservation may have been applied and
	// never released: the key may be left in doubt.
	Stranded bool
}

func answerOf(o Op) string { return fmt.Sprintf("%d %s", o.Status, o.Body) }

func sameAnswer(stored, a string) bool { return stored == anyAnswer || stored == a }

// step is the key's state machine (DESIGN.md, "The key's life"), as a
// nondeterministic model: it returns every state the key may be in after
// the operation, none if the operation is impossible in s.
func step(s state, in input) []state {
	if s.K == sMarking {
		// The mark may have landed before this operation: anything
		// the key may do in doubt; or not yet: still in flight.
		out := step(state{K: sDoubt}, in)
		if in.C == cInFlight || in.C == cNoop || in.C == cUnknown || in.C == cPowerCut {
			out = append(out, s)
		}
		return out
	}
	free := s.K == sFree || (s.K == sDoubt && in.Reconcile) // a lookup may release an in-doubt key
	switch in.C {
	case cCommit:
		if free {
			return []state{{sDone, in.Answer}, {sPending, in.Answer}}
		}
	case cRelease:
		if free {
			return []state{{sFree, ""}}
		}
	case cDoubt:
		if free {
			return []state{{sDoubt, ""}, {sMarking, ""}}
		}
	case cReplay:
		switch {
		case (s.K == sDone || s.K == sPending) && sameAnswer(s.A, in.Answer) && !in.Recon:
			return []state{{sDone, in.Answer}}
		case in.Recon && in.Reconcile && (s.K == sDoubt || s.K == sPending):
			return []state{{sDone, in.Answer}}
		case in.Recon && s.K == sDone && sameAnswer(s.A, in.Answer):
			return []state{{sDone, in.Answer}}
		}
	case cInFlight:
		if s.K == sFree || s.K == sPending || (s.K == sDoubt && in.Reconcile) {
			return []state{s}
		}
	case cInDoubt:
		if s.K == sDoubt || s.K == sPending {
			return []state{{sDoubt, ""}}
		}
	case cNoop:
		if in.Stranded && s.K == sFree {
			return []state{s, {sDoubt, ""}}
		}
		return []state{s}
	case cPowerCut:
		// What was not synced is gone: a commit, a release or an in-doubt
		// mark may be undone, and the reservation under it comes back in
		// doubt (docs/operations.md, "What a power cut costs"); a
		// reservation never comes back free. Whether the cut may undo a
		// commit that a later sync covered is property 7's question
		// (checkCuts), which the model cannot see.
		switch s.K {
		case sFree:
			return []state{s, {sDoubt, ""}}
		case sPending, sDone:
			return []state{{sDone, s.A}, {sDoubt, ""}}
		default:
			return []state{s}
		}
	case cUnknown:
		out := []state{s}
		if free {
			out = append(out, state{sDoubt, ""}, state{sMarking, ""}, state{sPending, anyAnswer}, state{sDone, anyAnswer}, state{sFree, ""})
		}
		if s.K == sPending {
			out = append(out, state{sDoubt, ""}, state{sDone, s.A})
		}
		return out
	}
	return nil
}

// keyModel is the porcupine model of one key.
var keyModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{state{K: sFree}} },
	Step: func(s, in, _ any) []any {
		next := step(s.(state), in.(input))
		out := make([]any, len(next))
		for i, n := range next {
			out[i] = n
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(state) == b.(state) },
	DescribeOperation: func(in, _ any) string {
		i := in.(input)
		a := i.Answer
		if len(a) > 60 {
			a = a[:60] + "…"
		}
		return fmt.Sprintf("#%d %s %s", i.Op, i.C, a)
	},
	DescribeState: func(s any) string {
		st := s.(state)
		a := st.A
		if len(a) > 40 {
			a = a[:40] + "…"
		}
		return fmt.Sprintf("%c %s", st.K, a)
	},
}
