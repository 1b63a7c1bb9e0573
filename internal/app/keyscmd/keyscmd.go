// Package keyscmd is "idemproxy keys": the command-line client of the
// admin API's key endpoints (list, show, release, reconcile).
package keyscmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app/audit"
)

// The keys subcommands call the admin API of a running idemproxy: list,
// show, release and reconcile keys. They exit 0 on success, 1 when the API
// answers a problem (or cannot be reached), 2 on bad usage.

const (
	adminURLEnv     = "IDEMPROXY_ADMIN_URL"
	defaultAdminURL = "http://127.0.0.1:9091" // config.example.yaml's admin.listen
)

const keysUsage = `Usage:
  idemproxy keys list ROUTE [-state in_doubt|in_flight|completed] [-limit N] [-cursor C] [-key-hash H]
  idemproxy keys show ROUTE KEY
  idemproxy keys release ROUTE KEY [-reason TEXT] [-force]
  idemproxy keys reconcile ROUTE KEY [-reason TEXT]
  idemproxy keys drop-keyspace KEYSPACE -reason TEXT

list shows a route's keys (all states unless -state), a page at a time; show
one key's record; release deletes a key's record so that the next request with
it is forwarded again; reconcile runs the route's reconcile lookup of a key in
doubt now; drop-keyspace lets the keys of a keyspace that no route claims any
more (a route renamed) or that were made by another key recipe go on purpose:
the store forgets the keyspace's record, so that the proxy serves the routes it
held and accepts the configuration (their retries are forwarded again).

They call the admin API of a running idemproxy at -admin (default
$` + adminURLEnv + `, else http:// and $` + config.AdminListenEnv + `, else
` + defaultAdminURL + `) with the bearer token of
$` + config.DefaultAdminTokenEnv + ` (or of the variable -token-env names, as
admin.token_env does). Output is a table, or the API's JSON with -o json.
Exit status: 0 ok, 1 the API answered a problem or could not be reached, 2 bad
usage.

Flags (before or after the arguments):
`

// keysCmd is one keys invocation.
type keysCmd struct {
	name     string // the command, in its messages: "idemproxy keys"
	admin    string
	token    string
	output   string
	scope    string
	operator string
	stdout   io.Writer
	stderr   io.Writer
	client   *http.Client
}

