package check

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var routes = map[string]Route{
	"charges":       {Policy: ReserveThenCommit, Reconcile: true},
	"charges-wait":  {Policy: ReserveThenCommit},
	"order-charges": {Policy: ReleaseOn5xx},
}

// chargeJSON is a charge as the stub writes it.
func chargeJSON(id, order string) string {
	return fmt.Sprintf(`{"chargeId":%q,"orderId":%q,"amount":5,"createdAt":"2026-12-01T22:00:00Z"}`, id, order)
}

func statement(charges ...[2]string) Statement {
	var st Statement
	for _, c := range charges {
		st = append(st, Charge{ChargeID: c[0], OrderID: c[1], Raw: []byte(chargeJSON(c[0], c[1]))})
	}
	return st
}

// hist builds a history: each op gets an ID and a client of its own unless
// set.
func hist(ops ...Op) History {
	for i := range ops {
		ops[i].ID = i + 1
		if ops[i].Client == 0 {
			ops[i].Client = i
		}
		if ops[i].Kind == "" {
			ops[i].Kind = "retry"
		}
		if ops[i].Proxy == "" {
			ops[i].Proxy = "r0"
		}
	}
	return History{Routes: routes, Ops: ops,
		Baseline: []Sample{{Proxy: "r0", Ready: true, Goroutines: 20, HeapBytes: 4 << 20}},
		Final:    []Sample{{Proxy: "r0", Ready: true, Goroutines: 30, HeapBytes: 6 << 20}},
	}
}

func fresh(route, order string, start, end int64, status int, body string) Op {
	ct := "application/json"
	if status >= 400 {
		ct = "application/problem+json"
	}
	return Op{Route: route, Order: order, Start: start, End: end, Status: status, Body: body, Ctype: ct}
}

func replay(route, order string, start, end int64, status int, body string) Op {
	o := fresh(route, order, start, end, status, body)
	o.Replay = true
	return o
}

func probe(o Op) Op { o.Kind = "probe"; return o }

func problem(route, order string, start, end int64, status int, name string) Op {
	return Op{Route: route, Order: order, Start: start, End: end, Status: status,
		Ctype: "application/problem+json", Body: fmt.Sprintf(`{"type":"urn:idemproxy:problem:%s","status":%d}`, name, status)}
}

const stubFail = `{"type":"about:blank","title":"Internal Server Error","status":500,"fault":"fail-after-charge"}`

func TestCleanHistoryPasses(t *testing.T) {
	c1, c2, c3 := chargeJSON("ch_1", "A"), chargeJSON("ch_2", "B"), chargeJSON("ch_3", "C")
	h := hist(
		// A: forwarded, a concurrent duplicate gets 409, a retry and the probe a replay.
		fresh("charges-wait", "A", 0, 100, 201, c1),
		problem("charges-wait", "A", 10, 20, 409, "request-in-flight"),
		replay("charges-wait", "A", 150, 160, 201, c1),
		probe(replay("charges-wait", "A", 1000, 1010, 201, c1)),
		// B: in doubt, then reconciled from the statement.
		problem("charges", "B", 0, 300, 504, "upstream-timeout"),
		problem("charges", "B", 400, 410, 409, "outcome-in-doubt"),
		Op{Route: "charges", Order: "B", Start: 420, End: 430, Err: "connection refused", NotSent: true},
		probe(func() Op { o := replay("charges", "B", 2000, 2010, 200, c2); o.Recon = true; return o }()),
		// C: release-on-5xx, charged then failed: the retry is charged again, as the table allows.
		fresh("order-charges", "C", 0, 100, 500, stubFail),
		fresh("order-charges", "C", 200, 300, 201, c3),
		probe(replay("order-charges", "C", 1000, 1010, 201, c3)),
		// D: a proxy was killed while forwarding: in doubt ever after.
		Op{Route: "charges-wait", Order: "D", Start: 0, End: 50, Err: "EOF"},
		probe(problem("charges-wait", "D", 3000, 3010, 409, "outcome-in-doubt")),
	)
	st := statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "B"}, [2]string{"ch_0", "C"}, [2]string{"ch_3", "C"}, [2]string{"ch_4", "D"})
	res := Check(h, st, Options{Dir: t.TempDir()})
	if len(res.Violations) != 0 {
		t.Fatalf("a clean history has violations: %v", res.Violations)
	}
	if res.Keys != 4 {
		t.Errorf("Keys = %d, want 4", res.Keys)
	}
}

