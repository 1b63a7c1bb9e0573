package proxy

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// routeOf parses a configuration whose only route has the given extra
// lines (indented as route fields) and returns that route, defaults
// applied.
func routeOf(t *testing.T, extra string) *config.Route {
	t.Helper()
	src := "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nroutes:\n" +
		"  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n" + extra
	cfg, err := config.Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", src, err)
	}
	return &cfg.Routes[0]
}

// readmeOutcomeTable returns the table "What the upstream's outcome does to
// the key" of docs/concepts.md: the policies its columns are for (after
// "outcome" and "seen as") and its rows, cell by cell.
func readmeOutcomeTable(t *testing.T) (policies []string, rows [][]string) {
	t.Helper()
	b, err := os.ReadFile("../docs/concepts.md")
	if err != nil {
		t.Fatal(err)
	}
	cells := func(line string) []string {
		c := strings.Split(strings.Trim(line, "| "), "|")
		for i := range c {
			c[i] = strings.TrimSpace(c[i])
		}
		return c
	}
	lines := strings.Split(string(b), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| outcome | seen as |") })
	if start < 0 {
		t.Fatal(`docs/concepts.md has no outcome table (a line starting "| outcome | seen as |")`)
	}
	for _, h := range cells(lines[start])[2:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(h, "`"), "`")
		policies = append(policies, name)
	}
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		row := cells(l)
		if len(row) != 2+len(policies) {
			t.Fatalf("README outcome table: row %q has %d cells, want %d", l, len(row), 2+len(policies))
		}
		rows = append(rows, row)
	}
	return policies, rows
}

// namedOutcome is an outcome a row of the README's table stands for.
type namedOutcome struct {
	name string
	o    upstreamResult
}

func answeredWith(statuses ...int) []namedOutcome {
	var out []namedOutcome
	for _, s := range statuses {
		out = append(out, namedOutcome{strconv.Itoa(s), upstreamResult{kind: answered, status: s}})
	}
	return out
}

func statusRange(from, to int, except []int) []int {
	var out []int
	for s := from; s <= to; s++ {
		if !slices.Contains(except, s) {
			out = append(out, s)
		}
	}
	return out
}

var threeDigits = regexp.MustCompile(`\b\d{3}\b`)

// TestClassifyIsTheREADMEOutcomeTable checks classify against the README's
// outcome table, row by row and policy by policy: the outcome each cell
// names (commit, release, in_doubt) and the status it answers ("answer
// 502"; "answer 504 (timeout) or 502": the first for a timeout).
func TestClassifyIsTheREADMEOutcomeTable(t *testing.T) {
	t.Parallel()
	policies, rows := readmeOutcomeTable(t)
	if want := []string{config.PolicyReserveThenCommit, config.PolicyReleaseOn5xx}; !slices.Equal(policies, want) {
		t.Fatalf("README outcome table: policy columns %q, want %q", policies, want)
	}
	// The release set the "refused" row lists; "final answer" is every
	// other status below 500 (the 5xx are "server error").
	var refused []int
	for _, row := range rows {
		if row[0] == "refused" {
			for _, s := range threeDigits.FindAllString(row[1], -1) {
				n, _ := strconv.Atoi(s)
				refused = append(refused, n)
			}
		}
	}
	if len(refused) == 0 {
		t.Fatal(`README outcome table: no "refused" row listing statuses`)
	}
	// What each row stands for, by its first cell.
	outcomesOf := map[string][]namedOutcome{
		"final answer": answeredWith(statusRange(200, 499, refused)...),
		"refused":      answeredWith(refused...),
		"server error": answeredWith(statusRange(500, 599, nil)...),
		"not sent":     {{"not sent", upstreamResult{kind: notSent}}},
		"in doubt":     {{"timeout", upstreamResult{kind: timedOut}}, {"connection lost", upstreamResult{kind: connLost}}},
	}
	var seen []string
	for _, row := range rows {
		outcomes, ok := outcomesOf[row[0]]
		if !ok {
			t.Errorf("README outcome table: row %q is not known to this test: say which outcomes it stands for", row[0])
			continue
		}
		seen = append(seen, row[0])
		for i, policy := range policies {
			cell := row[2+i]
			plain := strings.NewReplacer("*", "", "`", "").Replace(cell)
			word := strings.TrimRight(strings.Fields(plain)[0], ",:")
			var want Outcome
			switch word {
			case "commit":
				want = OutcomeCommitted
			case "release":
				want = OutcomeReleased
			case "in_doubt":
				want = OutcomeInDoubt
			default:
				t.Errorf("README outcome table: row %q, %s: no verdict in %q", row[0], policy, cell)
				continue
			}
			var answers []int // the statuses the cell answers
			if _, rest, ok := strings.Cut(plain, "answer "); ok {
				for _, s := range threeDigits.FindAllString(rest, -1) {
					n, _ := strconv.Atoi(s)
					answers = append(answers, n)
				}
			}
			r := routeOf(t, "    policy: "+policy+"\n")
			for _, o := range outcomes {
				wantStatus := 0 // no problem: the upstream's answer is passed on
				switch {
				case len(answers) == 1:
					wantStatus = answers[0]
				case len(answers) == 2 && o.o.kind == timedOut:
					wantStatus = answers[0]
				case len(answers) == 2:
					wantStatus = answers[1]
				}
				v, prob := classify(o.o, r)
				gotStatus := 0
				if prob != nil {
					gotStatus = prob.Status
				}
				if v != want || gotStatus != wantStatus {
					t.Errorf("row %q (%s), %s: classify = %v, answer %d; want %v, answer %d (README: %q)",
						row[0], o.name, policy, v, gotStatus, want, wantStatus, cell)
				}
			}
		}
	}
	for name := range outcomesOf {
		if !slices.Contains(seen, name) {
			t.Errorf("README outcome table: no row %q", name)
		}
	}
}