// Run runs "idemproxy keys ..." with args (after "keys") and returns the
// exit status: 0 on success, 1 on a failure, 2 on bad usage.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs, c, tokenEnv := newCmd("idemproxy keys", keysUsage, stdout, stderr, getenv)
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.StringVar(&c.scope, "scope", "", "the scope value, for a route scoped by a header")
	fs.StringVar(&c.operator, "operator", audit.Operator(getenv), "who acts, for the audit log line of release and reconcile ($USER, else the OS account, when not given)")
	state := fs.String("state", "", "list: only keys in this state: in_doubt, in_flight or completed")
	limit := fs.Int("limit", 0, "list: at most `N` keys (the API's default 100, at most 1000)")
	cursor := fs.String("cursor", "", "list: the page after the one that printed this cursor")
	keyHash := fs.String("key-hash", "", "list: only the key with this key_hash (the 12 hex digits of log lines)")
	reason := fs.String("reason", "", "release, reconcile and drop-keyspace: why, for the audit log line (the console asks for one too; drop-keyspace requires one)")
	force := fs.Bool("force", false, "release: even a key in flight (its request may be at the upstream now)")

	// Flags may follow the arguments: "keys list charges -state in_doubt".
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "idemproxy keys: "+format+" (see idemproxy keys -h)\n", a...)
		return 2
	}
	if len(pos) == 0 {
		fs.Usage()
		return 2
	}
	sub, pos := pos[0], pos[1:]
	want := 2
	if sub == "list" || sub == "drop-keyspace" {
		want = 1
	}
	switch {
	case !slices.Contains([]string{"list", "show", "release", "reconcile", "drop-keyspace"}, sub):
		return usageErr("unknown subcommand %q: list, show, release, reconcile or drop-keyspace", sub)
	case sub == "drop-keyspace" && len(pos) != 1:
		return usageErr("drop-keyspace takes KEYSPACE")
	case sub == "drop-keyspace" && *reason == "":
		return usageErr("drop-keyspace needs -reason TEXT, for the audit log line")
	case len(pos) != want && want == 1:
		return usageErr("%s takes ROUTE", sub)
	case len(pos) != want:
		return usageErr("%s takes ROUTE KEY", sub)
	case c.output != "table" && c.output != "json":
		return usageErr("-o %q: table or json", c.output)
	case *limit < 0:
		return usageErr("-limit %d: a positive number", *limit)
	}
	if msg := c.connect(*tokenEnv, getenv); msg != "" {
		return usageErr("%s", msg)
	}

	route := url.PathEscape(pos[0])
	q := url.Values{}
	if c.scope != "" {
		q.Set("scope", c.scope)
	}
	if *reason != "" && (sub == "release" || sub == "reconcile") {
		q.Set("reason", *reason) // for the audit line
	}
	switch sub {
	case "list":
		for k, v := range map[string]string{"state": *state, "cursor": *cursor, "key_hash": *keyHash} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if *limit > 0 {
			q.Set("limit", strconv.Itoa(*limit))
		}
		return c.call(ctx, http.MethodGet, "/v1/keys/"+route, q, c.printList)
	case "drop-keyspace":
		return c.call(ctx, http.MethodPost, "/v1/keyspaces/"+route+"/drop", url.Values{"reason": {*reason}}, c.printFields)
	case "show":
		return c.call(ctx, http.MethodGet, "/v1/keys/"+route+"/"+keySegment(pos[1]), q, c.printFields)
	case "release":
		if *force {
			q.Set("force", "true")
		}
		return c.call(ctx, http.MethodDelete, "/v1/keys/"+route+"/"+keySegment(pos[1]), q, c.printFields)
	default: // reconcile
		return c.call(ctx, http.MethodPost, "/v1/keys/"+route+"/"+keySegment(pos[1])+"/reconcile", q, c.printFields)
	}
}

// call sends one request to the admin API and prints its answer with
// print, or the problem it answered; it returns the exit status.
func (c *keysCmd) call(ctx context.Context, method, path string, q url.Values, print func([]byte) error) int {
	u := c.admin + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: -admin %s: %v\n", c.name, c.admin, err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if c.operator != "" {
		req.Header.Set("X-Operator", c.operator)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: the admin API at %s did not answer: %v\n", c.name, c.admin, err)
		return 1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(c.stderr, "%s: read the answer of %s %s: %v\n", c.name, method, path, err)
		return 1
	}
	if resp.StatusCode/100 != 2 {
		fmt.Fprintln(c.stderr, c.name+": "+problemText(resp, body))
		return 1
	}
	if c.output == "json" {
		c.stdout.Write(body)
		if !bytes.HasSuffix(body, []byte("\n")) {
			fmt.Fprintln(c.stdout)
		}
		return 0
	}
	if err := print(body); err != nil {
		fmt.Fprintf(c.stderr, "%s: the answer of %s %s: %v\n", c.name, method, path, err)
		return 1
	}
	return 0
}

// overrideFlags are the flags that say what a problem's "override" member
// says as a query: the admin API's advice to add "?force=true" is, to a
// user of this command, to add -force.
var overrideFlags = map[string]string{"?force=true": "-force"}