func TestViolationsAreCaught(t *testing.T) {
	c1, c2 := chargeJSON("ch_1", "A"), chargeJSON("ch_2", "A")
	tests := []struct {
		name string
		h    History
		st   Statement
		want []int // the properties that must be reported
		only bool  // and no other: the violation is caught by that property alone
	}{
		{
			name: "double charge",
			h: hist(
				fresh("charges-wait", "A", 0, 100, 201, c1),
				fresh("charges-wait", "A", 200, 300, 201, c2),
				probe(replay("charges-wait", "A", 1000, 1010, 201, c1)),
			),
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce, PropLinearizable},
		},
		{
			name: "double charge beyond what release-on-5xx allows",
			h: hist(
				fresh("order-charges", "A", 0, 100, 201, c1),
				fresh("order-charges", "A", 200, 300, 201, c2),
				probe(replay("order-charges", "A", 1000, 1010, 201, c2)),
			),
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce},
		},
		{
			name: "lost answer",
			h: hist(
				fresh("charges-wait", "A", 0, 100, 201, c1),
				probe(problem("charges-wait", "A", 1000, 1010, 502, "upstream-unreachable")),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropNothingLost, PropLinearizable},
		},
		{
			name: "2xx not in the statement",
			h: hist(
				fresh("charges-wait", "A", 0, 100, 201, chargeJSON("ch_9", "A")),
				probe(replay("charges-wait", "A", 1000, 1010, 201, chargeJSON("ch_9", "A"))),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropTwoXX},
		},
		{
			name: "replay not byte-identical",
			h: hist(
				fresh("charges-wait", "A", 0, 100, 201, c1),
				replay("charges-wait", "A", 200, 300, 201, c1+"\n"),
				probe(replay("charges-wait", "A", 1000, 1010, 201, c1)),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropTwoXX, PropLinearizable},
		},
		{
			name: "not linearizable",
			// In doubt before anything was sent, then forwarded: every
			// count is right, only the order of events is impossible.
			h: hist(
				problem("charges-wait", "A", 0, 10, 409, "outcome-in-doubt"),
				fresh("charges-wait", "A", 20, 100, 201, c1),
				probe(replay("charges-wait", "A", 1000, 1010, 201, c1)),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropLinearizable},
			only: true,
		},
		{
			// Seed 101's finding: two duplicates answered 503 (a Redis
			// blackhole lost the reservation's reply, and its release
			// failed), and the key was in doubt ever after, uncharged.
			name: "503 leaves the key in doubt",
			h: hist(
				problem("order-charges", "A", 0, 500, 503, "store-unavailable"),
				problem("order-charges", "A", 0, 500, 503, "store-unavailable"),
				probe(problem("order-charges", "A", 16000, 16010, 409, "outcome-in-doubt")),
			),
			st:   statement(),
			want: []int{PropLinearizable},
			only: true,
		},
		{
			name: "key never settles",
			h: hist(
				fresh("charges-wait", "A", 0, 100, 201, c1),
				probe(problem("charges-wait", "A", 1000, 1010, 409, "request-in-flight")),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropLiveness},
			only: true,
		},
		{
			name: "in doubt left unreconciled",
			h: hist(
				problem("charges", "A", 0, 100, 504, "upstream-timeout"),
				probe(problem("charges", "A", 1000, 1010, 409, "outcome-in-doubt")),
			),
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropNothingLost},
			only: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			res := Check(tt.h, tt.st, Options{Dir: dir})
			got := map[int]bool{}
			for _, v := range res.Violations {
				got[v.Property] = true
			}
			for _, p := range tt.want {
				if !got[p] {
					t.Errorf("property %d not reported; violations: %v", p, res.Violations)
				}
			}
			for p := range got {
				if tt.only && !contains(tt.want, p) {
					t.Errorf("property %d reported, want only %v: %v", p, tt.want, res.Violations)
				}
			}
			if contains(tt.want, PropLinearizable) {
				b, err := os.ReadFile(filepath.Join(dir, visualisationFile))
				if err != nil || !strings.Contains(string(b), "<html") {
					t.Errorf("no visualisation saved for a non-linearizable key: %v", err)
				}
			}
		})
	}
}

