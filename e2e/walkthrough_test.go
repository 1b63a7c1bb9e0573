package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
)

// docBlock returns the lines of the first ```sh block of the Markdown
// file's section under heading.
func docBlock(t *testing.T, file, heading string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(doctest.Section(t, file, heading), "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatalf("%s: no sh block under %q", file, heading)
	}
	return strings.Split(strings.TrimSpace(block), "\n")
}

// shellWords splits a command line as sh would for the README's simple
// commands (single and double quotes, no expansion) and drops a trailing
// comment. A $NAME is left as it is (to compare commands as written).
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	return shellWordsIn(t, line, nil)
}

// varName is a variable of a command line, $NAME.
var varName = regexp.MustCompile(`^\$([A-Z_][A-Z0-9_]*)`)

// shellWordsIn is shellWords expanding each $NAME outside single quotes
// with env (NAME=value); nil env leaves them as written. A variable env
// does not set is a failure: the walk-through must say to export it.
func shellWordsIn(t *testing.T, line string, env []string) []string {
	t.Helper()
	expand := func(s string) string {
		if env == nil {
			return s
		}
		for {
			i := strings.IndexByte(s, '$')
			if i < 0 {
				return s
			}
			m := varName.FindStringSubmatch(s[i:])
			if m == nil {
				t.Fatalf("expansion in %q: the walk-through must be runnable as written", line)
			}
			val, ok := "", false
			for _, kv := range env {
				if k, v, _ := strings.Cut(kv, "="); k == m[1] {
					val, ok = v, true
				}
			}
			if !ok {
				t.Fatalf("%q uses $%s, which the set-up does not export", line, m[1])
			}
			s = s[:i] + val + s[i+len(m[0]):]
		}
	}
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\'' || c == '"':
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				t.Fatalf("unbalanced quote in %q", line)
			}
			q := line[i+1 : i+1+j]
			if c == '"' {
				if strings.ContainsAny(q, "`\\") {
					t.Fatalf("expansion in %q: the walk-through must be runnable as written", line)
				}
				q = expand(q)
			}
			cur.WriteString(q)
			inWord = true
			i += j + 1
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		case c == '$':
			m := varName.FindString(line[i:])
			if m == "" {
				t.Fatalf("expansion in %q: the walk-through must be runnable as written", line)
			}
			cur.WriteString(expand(m))
			inWord = true
			i += len(m) - 1
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// curl runs a README curl command (-s, -i, -X, -H, -d) and returns its
// output as curl prints it, and the status.
func curl(t *testing.T, words []string, hosts map[string]string) (string, int) {
	t.Helper()
	method, url, body := "", "", ""
	include, hasBody := false, false
	hdr := http.Header{}
	for i := 1; i < len(words); i++ {
		switch w := words[i]; w {
		case "-s":
		case "-i", "-si":
			include = true
		case "-X", "-H", "-d":
			if i+1 == len(words) {
				t.Fatalf("%s without a value in %q", w, words)
			}
			i++
			switch w {
			case "-X":
				method = words[i]
			case "-H":
				k, v, _ := strings.Cut(words[i], ":")
				hdr.Add(k, strings.TrimSpace(v))
			case "-d":
				body, hasBody = words[i], true
			}
		default:
			if strings.HasPrefix(w, "-") {
				t.Fatalf("unknown curl flag %s", w)
			}
			url = w
		}
	}
	host, path, _ := strings.Cut(url, "/")
	addr, ok := hosts[host]
	if !ok {
		t.Fatalf("the walk-through talks to %s, which is none of the set-up's listeners", host)
	}
	if method == "" {
		method = "GET"
		if hasBody {
			method = "POST"
		}
	}
	var rd io.Reader
	if hasBody {
		rd = strings.NewReader(body)
		hdr.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends
	}
	req, err := http.NewRequest(method, "http://"+addr+"/"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out strings.Builder
	if include {
		fmt.Fprintf(&out, "HTTP/1.1 %s\r\n", resp.Status)
		resp.Header.Write(&out)
		out.WriteString("\r\n")
	}
	out.Write(b)
	return out.String(), resp.StatusCode
}

// walkStep is what one command of the walk-through must answer.
type walkStep struct {
	cmd    string   // the command as written in the tutorial, without its comment
	status int      // curl's HTTP status, or the exit status of ./idemproxy
	want   []string // regular expressions curl's output (or the command's) must match
	// again is the status when the section runs again on the same proxy,
	// where it differs (a reset that finds the key of the run before), and
	// againWant what the output must match then.
	again     int
	againWant []string
}

// walkSection is one section of the tutorial's walk-through: a heading,
// and its commands in order.
type walkSection struct {
	heading string
	steps   []walkStep
}

const (
	stubReset = `curl -s -X POST localhost:9000/reset`
	demoAuth  = `curl -s -X DELETE -H 'Authorization: Bearer demo' `
)

// forget is a section's reset of its key in the proxy: 404 no-record the
// first time, released when an earlier run left the key.
func forget(url string) walkStep {
	return walkStep{demoAuth + `"` + url + `"`, 404, []string{`no-record`}, 200, []string{`"released": true`}}
}

var walkThrough = []walkSection{
	{"### Same order twice: charged once", []walkStep{
		{cmd: stubReset, status: 204},
		forget("$IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/ORD-2001?force=true"),
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-2001", "amount": 100}'`, status: 201, want: []string{`"chargeId"`}},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-2001", "amount": 100}'`, status: 201, want: []string{"Idempotent-Replayed: true"}},
		{cmd: `curl -s localhost:9000/orders/ORD-2001/charges`, status: 200, want: []string{`"charges":1,`}},
		{cmd: `curl -s $IDEMPROXY_LISTEN/charges -H 'X-Correlation-ID: CLIENT-TRY-2' -d '{"orderId": "ORD-2001", "amount": 100}'`, status: 201},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-2001", "amount": 999}'`, status: 422, want: []string{"fingerprint-mismatch"}},
		{cmd: `curl -s localhost:9000/orders/ORD-2001/charges`, status: 200, want: []string{`"charges":1,`}},
	}},
	{"### A send timestamp is not part of the request", []walkStep{
		{cmd: stubReset, status: 204},
		forget("$IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/1001?force=true"),
		{cmd: `curl -s $IDEMPROXY_LISTEN/charges -d '{"orderId": 1001, "amount": 5, "sentAt": "10:00"}'`, status: 201},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": 1001, "amount": 5, "sentAt": "10:05"}'`, status: 201, want: []string{"Idempotent-Replayed: true"}},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "1001", "amount": 5, "sentAt": "10:00"}'`, status: 422, want: []string{"fingerprint-mismatch"}},
		{cmd: `curl -s localhost:9000/orders/1001/charges`, status: 200, want: []string{`"charges":1,`}},
	}},
	{"### The trap: the charge fails before charging", []walkStep{
		{cmd: stubReset, status: 204},
		forget("$IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/ORD-3001?force=true"),
		{cmd: `curl -s localhost:9000/faults -d '{"fault": "fail-before-charge"}'`, status: 201},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, status: 500},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, status: 500, want: []string{"Idempotent-Replayed: true"}},
		{cmd: `curl -s localhost:9000/orders/ORD-3001/charges`, status: 200, want: []string{`"charges":0,`}},
		{cmd: `curl -s -X DELETE -H 'Authorization: Bearer demo' $IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/ORD-3001`, status: 200, want: []string{`"released": true`}},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, status: 201},
		{cmd: `curl -s localhost:9000/orders/ORD-3001/charges`, status: 200, want: []string{`"charges":1,`}},
	}},
	{"### An answer that comes too late: the key is in doubt", []walkStep{
		{cmd: stubReset, status: 204},
		forget("$IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/ORD-4001?force=true"),
		{cmd: `curl -s localhost:9000/faults -d '{"fault": "delay", "delay": "40s"}'`, status: 201},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-4001", "amount": 10}'`, status: 504},
		{cmd: `curl -si $IDEMPROXY_LISTEN/charges -d '{"orderId": "ORD-4001", "amount": 10}'`, status: 409, want: []string{"outcome-in-doubt"}},
		{cmd: `curl -s -H 'Authorization: Bearer demo' $IDEMPROXY_ADMIN_LISTEN/v1/keys/charges/ORD-4001`, status: 200, want: []string{`"state": "in_doubt"`}},
		{cmd: `curl -s localhost:9000/orders/ORD-4001/charges`, status: 200, want: []string{`"charges":1,`}},
		{cmd: `export IDEMPROXY_ADMIN_TOKEN=demo`},
		{cmd: `./idemproxy keys list charges -state in_doubt`, want: []string{`(?m)^ORD-4001\s+in_doubt\s`}},
	}},
	{"### A client-chosen key, one key space per API key", []walkStep{
		{cmd: stubReset, status: 204},
		forget("$IDEMPROXY_ADMIN_LISTEN/v1/keys/order-charges/7f1c?scope=alice&force=true"),
		{cmd: `curl -si $IDEMPROXY_LISTEN/orders/ORD-5001/charges -H 'Idempotency-Key: 7f1c' -H 'X-Api-Key: alice' -d '{"amount": 3}'`, status: 201},
		{cmd: `curl -si $IDEMPROXY_LISTEN/orders/ORD-5001/charges -H 'Idempotency-Key: 7f1c' -H 'X-Api-Key: alice' -d '{"amount": 3}'`, status: 201, want: []string{"Idempotent-Replayed: true"}},
		{cmd: `curl -s localhost:9000/orders/ORD-5001/charges`, status: 200, want: []string{`"charges":1,`}},
	}},
}