// TestClassify checks the rules the README tells beside its outcome table:
// the cleaned-form rule, release_statuses, 101 Switching Protocols, and the
// outcomes that are not in the table.
func TestClassify(t *testing.T) {
	t.Parallel()
	answer := func(status int) upstreamResult { return upstreamResult{kind: answered, status: status} }
	cleaned := func(status int, toCanonical bool) upstreamResult {
		return upstreamResult{kind: answered, status: status, cleaned: true, toCanonical: toCanonical}
	}
	tests := []struct {
		name    string
		route   string // extra route lines
		o       upstreamResult
		want    Outcome
		problem string // the problem's name, "" for none
	}{
		{"cleaned form, 404, whatever the release set", "    release_statuses: [503]\n", cleaned(404, false), OutcomeReleased, ""},
		{"cleaned form, 405, whatever the release set", "    release_statuses: [503]\n", cleaned(405, false), OutcomeReleased, ""},
		{"as sent, 404 outside the release set", "    release_statuses: [503]\n", answer(404), OutcomeCommitted, ""},
		{"cleaned form, 301 to the canonical path", "", cleaned(301, true), OutcomeReleased, ""},
		{"cleaned form, 307 to the canonical path", "", cleaned(307, true), OutcomeReleased, ""},
		{"cleaned form, 308 to the canonical path", "", cleaned(308, true), OutcomeReleased, ""},
		{"cleaned form, 307 elsewhere", "", cleaned(307, false), OutcomeCommitted, ""},
		{"cleaned form, 303 to the canonical path", "", cleaned(303, true), OutcomeCommitted, ""},
		{"cleaned form, 302 to the canonical path", "", cleaned(302, true), OutcomeCommitted, ""},
		{"cleaned form, 201", "", cleaned(201, false), OutcomeCommitted, ""},
		{"as sent, 308 (no cleaned form)", "", upstreamResult{kind: answered, status: 308, toCanonical: true}, OutcomeCommitted, ""},
		{"release_statuses: 503 released", "    release_statuses: [429, 503]\n", answer(503), OutcomeReleased, ""},
		{"release_statuses: 500 committed", "    release_statuses: [429, 503]\n", answer(500), OutcomeCommitted, ""},
		{"release_statuses replaces the client errors", "    release_statuses: [429, 503]\n", answer(400), OutcomeCommitted, ""},
		{"release_statuses replaces the policy", "    policy: release-on-5xx\n    release_statuses: [503]\n", answer(500), OutcomeCommitted, ""},
		{"101 Switching Protocols", "", answer(101), OutcomeInDoubt, "upstream-reset"},
		{"not sent", "", upstreamResult{kind: notSent}, OutcomeReleased, "upstream-unreachable"},
		{"not sent: shutting down", "", upstreamResult{kind: shutDown}, OutcomeReleased, "shutting-down"},
		{"timeout", "", upstreamResult{kind: timedOut}, OutcomeInDoubt, "upstream-timeout"},
		{"connection lost", "", upstreamResult{kind: connLost}, OutcomeInDoubt, "upstream-reset"},
		{"answer broke off", "", upstreamResult{kind: brokeOff}, OutcomeInDoubt, ""},
		{"no verdict from the reverse proxy", "", upstreamResult{kind: unsettled}, OutcomeInDoubt, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, prob := classify(tc.o, routeOf(t, tc.route))
			got := ""
			if prob != nil {
				got = prob.Name
			}
			if v != tc.want || got != tc.problem {
				t.Errorf("classify(%+v) = %v, %q; want %v, %q", tc.o, v, got, tc.want, tc.problem)
			}
		})
	}
}

// TestReleaseSet sweeps statuses over the ways a route sets its release
// set: which answers release the key, all others being committed.
func TestReleaseSet(t *testing.T) {
	t.Parallel()
	statuses := []int{200, 201, 204, 301, 307, 400, 401, 402, 403, 404, 405, 406, 409, 410, 412, 413, 415, 418, 422, 429, 500, 502, 503, 504, 599}
	clientErrors := []int{400, 401, 403, 404, 405, 409, 413, 415, 422, 429}
	tests := []struct {
		name     string
		route    string
		releases []int
	}{
		{"reserve-then-commit", "", clientErrors},
		{"reserve-then-commit, explicit", "    policy: reserve-then-commit\n", clientErrors},
		{"release-on-5xx", "    policy: release-on-5xx\n", append(slices.Clone(clientErrors), 500, 502, 503, 504, 599)},
		{"override", "    release_statuses: [503, 429]\n", []int{429, 503}},
		{"override replaces the policy", "    policy: release-on-5xx\n    release_statuses: [503]\n", []int{503}},
		{"override without 429", "    release_statuses: [500]\n", []int{500}},
		{"override to nothing", "    release_statuses: []\n", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := routeOf(t, tc.route)
			for _, s := range statuses {
				want := OutcomeCommitted
				if slices.Contains(tc.releases, s) {
					want = OutcomeReleased
				}
				if got, _ := classify(upstreamResult{kind: answered, status: s}, r); got != want {
					t.Errorf("classify(answered %d) = %v, want %v", s, got, want)
				}
			}
		})
	}
}
