package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// runBin runs the binary with args and env added to an environment
// without the admin variables, and returns its output and exit status.
func runBin(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// cleanEnv is the test's environment without the variables the binary
// reads, so that the caller's shell does not change what a test sees.
func cleanEnv() []string {
	var env []string
	for _, kv := range exec.Command("true").Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "IDEMPROXY_ADMIN_TOKEN", "IDEMPROXY_ADMIN_URL", "IDEMPROXY_CONFIG", "IDEMPROXY_LISTEN", "IDEMPROXY_ADMIN_LISTEN", "IDEMPROXY_UPSTREAM":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TestKeysShowAndRelease: an operator looks at a key and releases it with
// the binary's keys subcommands against a running proxy; the table and
// the JSON say what the admin API says, and the retry is charged after the
// release.
func TestKeysShowAndRelease(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := charge(p, "ORD-K1", "X-Stub-Fault", "fail-before-charge"); r.status != 500 {
		t.Fatalf("failed charge = %d", r.status)
	}
	env := []string{"IDEMPROXY_ADMIN_TOKEN=s3cret", "IDEMPROXY_ADMIN_URL=http://" + p.admin}

	out, errOut, code := runBin(t, env, "keys", "show", "charges", "ORD-K1")
	if code != 0 {
		t.Fatalf("keys show = exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{"route", "charges", "key", "ORD-K1", "state", "completed", "stored_status", "500"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys show table does not show %q:\n%s", want, out)
		}
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); !strings.HasPrefix(lines[0], "route ") || !strings.HasPrefix(lines[1], "key ") {
		t.Errorf("keys show table starts with %q, want route then key", lines[:2])
	}

	// -o json is the API's JSON, flags after the arguments too.
	out, _, code = runBin(t, []string{"IDEMPROXY_ADMIN_TOKEN=s3cret"}, "keys", "show", "charges", "ORD-K1", "-admin", p.admin, "-o", "json")
	var v struct {
		Key          string `json:"key"`
		State        string `json:"state"`
		StoredStatus int    `json:"stored_status"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Key != "ORD-K1" || v.State != "completed" || v.StoredStatus != 500 {
		t.Errorf("keys show -o json = exit %d %v %+v:\n%s", code, err, v, out)
	}

	out, errOut, code = runBin(t, append(env, "USER=alice"), "keys", "release", "charges", "ORD-K1", "-reason", "INC-7")
	if code != 0 || !strings.Contains(out, "released") || !strings.Contains(out, "true") || !strings.Contains(out, "completed") {
		t.Errorf("keys release = exit %d:\n%s%s", code, out, errOut)
	}
	if l := p.log.logLines("key released by an operator"); len(l) != 1 || l[0]["operator"] != "alice" || l[0]["reason"] != "INC-7" {
		t.Errorf("audit log line = %v, want operator alice, reason INC-7", l)
	}
	if r := charge(p, "ORD-K1"); r.status != 201 {
		t.Errorf("charge after the release = %d %s, want 201", r.status, r.body)
	}

	// The API's problems: title and detail, exit 1.
	problems := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"no record", env, []string{"keys", "show", "charges", "ORD-NONE"},
			[]string{"No record for this key (404): no record for this key"}},
		{"unknown route", env, []string{"keys", "release", "refunds", "X"},
			[]string{"No route with this name (404)", `no route named "refunds"`}},
		{"wrong token", []string{"IDEMPROXY_ADMIN_TOKEN=wrong", "IDEMPROXY_ADMIN_URL=" + p.admin}, []string{"keys", "show", "charges", "ORD-K1"},
			[]string{"Bearer token missing or wrong (401)"}},
		{"no reconcile lookup", env, []string{"keys", "reconcile", "charges", "ORD-K1"},
			[]string{"Route has no reconcile lookup (400): route charges has no reconcile lookup"}},
		{"not listening", []string{"IDEMPROXY_ADMIN_TOKEN=s3cret"}, []string{"keys", "show", "charges", "X", "-admin", "http://" + closedAddr(t)},
			[]string{"did not answer"}},
	}
	for _, tt := range problems {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runBin(t, tt.env, tt.args...)
			if code != 1 || out != "" {
				t.Errorf("exit %d, stdout %q; want 1 and nothing on stdout", code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q does not contain %q", errOut, w)
				}
			}
		})
	}
}

// closedAddr returns an address nothing listens on.
func closedAddr(t *testing.T) string {
	s := httptest.NewServer(http.NotFoundHandler())
	addr := s.Listener.Addr().String()
	s.Close()
	return addr
}

// TestKeysUsage: bad usage exits 2 and says what is expected, before any
// request.
func TestKeysUsage(t *testing.T) {
	t.Parallel()
	tok := []string{"IDEMPROXY_ADMIN_TOKEN=t", "IDEMPROXY_ADMIN_URL=http://" + closedAddr(t)}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no subcommand", tok, []string{"keys"}, "idemproxy keys list ROUTE"},
		{"unknown subcommand", tok, []string{"keys", "purge", "charges"}, `unknown subcommand "purge"`},
		{"show without key", tok, []string{"keys", "show", "charges"}, "show takes ROUTE KEY"},
		{"list with a key", tok, []string{"keys", "list", "charges", "K"}, "list takes ROUTE"},
		{"bad output", tok, []string{"keys", "list", "charges", "-o", "yaml"}, `-o "yaml": table or json`},
		{"unknown flag", tok, []string{"keys", "list", "charges", "-nope"}, "flag provided but not defined: -nope"},
		{"no token", nil, []string{"keys", "list", "charges"}, "IDEMPROXY_ADMIN_TOKEN is not set"},
		{"token from another variable", tok, []string{"keys", "list", "charges", "-token-env", "MY_TOKEN"}, "MY_TOKEN is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := runBin(t, tt.env, tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant 2 and %q", code, errOut, tt.want)
			}
		})
	}
	if out, errOut, code := runBin(t, nil, "keys", "-h"); code != 0 || !strings.Contains(errOut+out, "-state") {
		t.Errorf("keys -h = exit %d:\n%s%s", code, out, errOut)
	}
}

// TestKeysReconcile: a key left in doubt by a crash is reconciled by the
// operator with keys reconcile -reason: the route's lookup finds the
// charge, the audit line has the reason, and the retry is replayed with
// the charge's 201, not charged again.
func TestKeysReconcile(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	route := `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 1s
    lease: 1500ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 1h, interval: 1h}
`
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", route)
	p := startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := do("POST", up.URL+"/faults", `{"fault": "delay", "delay": "900ms"}`); r.status != http.StatusCreated {
		t.Fatalf("queue fault: %v", r)
	}
	go do("POST", p.url("/charges"), `{"orderId": "CR-9", "amount": 5}`)
	eventually(t, "the stub charged CR-9", func() bool { return chargeCount(t, up.URL, "CR-9") == 1 })
	p.signal(syscall.SIGKILL)
	p.wait()
	p = startProxy(t, cfg, "IDEMPROXY_ADMIN_TOKEN=s3cret")
	env := []string{"IDEMPROXY_ADMIN_TOKEN=s3cret", "IDEMPROXY_ADMIN_URL=" + p.admin}

	// In flight until its lease ends, then in doubt.
	var out, errOut string
	eventually(t, "keys reconcile succeeds", func() bool {
		var code int
		out, errOut, code = runBin(t, env, "keys", "reconcile", "charges", "CR-9", "-reason", "INC-9 charged upstream")
		if code == 1 && !strings.Contains(errOut, "Key not in doubt (409)") {
			t.Fatalf("keys reconcile = exit 1: %s", errOut)
		}
		return code == 0
	})
	if !strings.Contains(out, "result") || !strings.Contains(out, "applied") {
		t.Errorf("keys reconcile printed:\n%s\nwant result applied", out)
	}
	if l := p.log.logLines("key reconciled by an operator"); len(l) != 1 || l[0]["reason"] != "INC-9 charged upstream" {
		t.Errorf("audit log lines = %v, want one with the reason INC-9 charged upstream", l)
	}
	if r := do("POST", p.url("/charges"), `{"orderId": "CR-9", "amount": 5}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Reconciled") != "true" {
		t.Errorf("retry = %d %v, want the reconciled charge replayed with the route's 201", r.status, r.header)
	}
	if n := chargeCount(t, up.URL, "CR-9"); n != 1 {
		t.Errorf("charges of CR-9 = %d, want 1", n)
	}
	out, errOut, code := runBin(t, env, "keys", "reconcile", "charges", "CR-9")
	if code != 1 || !strings.Contains(errOut, "Key not in doubt (409)") {
		t.Errorf("reconcile of a settled key = exit %d %s%s, want 1 and the problem", code, out, errOut)
	}
}