func TestUnreadyAndLeakingProxiesAreCaught(t *testing.T) {
	h := hist(probe(fresh("charges-wait", "A", 0, 100, 201, chargeJSON("ch_1", "A"))))
	h.Final = []Sample{{Proxy: "r0", Ready: false, Goroutines: 20 + goroutineSlack + 1, HeapBytes: 4 << 20}}
	res := Check(h, statement([2]string{"ch_1", "A"}), Options{})
	if len(res.Violations) != 2 {
		t.Fatalf("violations = %v, want not ready and goroutines", res.Violations)
	}
}

func TestParseStatement(t *testing.T) {
	body := `{"charges":2,"items":[` + chargeJSON("ch_1", "A") + "," + chargeJSON("ch_2", "7") + `]}`
	st, err := ParseStatement([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[1].ChargeID != "ch_2" || st[1].OrderID != "7" || string(st[0].Raw) != chargeJSON("ch_1", "A") {
		t.Errorf("ParseStatement = %+v", st)
	}
}

// wantOnly fails t unless vs report every property of want, and no other.
func wantOnly(t *testing.T, vs []Violation, want []int) {
	t.Helper()
	got := map[int]bool{}
	for _, v := range vs {
		got[v.Property] = true
	}
	for _, p := range want {
		if !got[p] {
			t.Errorf("property %d not reported; violations: %v", p, vs)
		}
	}
	for p := range got {
		if !contains(want, p) {
			t.Errorf("property %d reported, want only %v: %v", p, want, vs)
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestStoreLosses pins property 6 and how property 1 reads a key that a
// store forgot: r0 shares a store that forgot its keys at 500, and the
// operator accepted the loss at 900.
func TestStoreLosses(t *testing.T) {
	loss := Loss{Store: "redis", Proxies: []string{"r0"}, At: 500, Accepted: 900}
	c1, c2 := chargeJSON("ch_1", "A"), chargeJSON("ch_2", "A")
	lost := func(start, end int64) Op {
		return problem("charges-wait", "A", start, end, 503, "store-lost-keys")
	}
	tests := []struct {
		name          string
		ops           []Op
		st            Statement
		want          []int // properties that must be reported, and no other
		wantRecharged int
	}{
		{
			name: "refused until accepted, charged again after: allowed",
			ops: []Op{
				fresh("charges-wait", "A", 0, 100, 201, c1),
				lost(600, 610),
				fresh("charges-wait", "A", 1000, 1100, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2)),
			},
			st:            statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			wantRecharged: 1,
		},
		{
			name: "charged again before the loss was accepted",
			ops: []Op{
				fresh("charges-wait", "A", 0, 100, 201, c1),
				fresh("charges-wait", "A", 600, 700, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2)),
			},
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce, PropLossRefused},
		},
		{
			// Sent during the outage, before the store came back empty,
			// and forwarded once it had: still a double charge.
			name: "a retry that waited through the restart is charged again",
			ops: []Op{
				fresh("charges-wait", "A", 0, 100, 201, c1),
				fresh("charges-wait", "A", 450, 650, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2)),
			},
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce},
		},
		{
			name: "a new key forwarded before the loss was accepted",
			ops: []Op{
				fresh("charges-wait", "A", 600, 700, 201, c1),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c1)),
			},
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropLossRefused},
		},
		{
			name: "another store's proxy is not concerned",
			ops: []Op{
				func() Op { o := fresh("charges-wait", "A", 0, 100, 201, c1); o.Proxy = "p0"; return o }(),
				func() Op { o := fresh("charges-wait", "A", 600, 700, 201, c2); o.Proxy = "p0"; return o }(),
				func() Op { o := probe(replay("charges-wait", "A", 2000, 2010, 201, c1)); o.Proxy = "p0"; return o }(),
			},
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce, PropTwoXX, PropNothingLost, PropLinearizable}, // every property of a plain double charge
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(tt.ops...)
			h.Losses = []Loss{loss}
			h.Final = append(h.Final, Sample{Proxy: "p0", Ready: true})
			res := Check(h, tt.st, Options{Dir: t.TempDir()})
			got := map[int]bool{}
			for _, v := range res.Violations {
				got[v.Property] = true
			}
			for _, p := range tt.want {
				if !got[p] {
					t.Errorf("property %d not reported; violations: %v", p, res.Violations)
				}
			}
			for p := range got {
				if !contains(tt.want, p) {
					t.Errorf("property %d reported, want only %v: %v", p, tt.want, res.Violations)
				}
			}
			if res.Recharged != tt.wantRecharged {
				t.Errorf("Recharged = %d, want %d", res.Recharged, tt.wantRecharged)
			}
		})
	}
}

