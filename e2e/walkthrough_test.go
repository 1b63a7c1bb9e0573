package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/doctest"
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
// comment.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
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
			if c == '"' && strings.ContainsAny(q, "$`\\") {
				t.Fatalf("expansion in %q: the walk-through must be runnable as written", line)
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
			t.Fatalf("expansion in %q: the walk-through must be runnable as written", line)
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

// walkStep is what one curl line of the walk-through must answer.
type walkStep struct {
	cmd    string   // the command as written in the README, without its comment
	status int      // the status
	want   []string // substrings of curl's output
}

var walkThrough = []walkStep{
	{`curl -s -X DELETE localhost:9000/charges`, 204, nil},
	{`curl -s -X DELETE localhost:9000/faults`, 204, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-2001", "amount": 100}'`, 201, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-2001", "amount": 100}'`, 201, []string{"Idempotent-Replayed: true"}},
	{`curl -s localhost:9000/orders/ORD-2001/charges`, 200, []string{`"charges":1`}},
	{`curl -s localhost:8080/charges -H 'X-Correlation-ID: CLIENT-TRY-2' -d '{"orderId": "ORD-2001", "amount": 100}'`, 201, nil},
	{`curl -s localhost:8080/charges -d '{"orderId": 1001, "amount": 5, "sentAt": "10:00"}'`, 201, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": 1001, "amount": 5, "sentAt": "10:05"}'`, 201, []string{"Idempotent-Replayed: true"}},
	{`curl -si localhost:8080/charges -d '{"orderId": "1001", "amount": 5, "sentAt": "10:00"}'`, 422, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-2001", "amount": 999}'`, 422, []string{"fingerprint-mismatch"}},
	{`curl -s localhost:9000/faults -d '{"fault": "fail-before-charge"}'`, 201, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, 500, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, 500, []string{"Idempotent-Replayed: true"}},
	{`curl -s -X DELETE -H 'Authorization: Bearer demo' localhost:9091/v1/keys/charges/ORD-3001`, 200, []string{`"released": true`}},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-3001", "amount": 10}'`, 201, nil},
	{`curl -s localhost:9000/faults -d '{"fault": "delay", "delay": "40s"}'`, 201, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-4001", "amount": 10}'`, 504, nil},
	{`curl -si localhost:8080/charges -d '{"orderId": "ORD-4001", "amount": 10}'`, 409, []string{"outcome-in-doubt"}},
	{`curl -s -H 'Authorization: Bearer demo' localhost:9091/v1/keys/charges/ORD-4001`, 200, []string{`"state": "in_doubt"`}},
	{`curl -s localhost:9000/orders/ORD-4001/charges`, 200, []string{`"charges":1`}},
	{`curl -si localhost:8080/orders/ORD-5001/charges -H 'Idempotency-Key: 7f1c' -H 'X-Api-Key: alice' -d '{"amount": 3}'`, 201, nil},
}

// TestREADMEWalkThroughTwice runs the README's walk-through as written,
// from its set-up command, twice in a row: the proxy restarted as the
// set-up command says, and the stub of the first run left running (a user
// who stopped only the proxy). Each run must give what the README says.
// The upstream timeout and the injected delay are shortened (30s and 40s
// in the README), the addresses are free ports; nothing else differs.
func TestREADMEWalkThroughTwice(t *testing.T) {
	t.Parallel()
	setup := docBlock(t, "README.md", "## Set up")[0]
	// The set-up command: its parts, as sh runs them.
	var removes []string
	var env []string
	var cfgFile string
	for _, part := range strings.FieldsFunc(setup, func(r rune) bool { return r == ';' || r == '&' }) {
		w := shellWords(t, part)
		switch {
		case len(w) >= 3 && w[0] == "rm" && w[1] == "-rf":
			removes = append(removes, w[2:]...)
		case len(w) >= 3 && strings.Join(w[:3], " ") == "go run ./upstream-stub":
		default:
			for len(w) > 0 && strings.Contains(w[0], "=") {
				env, w = append(env, w[0]), w[1:]
			}
			if len(w) != 5 || strings.Join(w[:4], " ") != "go run . -config" {
				t.Fatalf("set-up part %q is not the stub, the proxy or rm -rf", part)
			}
			cfgFile = w[4]
		}
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
		{"listen: 127.0.0.1:8080", "listen: 127.0.0.1:0"},
		{"listen: 127.0.0.1:9091", "listen: 127.0.0.1:0"},
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

	var cmds []string
	for _, line := range docBlock(t, tutorialDoc, "## The article's scenarios with curl") {
		if strings.HasPrefix(line, "curl ") {
			cmds = append(cmds, strings.Join(shellWords(t, line), "\x00"))
		}
	}
	if len(cmds) != len(walkThrough) {
		t.Fatalf("the walk-through in %s has %d curl commands, the test knows %d: update walkThrough", tutorialDoc, len(cmds), len(walkThrough))
	}
	for i, s := range walkThrough {
		if cmds[i] != strings.Join(shellWords(t, s.cmd), "\x00") {
			t.Fatalf("walk-through command %d is %q in %s, the test has %q: update walkThrough",
				i+1, strings.ReplaceAll(cmds[i], "\x00", " "), tutorialDoc, s.cmd)
		}
	}
	// The README's scenarios are steps of the walk-through, in its order, so
	// the run below answers for them too.
	next := 0
	for _, heading := range []string{"### 1. The same order twice is charged once", "### 2. The same key with another body is a 422, not a silent duplicate",
		"### 3. The upstream fails with a 5xx", "### 4. An answer that never comes: the key is in doubt"} {
		for _, line := range docBlock(t, "README.md", heading) {
			if !strings.HasPrefix(line, "curl ") {
				continue
			}
			w := strings.Join(shellWords(t, line), "\x00")
			found := false
			for j := next; j < len(cmds); j++ {
				if cmds[j] == w {
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

	for run := 1; run <= 2; run++ {
		for _, r := range removes {
			if r != "data" {
				t.Fatalf("the set-up removes %q; the configuration's store is ./data", r)
			}
			os.RemoveAll(data)
		}
		p := startProxy(t, path, env...)
		hosts := map[string]string{"localhost:8080": p.addr, "localhost:9091": p.admin, "localhost:9000": strings.TrimPrefix(up.URL, "http://")}
		for i, s := range walkThrough {
			words := shellWords(t, strings.Replace(s.cmd, `"delay": "40s"`, `"delay": "8s"`, 1))
			out, status := curl(t, words, hosts)
			if status != s.status {
				t.Errorf("run %d, step %d %s: status %d, want %d\n%s", run, i+1, s.cmd, status, s.status, out)
			}
			for _, w := range s.want {
				if !strings.Contains(out, w) {
					t.Errorf("run %d, step %d %s: the output lacks %s:\n%s", run, i+1, s.cmd, w, out)
				}
			}
		}
		for order, want := range map[string]int{"ORD-2001": 1, "1001": 1, "ORD-3001": 1, "ORD-4001": 1} {
			if got := chargeCount(t, up.URL, order); got != want {
				t.Errorf("run %d: %s charged %d times, want %d", run, order, got, want)
			}
		}
		p.signal(syscall.SIGINT) // Ctrl-C
		if code := p.wait(); code != 0 {
			t.Fatalf("run %d: the proxy exited %d:\n%s", run, code, p.log)
		}
	}
}