// TestKeysList: from the in-doubt alert to the keys, with the binary: the
// table names the raw keys in doubt, -limit pages with the cursor it
// prints, -o json is the API's answer, -key-hash finds a log line's key,
// and a bad state is the API's problem.
func TestKeysList(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	route := `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 1s
    lease: 2s
`
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", route),
		"IDEMPROXY_ADMIN_TOKEN=s3cret")
	for _, order := range []string{"ORD-D1", "ORD-D2"} {
		if r := charge(p, order, "X-Stub-Fault", "delay", "X-Stub-Delay", "3s"); r.status != http.StatusGatewayTimeout {
			t.Fatalf("charge %s with a late answer = %d %s, want 504", order, r.status, r.body)
		}
	}
	if r := charge(p, "ORD-OK"); r.status != http.StatusCreated {
		t.Fatalf("charge ORD-OK = %d %s, want 201", r.status, r.body)
	}
	env := []string{"IDEMPROXY_ADMIN_TOKEN=s3cret", "IDEMPROXY_ADMIN_URL=" + p.admin}

	out, errOut, code := runBin(t, env, "keys", "list", "charges", "-state", "in_doubt")
	if code != 0 {
		t.Fatalf("keys list = exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "KEY ") || !strings.Contains(lines[0], "STATE") {
		t.Fatalf("keys list -state in_doubt =\n%s\nwant a header and two keys", out)
	}
	var keys []string
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if f[1] != "in_doubt" {
			t.Errorf("line %q: state %s, want in_doubt", l, f[1])
		}
		keys = append(keys, f[0])
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"ORD-D1", "ORD-D2"}) {
		t.Errorf("in-doubt keys = %v, want ORD-D1 and ORD-D2", keys)
	}

	// A page at a time: the first page says how to get the next.
	out, errOut, code = runBin(t, env, "keys", "list", "charges", "-limit", "2")
	cursor, ok := strings.CutPrefix(strings.TrimSpace(errOut), "more keys: add -cursor ")
	if code != 0 || !ok || len(strings.Split(strings.TrimSpace(out), "\n")) != 3 {
		t.Fatalf("keys list -limit 2 = exit %d\n%s\nstderr %q; want two keys and the cursor", code, out, errOut)
	}
	out, errOut, code = runBin(t, env, "keys", "list", "charges", "-limit", "2", "-cursor", cursor, "-o", "json")
	var page struct {
		Keys []struct {
			Key, State, KeyHash string
			StoredStatus        int `json:"stored_status"`
		} `json:"keys"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil || len(page.Keys) != 1 || page.NextCursor != nil {
		t.Fatalf("the last page = exit %d %v\n%s%s\nwant one key and no cursor", code, err, out, errOut)
	}

	// The key_hash of a log line leads to its key.
	out, _, _ = runBin(t, env, "keys", "list", "charges", "-o", "json", "-key-hash", keyHashOf(t, env, "ORD-OK"))
	if !strings.Contains(out, `"key": "ORD-OK"`) || strings.Contains(out, "ORD-D") {
		t.Errorf("keys list -key-hash = %s, want ORD-OK alone", out)
	}

	out, errOut, code = runBin(t, env, "keys", "list", "charges", "-state", "doubtful")
	if code != 1 || out != "" || !strings.Contains(errOut, "(400)") || !strings.Contains(errOut, "doubtful") {
		t.Errorf("keys list -state doubtful = exit %d %q %q, want 1 and the 400 problem naming the state", code, out, errOut)
	}
}

// keyHashOf returns the key_hash the listing gives the key.
func keyHashOf(t *testing.T, env []string, key string) string {
	t.Helper()
	out, errOut, code := runBin(t, env, "keys", "list", "charges", "-o", "json")
	var page struct {
		Keys []struct {
			Key     string `json:"key"`
			KeyHash string `json:"key_hash"`
		} `json:"keys"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil {
		t.Fatalf("keys list -o json = exit %d %v: %s", code, err, errOut)
	}
	for _, k := range page.Keys {
		if k.Key == key {
			return k.KeyHash
		}
	}
	t.Fatalf("%s not listed: %s", key, out)
	return ""
}