// TestPartialLosses pins how the checker reads a store that lost some keys
// (redis-evict, redis-failover-lagging, postgres-restore-old): the loss at
// 500 ns, its detection window until 1000, accepted at 1500, on a store
// shared by r0 and r1. A key answered by r0 before the loss and retried in
// the window on r1, which cannot know it, may be charged again: counted,
// not a violation. Retried on r0 itself, whose witness of recent answers
// must refuse it, or anywhere after the window before the acceptance, it
// is a violation. A key the loss did not visibly take is held to every
// property, and a loss no proxy marked (never accepted) excuses nothing
// after its window.
func TestPartialLosses(t *testing.T) {
	loss := Loss{Store: "redis", Kind: "redis-evict", Proxies: []string{"r0", "r1"}, At: 500, Partial: true, Detect: 1000, Accepted: 1500}
	c1, c2 := chargeJSON("ch_1", "A"), chargeJSON("ch_2", "A")
	via := func(p string, o Op) Op { o.Proxy = p; return o }
	answered := fresh("charges-wait", "A", 0, 100, 201, c1) // by r0
	twice := statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"})
	tests := []struct {
		name    string
		ops     []Op
		st      Statement
		starts  []Start
		notSeen bool  // no proxy marked the store lost
		want    []int // properties that must be reported, and no other
		// the counts: keys retried in the window, charged again in it
		retried, recharged int
	}{
		{
			name: "retried in the window on another replica, charged again: counted",
			ops: []Op{answered, via("r1", fresh("charges-wait", "A", 600, 700, 201, c2)),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			retried: 1, recharged: 1,
		},
		{
			// A duplicate waiting on the key (concurrent: wait) when the
			// loss took the reservation it waited on reserves the key
			// again and forwards it, on a replica that never answered
			// it: the retry in the window the docs count.
			name: "waiting across the loss on another replica, charged again: counted",
			ops: []Op{fresh("charges-wait", "A", 400, 520, 201, c1),
				via("r1", fresh("charges-wait", "A", 410, 560, 201, c2)),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			retried: 1, recharged: 1,
		},
		{
			name: "retried in the window on the replica that answered it",
			ops: []Op{answered, fresh("charges-wait", "A", 600, 700, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			want:    []int{PropChargedOnce, PropLossRefused},
			retried: 1,
		},
		{
			name: "retried in the window on the replica that answered it, started again since: counted",
			ops: []Op{answered, fresh("charges-wait", "A", 600, 700, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			starts:  []Start{{Proxy: "r0", At: 300}},
			retried: 1, recharged: 1,
		},
		{
			name: "refused in the window on the replica that answered it, charged again after the acceptance: allowed",
			ops: []Op{answered, problem("charges-wait", "A", 600, 610, 503, "store-lost-keys"),
				via("r1", problem("charges-wait", "A", 1200, 1210, 503, "store-lost-keys")),
				via("r1", fresh("charges-wait", "A", 1600, 1700, 201, c2)), probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			retried: 1,
		},
		{
			name: "forwarded after the window, before the acceptance",
			ops: []Op{answered, via("r1", fresh("charges-wait", "A", 1100, 1200, 201, c2)),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:   twice,
			want: []int{PropChargedOnce, PropLossRefused},
		},
		{
			// A refusal of the proxy's own whose name the checker does
			// not know (a setting that loses keys) forwards nothing.
			name: "not taken: refused for a setting, then replayed, held to every property",
			ops: []Op{answered, via("r1", problem("charges-wait", "A", 600, 610, 503, "store-setting-evicts")),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c1))},
			st: statement([2]string{"ch_1", "A"}),
		},
		{
			name: "not taken: a replay that is not byte-identical is still caught",
			ops: []Op{answered, via("r1", replay("charges-wait", "A", 600, 610, 201, c2)),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c1))},
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropTwoXX, PropLinearizable},
		},
		{
			// An older dump restored: the key is back in flight, its lease
			// long over, so in doubt ever after; never forwarded again.
			name: "set back in doubt by the loss, never forwarded again: no violation",
			ops: []Op{answered, via("r1", problem("charges-wait", "A", 1600, 1610, 409, "outcome-in-doubt")),
				probe(problem("charges-wait", "A", 2000, 2010, 409, "outcome-in-doubt"))},
			st: statement([2]string{"ch_1", "A"}),
		},
		{
			name: "no proxy marked the loss: charged again after the window",
			ops: []Op{answered, via("r1", fresh("charges-wait", "A", 1100, 1200, 201, c2)),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2))},
			st:      twice,
			notSeen: true,
			want:    []int{PropChargedOnce},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(tt.ops...)
			l := loss
			if tt.notSeen {
				l.Accepted = 0
			}
			h.Losses = []Loss{l}
			h.Starts = tt.starts
			h.Final = append(h.Final, Sample{Proxy: "r1", Ready: true})
			res := Check(h, tt.st, Options{Dir: t.TempDir()})
			wantOnly(t, res.Violations, tt.want)
			if res.WindowRetried != tt.retried || res.WindowRecharged != tt.recharged {
				t.Errorf("retried in the window %d, charged again in it %d; want %d, %d", res.WindowRetried, res.WindowRecharged, tt.retried, tt.recharged)
			}
		})
	}
}