// problemText is an error answer in one line: an RFC 9457 problem's title
// and detail ("No record for this key (404): no record for ..."), or the
// status and the start of any other body. A detail that advises the query
// of the problem's override member advises the flag that sends it.
func problemText(resp *http.Response, body []byte) string {
	var p struct {
		Title    string `json:"title"`
		Detail   string `json:"detail"`
		Status   int    `json:"status"`
		Override string `json:"override"`
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "application/problem+json" && json.Unmarshal(body, &p) == nil && p.Title != "" {
		s := fmt.Sprintf("%s (%d)", p.Title, resp.StatusCode)
		if f, ok := overrideFlags[p.Override]; ok {
			if strings.Contains(p.Detail, p.Override) {
				p.Detail = strings.ReplaceAll(p.Detail, p.Override, f)
			} else {
				p.Detail = strings.TrimSpace(p.Detail + " (add " + f + " to override)")
			}
		}
		if p.Detail != "" {
			s += ": " + p.Detail
		}
		return s
	}
	text := strings.TrimSpace(string(body))
	if len(text) > 200 {
		text = text[:200] + "..."
	}
	if text == "" {
		return resp.Status
	}
	return resp.Status + ": " + text
}

// listedKey is one key of the list endpoint's answer.
type listedKey struct {
	Key            string     `json:"key"`
	KeyHash        string     `json:"key_hash"`
	ScopeHash      string     `json:"scope_hash"`
	State          string     `json:"state"`
	CreatedAt      time.Time  `json:"created_at"`
	ExpiresAt      *time.Time `json:"expires_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	StoredStatus   int        `json:"stored_status"`
}

// printList prints a page of keys as a table, and how to get the next.
func (c *keysCmd) printList(body []byte) error {
	var page struct {
		Keys       []listedKey `json:"keys"`
		NextCursor string      `json:"next_cursor"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return fmt.Errorf("not a list of keys: %w", err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tSTATUS\tCREATED\tEXPIRES\tLEASE EXPIRES\tKEY HASH\tSCOPE HASH")
	for _, k := range page.Keys {
		status := "-"
		if k.StoredStatus != 0 {
			status = strconv.Itoa(k.StoredStatus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(k.Key), k.State, status, timeText(&k.CreatedAt),
			timeText(k.ExpiresAt), timeText(k.LeaseExpiresAt), k.KeyHash, orDash(k.ScopeHash))
	}
	tw.Flush()
	if len(page.Keys) == 0 {
		fmt.Fprintln(c.stderr, "no keys")
	}
	if page.NextCursor != "" {
		fmt.Fprintf(c.stderr, "more keys: add -cursor %s\n", page.NextCursor)
	}
	return nil
}

// fieldOrder is the order in which printFields shows the fields it knows;
// the others follow in the order of their names.
var fieldOrder = []string{"route", "key", "key_hash", "scope_hash", "state", "created_at", "expires_at",
	"lease_expires_at", "stored_status", "stored_body_bytes", "fingerprint", "reconciled", "origin",
	"released", "previous_state", "result", "lookup_status", "error", "dropped", "keyspace", "recipe", "routes"}

// printFields prints a JSON object as one "name  value" line per field.
func (c *keysCmd) printFields(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		ia, ib := slices.Index(fieldOrder, a), slices.Index(fieldOrder, b)
		switch {
		case ia >= 0 && ib >= 0:
			return ia - ib
		case ia >= 0:
			return -1
		case ib >= 0:
			return 1
		}
		return strings.Compare(a, b)
	})
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	for _, k := range names {
		v := fmt.Sprint(m[k])
		if s, ok := m[k].(string); ok {
			v = printable(s)
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, v)
	}
	return tw.Flush()
}

// printable quotes a value that would break a table line (spaces, control
// characters, nothing at all) and leaves the others as they are.
func printable(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return strconv.Quote(s)
	}
	return s
}

func timeText(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// keySegment is key as one path segment. A key of "." or ".." escapes its
// dots: routers clean such segments away (a ServeMux redirects to the
// path without them, that of another key or of none).
func keySegment(key string) string {
	s := url.PathEscape(key)
	if s == "." || s == ".." {
		s = strings.ReplaceAll(s, ".", "%2E")
	}
	return s
}