// tutorialSections returns the commands of each ### section under the
// tutorial's walk-through heading, in order: every line of its sh blocks
// but the comments.
func tutorialSections(t *testing.T) (headings []string, cmds [][]string) {
	t.Helper()
	sec := doctest.Section(t, tutorialDoc, "## The article's scenarios with curl")
	for _, part := range strings.Split(sec, "\n### ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		var lines []string
		for rest := body; ; {
			_, block, ok := strings.Cut(rest, "```sh\n")
			if !ok {
				break
			}
			block, rest, ok = strings.Cut(block, "```\n")
			if !ok {
				t.Fatalf("%s, %q: an sh block without its end", tutorialDoc, heading)
			}
			for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					lines = append(lines, line)
				}
			}
		}
		headings = append(headings, "### "+heading)
		cmds = append(cmds, lines)
	}
	return headings, cmds
}

// sameCommand says whether two command lines are the same words.
func sameCommand(t *testing.T, a, b string) bool {
	t.Helper()
	return strings.Join(shellWords(t, a), "\x00") == strings.Join(shellWords(t, b), "\x00")
}

// walkTarget is what the walk-through's commands talk to: the set-up's
// proxy and stub, under the addresses the tutorial writes.
type walkTarget struct {
	hosts map[string]string // localhost:8080 and the others, to the real address
	admin string            // the admin listener, for the key commands
	// exported are the set-up's exports (NAME=value), which the reader
	// runs in every terminal.
	exported []string
}