// TestFailovers pins how the checker reads a key written around a store's
// failover: after a lossy one (Redis without wait_replicas) a key written
// in its window may be charged again by an attempt that starts after it
// began, and is counted, not reported; every other double charge is a
// violation, and a failover that is not lossy (PostgreSQL with a
// synchronous standby, Redis with wait_replicas) excuses nothing.
func TestFailovers(t *testing.T) {
	c1, c2 := chargeJSON("ch_1", "A"), chargeJSON("ch_2", "A")
	twice := statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"})
	// Answered and replayed by the old master, lost with it, charged
	// again by the final probe.
	lostThenCharged := []Op{
		fresh("charges-wait", "A", 450, 480, 201, c1),
		replay("charges-wait", "A", 490, 495, 201, c1),
		probe(fresh("charges-wait", "A", 2000, 2010, 201, c2)),
	}
	tests := []struct {
		name          string
		failover      Failover
		ops           []Op
		st            Statement
		want          []int // properties that must be reported, and no other
		wantExposed   int
		wantRecharged int
	}{
		{
			name:          "lossy failover: a key written in its window charged again after it is counted",
			failover:      Failover{Store: "redis", Proxies: []string{"r0"}, At: 400, End: 900, Lossy: true},
			ops:           lostThenCharged,
			st:            twice,
			wantExposed:   1,
			wantRecharged: 1,
		},
		{
			name:     "a failover that is not lossy excuses nothing",
			failover: Failover{Store: "postgres", Proxies: []string{"r0"}, At: 400, End: 900},
			ops:      lostThenCharged,
			st:       twice,
			want:     []int{PropChargedOnce, PropTwoXX, PropNothingLost, PropLinearizable},
		},
		{
			name:     "lossy failover: a key written only before its window is held to every property",
			failover: Failover{Store: "redis", Proxies: []string{"r0"}, At: 1000, End: 1500, Lossy: true},
			ops:      lostThenCharged,
			st:       twice,
			want:     []int{PropChargedOnce, PropTwoXX, PropNothingLost, PropLinearizable},
		},
		{
			name:     "lossy failover: another store's proxies are held to every property",
			failover: Failover{Store: "redis", Proxies: []string{"r1"}, At: 400, End: 900, Lossy: true},
			ops:      lostThenCharged,
			st:       twice,
			want:     []int{PropChargedOnce, PropTwoXX, PropNothingLost, PropLinearizable},
		},
		{
			// Both charges by attempts that started before the failover:
			// the failover cannot explain the second.
			name:     "lossy failover: charged twice before it began",
			failover: Failover{Store: "redis", Proxies: []string{"r0"}, At: 400, End: 900, Lossy: true},
			ops: []Op{
				fresh("charges-wait", "A", 100, 480, 201, c1),
				fresh("charges-wait", "A", 200, 450, 201, c2),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c2)),
			},
			st:          twice,
			want:        []int{PropChargedOnce},
			wantExposed: 1,
		},
		{
			name:     "lossy failover: a key written in its window and replayed after it passes",
			failover: Failover{Store: "redis", Proxies: []string{"r0"}, At: 400, End: 900, Lossy: true},
			ops: []Op{
				fresh("charges-wait", "A", 450, 480, 201, c1),
				probe(replay("charges-wait", "A", 2000, 2010, 201, c1)),
			},
			st:          statement([2]string{"ch_1", "A"}),
			wantExposed: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(slices.Clone(tt.ops)...)
			h.Failovers = []Failover{tt.failover}
			res := Check(h, tt.st, Options{Dir: t.TempDir()})
			got := map[int]bool{}
			for _, v := range res.Violations {
				got[v.Property] = true
			}
			for _, p := range tt.want {
				if !got[p] {
					t.Errorf("property %d not reported; violations: %v", p, res.Violations)
				}
			}
			for p := range got {
				if !contains(tt.want, p) {
					t.Errorf("property %d reported, want only %v: %v", p, tt.want, res.Violations)
				}
			}
			if res.FailoverExposed != tt.wantExposed || res.FailoverRecharged != tt.wantRecharged {
				t.Errorf("FailoverExposed, FailoverRecharged = %d, %d; want %d, %d", res.FailoverExposed, res.FailoverRecharged, tt.wantExposed, tt.wantRecharged)
			}
		})
	}
}