// TestKeysReleaseInFlight: the admin API refuses to release a key whose
// request is at the upstream, and advises each of its users its own way
// to insist: ?force=true to the API's, -force to the binary's. The binary
// names its OS user as the operator when -operator is not given, and a
// request without X-Operator leaves "operator" out of the audit line.
// Problem bodies end with a newline.
func TestKeysReleaseInFlight(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute),
		"IDEMPROXY_ADMIN_TOKEN=s3cret")
	if r := charge(p, "ORD-F2"); r.status != http.StatusCreated {
		t.Fatalf("charge ORD-F2 = %d %s, want 201", r.status, r.body)
	}
	// ORD-F1 is in flight: the stub charged it and sits on the answer.
	done := make(chan result, 1)
	go func() { done <- charge(p, "ORD-F1", "X-Stub-Fault", "delay", "X-Stub-Delay", "5s") }()
	eventually(t, "ORD-F1 reaches the upstream", func() bool { return chargeCount(t, up.URL, "ORD-F1") == 1 })
	env := []string{"IDEMPROXY_ADMIN_TOKEN=s3cret", "IDEMPROXY_ADMIN_URL=" + p.admin}

	out, errOut, code := runBin(t, env, "keys", "release", "charges", "ORD-F1")
	want := "idemproxy keys: Key in flight (409): the key is in flight: its request is being forwarded now; wait for it to settle, or add -force\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("keys release of a key in flight = exit %d, stdout %q, stderr %q\nwant exit 1, stderr %q", code, out, errOut, want)
	}
	api := p.adminURL("/v1/keys/charges/")
	r := do(http.MethodDelete, api+"ORD-F1", "", "Authorization", "Bearer s3cret")
	var prob struct{ Detail, Override string }
	json.Unmarshal([]byte(r.body), &prob)
	if r.status != http.StatusConflict || !strings.HasSuffix(prob.Detail, "or add ?force=true") || prob.Override != "?force=true" ||
		!strings.HasSuffix(r.body, "}\n") {
		t.Errorf("DELETE of a key in flight = %d %q, want 409 advising ?force=true, its override member, and a newline at the end", r.status, r.body)
	}

	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runBin(t, append(env, "USER="), "keys", "release", "charges", "ORD-F1", "-force"); code != 0 {
		t.Errorf("keys release -force = exit %d: %s%s", code, out, errOut)
	}
	if r := do(http.MethodDelete, api+"ORD-F2", "", "Authorization", "Bearer s3cret"); r.status != http.StatusOK {
		t.Errorf("DELETE ORD-F2 = %d %s, want 200", r.status, r.body)
	}
	l := p.log.logLines("key released by an operator")
	if len(l) != 2 {
		t.Fatalf("audit lines = %v, want two releases", l)
	}
	if got := l[0]["operator"]; l[0]["previous_state"] != "in_flight" || got != me.Username {
		t.Errorf("audit line of keys release without -operator nor $USER = %v, want previous_state in_flight, operator %q (the OS user)", l[0], me.Username)
	}
	if got, ok := l[1]["operator"]; ok {
		t.Errorf("audit line of a DELETE without X-Operator has operator %q, want none", got)
	}
	<-done
}