// runSection runs one section's commands as a reader would type them in
// a new terminal (no variable exported before) and checks each answer;
// again says that the section ran before on this proxy.
func runSection(t *testing.T, run string, sec walkSection, to walkTarget, again bool) {
	t.Helper()
	exported := append([]string(nil), to.exported...)
	for i, s := range sec.steps {
		status, want := s.status, s.want
		if again && s.again != 0 {
			status, want = s.again, s.againWant
		}
		words := shellWordsIn(t, strings.Replace(s.cmd, `"delay": "40s"`, `"delay": "8s"`, 1), exported)
		var out string
		var got int
		switch words[0] {
		case "curl":
			out, got = curl(t, words, to.hosts)
		case "export":
			if len(words) != 2 || !strings.Contains(words[1], "=") {
				t.Fatalf("%s: %q exports no variable", sec.heading, s.cmd)
			}
			exported = append(exported, words[1])
			continue
		case "./idemproxy":
			// The set-up's ./idemproxy is the binary the tests built; it
			// finds the admin listener from the exported
			// $IDEMPROXY_ADMIN_LISTEN, as the reader's does.
			var stderr string
			out, stderr, got = runBin(t, exported, words[1:]...)
			out += stderr
		default:
			t.Fatalf("%s: the test cannot run %q", sec.heading, s.cmd)
		}
		if got != status {
			t.Errorf("%s, %s, step %d %s: status %d, want %d\n%s", run, sec.heading, i+1, s.cmd, got, status, out)
		}
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(out) {
				t.Errorf("%s, %s, step %d %s: the output does not match %s:\n%s", run, sec.heading, i+1, s.cmd, w, out)
			}
		}
	}
}