// TestOutages pins how the checker reads a key whose reservation a store
// outage as long as a lease may have stranded: a 503 store-unavailable
// during the outage may leave the key in doubt (its reservation applied,
// its reply lost, its release retried only while the lease held), and on
// the route that reconciles, the reconciler must resolve it.
func TestOutages(t *testing.T) {
	outage := Outage{Store: "redis", Proxies: []string{"r0"}, At: 100, End: 900}
	c1 := chargeJSON("ch_1", "A")
	unavailable := func(route string, start, end int64) Op {
		return problem(route, "A", start, end, 503, "store-unavailable")
	}
	tests := []struct {
		name    string
		outages []Outage
		ops     []Op
		st      Statement
		want    []int
	}{
		{
			name:    "stranded by an outage, in doubt on a route without reconcile",
			outages: []Outage{outage},
			ops: []Op{
				unavailable("charges-wait", 200, 700),
				probe(problem("charges-wait", "A", 2000, 2010, 409, "outcome-in-doubt")),
			},
		},
		{
			name: "in doubt after a 503 without an outage: the key was lost",
			ops: []Op{
				unavailable("charges-wait", 200, 700),
				probe(problem("charges-wait", "A", 2000, 2010, 409, "outcome-in-doubt")),
			},
			want: []int{PropLinearizable},
		},
		{
			name:    "a 503 through another store's proxy during the outage",
			outages: []Outage{{Store: "postgres", Proxies: []string{"p0"}, At: 100, End: 900}},
			ops: []Op{
				unavailable("charges-wait", 200, 700),
				probe(problem("charges-wait", "A", 2000, 2010, 409, "outcome-in-doubt")),
			},
			want: []int{PropLinearizable},
		},
		{
			name:    "stranded on the route that reconciles, released by the lookup",
			outages: []Outage{outage},
			ops: []Op{
				unavailable("charges", 200, 700),
				problem("charges", "A", 1000, 1010, 409, "outcome-in-doubt"),
				probe(fresh("charges", "A", 2000, 2010, 201, c1)),
			},
			st: statement([2]string{"ch_1", "A"}),
		},
		{
			name:    "stranded on the route that reconciles, never resolved",
			outages: []Outage{outage},
			ops: []Op{
				unavailable("charges", 200, 700),
				probe(problem("charges", "A", 2000, 2010, 409, "outcome-in-doubt")),
			},
			want: []int{PropNothingLost},
		},
		{
			// Forwarded, answered, then the store stayed away past the
			// lease: the commit never landed and the key went in doubt;
			// the reconciler finds the charge and replays it.
			name:    "answered through an outage, resolved by the reconciler",
			outages: []Outage{outage},
			ops: []Op{
				fresh("charges", "A", 50, 300, 201, c1),
				problem("charges", "A", 1000, 1010, 409, "outcome-in-doubt"),
				func() Op { o := probe(replay("charges", "A", 2000, 2010, 201, c1)); o.Recon = true; return o }(),
			},
			st: statement([2]string{"ch_1", "A"}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(slices.Clone(tt.ops)...)
			h.Outages = tt.outages
			res := Check(h, tt.st, Options{Dir: t.TempDir()})
			got := map[int]bool{}
			for _, v := range res.Violations {
				got[v.Property] = true
			}
			for _, p := range tt.want {
				if !got[p] {
					t.Errorf("property %d not reported; violations: %v", p, res.Violations)
				}
			}
			for p := range got {
				if !contains(tt.want, p) {
					t.Errorf("property %d reported, want only %v: %v", p, tt.want, res.Violations)
				}
			}
		})
	}
}

// TestInDoubtMarkUnderWay: a 504 upstream-timeout says the key is in
// doubt, but when the store fails as the proxy writes the mark, the record
// stays in flight until the mark, retried, lands: a retry meanwhile gets
// 409 request-in-flight, and later outcome-in-doubt. The key must never
// be forwarded again.
func TestInDoubtMarkUnderWay(t *testing.T) {
	c2 := chargeJSON("ch_2", "A")
	tests := []struct {
		name string
		ops  []Op
		st   Statement
		want []int
	}{
		{
			name: "in flight, then in doubt",
			ops: []Op{
				problem("order-charges", "A", 0, 100, 504, "upstream-timeout"),
				problem("order-charges", "A", 200, 300, 409, "request-in-flight"),
				probe(problem("order-charges", "A", 400, 410, 409, "outcome-in-doubt")),
			},
			st: statement([2]string{"ch_1", "A"}),
		},
		{
			name: "in flight, then forwarded again",
			ops: []Op{
				problem("charges-wait", "A", 0, 100, 504, "upstream-timeout"),
				problem("charges-wait", "A", 200, 300, 409, "request-in-flight"),
				probe(fresh("charges-wait", "A", 400, 410, 201, c2)),
			},
			st:   statement([2]string{"ch_1", "A"}, [2]string{"ch_2", "A"}),
			want: []int{PropChargedOnce, PropTwoXX, PropLinearizable},
		},
		{
			name: "in doubt, then in flight again",
			ops: []Op{
				problem("charges-wait", "A", 0, 100, 504, "upstream-timeout"),
				problem("charges-wait", "A", 200, 300, 409, "outcome-in-doubt"),
				problem("charges-wait", "A", 400, 500, 409, "request-in-flight"),
				probe(problem("charges-wait", "A", 600, 610, 409, "outcome-in-doubt")),
			},
			st:   statement([2]string{"ch_1", "A"}),
			want: []int{PropLinearizable},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(slices.Clone(tt.ops)...)
			res := Check(h, tt.st, Options{Dir: t.TempDir()})
			got := map[int]bool{}
			for _, v := range res.Violations {
				got[v.Property] = true
			}
			for _, p := range tt.want {
				if !got[p] {
					t.Errorf("property %d not reported; violations: %v", p, res.Violations)
				}
			}
			for p := range got {
				if !contains(tt.want, p) {
					t.Errorf("property %d reported, want only %v: %v", p, tt.want, res.Violations)
				}
			}
		})
	}
}