// TestREADMEWalkThroughTwice runs the tutorial's walk-through as written,
// from the README's set-up command: twice in a row against the same proxy
// and stub, without a restart (each section's reset must return both to a
// clean state), then each section alone in reverse order (any section can
// be run from a clean state, whatever ran before it), then once more after
// restarting the proxy as the set-up command does (rm -rf data). Every
// answer the tutorial states is checked every time. The upstream timeout
// and the injected delay are shortened (30s and 40s in the tutorial), the
// addresses are free ports; nothing else differs.
func TestREADMEWalkThroughTwice(t *testing.T) {
	t.Parallel()
	setupLines := docBlock(t, "README.md", "## Set up")
	if len(setupLines) != 2 {
		t.Fatalf("the set-up is %d lines, the test knows 2: the export of the addresses, then the command", len(setupLines))
	}
	// The export of the addresses: the test's free ports take the place of
	// the README's, as a reader whose 8080 is taken changes that line.
	exportWords := shellWords(t, setupLines[0])
	if len(exportWords) != 3 || exportWords[0] != "export" {
		t.Fatalf("the set-up's first line %q is not the export of the two addresses", setupLines[0])
	}
	ports := pickPorts(t, 2)
	free := map[string]string{
		"IDEMPROXY_LISTEN":       fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"IDEMPROXY_ADMIN_LISTEN": fmt.Sprintf("127.0.0.1:%d", ports[1]),
	}
	var exports []string
	for _, kv := range exportWords[1:] {
		name, _, _ := strings.Cut(kv, "=")
		if free[name] == "" {
			t.Fatalf("the set-up exports %q, the test knows IDEMPROXY_LISTEN and IDEMPROXY_ADMIN_LISTEN", kv)
		}
		exports = append(exports, name+"="+free[name])
	}
	setup := setupLines[1]
	// The set-up command: its parts, as sh runs them.
	var removes []string
	env := append([]string(nil), exports...)
	var cfgFile string
	built := false
	for _, part := range strings.FieldsFunc(setup, func(r rune) bool { return r == ';' || r == '&' }) {
		w := shellWords(t, part)
		switch {
		case strings.Join(w, " ") == "go build -o idemproxy .":
			built = true // the binary the tests built stands in for it
		case len(w) >= 3 && w[0] == "rm" && w[1] == "-rf":
			removes = append(removes, w[2:]...)
		case len(w) >= 3 && strings.Join(w[:3], " ") == "go run ./upstream-stub":
		default:
			for len(w) > 0 && strings.Contains(w[0], "=") {
				env, w = append(env, w[0]), w[1:]
			}
			if len(w) != 3 || strings.Join(w[:2], " ") != "./idemproxy -config" {
				t.Fatalf("set-up part %q is not the build, the stub, the proxy or rm -rf", part)
			}
			cfgFile = w[2]
		}
	}
	if !built {
		t.Fatalf("the set-up command %q does not build ./idemproxy (go build -o idemproxy .), which it runs and the tutorial's key commands use", setup)
	}
	b, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatalf("the set-up's configuration: %v", err)
	}
	up := startStub(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := string(b)
	for _, r := range []struct{ old, new string }{
		{"upstream: http://127.0.0.1:9000", "upstream: " + up.URL},
		{"dir: ./data", "dir: " + data},
		{"lease: 35s", "lease: 5s"},
		{"upstream_timeout: 30s", "upstream_timeout: 3s"},
	} {
		if strings.Count(cfg, r.old) != 1 {
			t.Fatalf("%s does not say %q once", cfgFile, r.old)
		}
		cfg = strings.Replace(cfg, r.old, r.new, 1)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	// The tutorial's commands are the test's, section by section.
	headings, cmds := tutorialSections(t)
	if len(headings) != len(walkThrough) {
		t.Fatalf("the walk-through in %s has %d sections %q, the test knows %d: update walkThrough", tutorialDoc, len(headings), headings, len(walkThrough))
	}
	var all []string
	for i, sec := range walkThrough {
		if headings[i] != sec.heading {
			t.Fatalf("section %d of the walk-through is %q in %s, the test has %q: update walkThrough", i+1, headings[i], tutorialDoc, sec.heading)
		}
		if len(cmds[i]) != len(sec.steps) {
			t.Fatalf("%s, %q: %d commands, the test knows %d: update walkThrough", tutorialDoc, sec.heading, len(cmds[i]), len(sec.steps))
		}
		for j, s := range sec.steps {
			if !sameCommand(t, cmds[i][j], s.cmd) {
				t.Fatalf("%s, %q, command %d is %q, the test has %q: update walkThrough", tutorialDoc, sec.heading, j+1, cmds[i][j], s.cmd)
			}
		}
		all = append(all, cmds[i]...)
	}
	// The README's scenarios are steps of the walk-through, in its order, so
	// the runs below answer for them too.
	next := 0
	for _, heading := range []string{"### 1. The same order twice is charged once", "### 2. The same key with another body is a 422, not a silent duplicate",
		"### 3. The upstream fails with a 5xx", "### 4. An answer that never comes: the key is in doubt"} {
		for _, line := range docBlock(t, "README.md", heading) {
			if !strings.HasPrefix(line, "curl ") {
				continue
			}
			found := false
			for j := next; j < len(all); j++ {
				if sameCommand(t, all[j], line) {
					found = true
					next = j + 1
					break
				}
			}
			if !found {
				t.Errorf("the README's scenario line %q is not a later step of the walk-through in %s", line, tutorialDoc)
			}
		}
	}

	stubAddr := strings.TrimPrefix(up.URL, "http://")
	start := func() (*proc, walkTarget) {
		for _, r := range removes {
			if r != "data" {
				t.Fatalf("the set-up removes %q; the configuration's store is ./data", r)
			}
			os.RemoveAll(data)
		}
		p := startProxy(t, path, env...)
		if p.addr != free["IDEMPROXY_LISTEN"] || p.admin != free["IDEMPROXY_ADMIN_LISTEN"] {
			t.Fatalf("the proxy listens on %s, admin %s; the set-up exported %v", p.addr, p.admin, exports)
		}
		return p, walkTarget{map[string]string{"localhost:8080": p.addr, "localhost:9091": p.admin, "localhost:9000": stubAddr,
			p.addr: p.addr, p.admin: p.admin}, p.admin, exports}
	}
	stop := func(run string, p *proc) {
		p.signal(syscall.SIGINT) // Ctrl-C
		if code := p.wait(); code != 0 {
			t.Fatalf("%s: the proxy exited %d:\n%s", run, code, p.log)
		}
	}

	p, to := start()
	for _, sec := range walkThrough {
		runSection(t, "run 1", sec, to, false)
	}
	for _, sec := range walkThrough {
		runSection(t, "run 2 (same proxy and stub)", sec, to, true)
	}
	for i := len(walkThrough) - 1; i >= 0; i-- {
		runSection(t, "run 3 (each section alone, in reverse order)", walkThrough[i], to, true)
	}
	stop("run 3", p)

	p, to = start()
	for _, sec := range walkThrough {
		runSection(t, "run 4 (restarted as the set-up says)", sec, to, false)
	}
	// ORD-4001 is in doubt now: the runbook's listing, as a reader of the
	// tutorial would type it (idemproxy is the set-up's ./idemproxy, the
	// token exported as the tutorial says), finds it.
	runbookListsTheKey(t, to, "ORD-4001")
	stop("run 4", p)
}

// runbookListsTheKey runs the commands of docs/operations.md's in-doubt
// runbook that list the keys, with the token the tutorial exports, and
// checks that each answers and that the listings name key.
func runbookListsTheKey(t *testing.T, to walkTarget, key string) {
	t.Helper()
	const token = "IDEMPROXY_ADMIN_TOKEN=demo"
	name, value, _ := strings.Cut(token, "=")
	lines := docBlock(t, operationsDoc, "## Runbook: keys in doubt")
	if len(lines) < 2 {
		t.Fatalf("%s, the in-doubt runbook: no commands", operationsDoc)
	}
	for _, line := range lines {
		line = strings.TrimSpace(line)
		words := shellWords(t, strings.ReplaceAll(line, "$"+name, value))
		var out string
		var code int
		switch words[0] {
		case "idemproxy":
			var stderr string
			out, stderr, code = runBin(t, []string{token, "IDEMPROXY_ADMIN_URL=http://" + to.admin}, words[1:]...)
			out += stderr
			if code != 0 {
				t.Errorf("runbook: %s: exit %d, want 0\n%s", line, code, out)
			}
		case "curl":
			out, code = curl(t, words, to.hosts)
			if code != 200 {
				t.Errorf("runbook: %s: status %d, want 200\n%s", line, code, out)
			}
		default:
			t.Fatalf("runbook: the test cannot run %q", line)
		}
		if strings.Contains(line, "state in_doubt") || strings.Contains(line, "state=in_doubt") {
			if !strings.Contains(out, key) {
				t.Errorf("runbook: %s does not list %s, which is in doubt:\n%s", line, key, out)
			}
		}
	}
}
