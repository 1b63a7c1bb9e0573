package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

const chargesByOrder = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
`

// storm sends n identical charges at once and returns their answers.
func (e *env) storm(n int, order string, hdr ...string) []answer {
	var wg sync.WaitGroup
	answers := make([]answer, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = send(e.srv.Client(), "POST", e.srv.URL+"/charges",
				fmt.Sprintf(`{"orderId": %q, "amount": 10}`, order), hdr...)
		}()
	}
	close(start)
	wg.Wait()
	return answers
}

func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	tests := []struct {
		name       string
		concurrent string
		// want409 is whether duplicates that arrive while the first is in
		// flight get 409 (reject) or wait for its answer (wait).
		want409 bool
	}{
		{"reject", "reject", true},
		{"wait", "wait", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    concurrent: %s
    wait_timeout: 5s
`, tt.concurrent))
			const n = 50
			// The stub holds the first answer long enough for every copy to arrive.
			answers := e.storm(n, "ORD-STORM", "X-Stub-Fault", "delay", "X-Stub-Delay", "300ms")
			var created, replayed, inFlight int
			for _, a := range answers {
				switch {
				case a.err != nil:
					t.Fatalf("request failed: %v", a.err)
				case a.status == 201 && a.replayed():
					replayed++
				case a.status == 201:
					created++
				case a.status == 409 && a.problemType() == "request-in-flight":
					inFlight++
					if a.header.Get("Retry-After") == "" {
						t.Errorf("409 in flight without Retry-After")
					}
				default:
					t.Errorf("unexpected answer %s", a)
				}
			}
			if created != 1 {
				t.Errorf("first answers = %d, want exactly 1", created)
			}
			if got := e.charges("ORD-STORM"); got != 1 {
				t.Errorf("charges = %d, want 1", got)
			}
			if tt.want409 && inFlight == 0 {
				t.Errorf("no duplicate got 409 in flight (replayed %d)", replayed)
			}
			if !tt.want409 && replayed != n-1 {
				t.Errorf("replayed = %d, want %d (every duplicate waits for the answer)", replayed, n-1)
			}
		})
	}
}

// TestConcurrentDistinctKeys: a storm over many keys charges each once.
func TestConcurrentDistinctKeys(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	const orders, copies = 40, 5
	var wg sync.WaitGroup
	for i := range orders * copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(e.srv.Client(), "POST", e.srv.URL+"/charges", fmt.Sprintf(`{"orderId": "K-%d", "amount": 1}`, i%orders))
		}()
	}
	wg.Wait()
	if got := e.totalCharges(); got != orders {
		t.Errorf("charges = %d, want %d (one per order)", got, orders)
	}
}

func TestFingerprintAndKeyCanonicalisation(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: order.id}
    fingerprint: {ignore: [sentAt]}
`)
	first := e.do("POST", "/charges", `{"order": {"id": 1001}, "orderId": "1001", "amount": 10, "sentAt": "10:00"}`)
	wantStatus(t, "first", first, 201, "")
	tests := []struct {
		name, body string
		status     int
		problem    string
		replayed   bool
	}{
		{"same request", `{"order": {"id": 1001}, "orderId": "1001", "amount": 10, "sentAt": "10:00"}`, 201, "", true},
		{"other key order and white space", "{ \"sentAt\":\"10:00\",\n \"amount\":10, \"orderId\":\"1001\", \"order\":{\"id\":1001}}", 201, "", true},
		{"the key as a string", `{"order": {"id": "1001"}, "orderId": "1001", "amount": 10, "sentAt": "10:00"}`, 422, "fingerprint-mismatch", false},
		{"a new send timestamp is ignored", `{"order": {"id": 1001}, "orderId": "1001", "amount": 10, "sentAt": "10:05"}`, 201, "", true},
		{"another amount under the same key", `{"order": {"id": 1001}, "orderId": "1001", "amount": 11, "sentAt": "10:00"}`, 422, "fingerprint-mismatch", false},
	}
	for _, tt := range tests {
		a := e.do("POST", "/charges", tt.body)
		wantStatus(t, tt.name, a, tt.status, tt.problem)
		if a.replayed() != tt.replayed {
			t.Errorf("%s: replayed = %v, want %v", tt.name, a.replayed(), tt.replayed)
		}
	}
	if got := e.charges("1001"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestNumberAndStringAreOneKey: 1001 and "1001" are the same key; with the
// fingerprint off (the body differs), the second is a replay.
func TestNumberAndStringAreOneKey(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    fingerprint: {disabled: true}
`)
	wantStatus(t, "number", e.charge(`1001`, 10), 201, "")
	second := e.charge(`"1001"`, 10)
	wantStatus(t, "string", second, 201, "")
	if !second.replayed() {
		t.Errorf("the string key was not a replay of the number key")
	}
	if got := e.charges("1001"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_body_bytes: 256
  - name: by-header
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
    scope: {header: X-Api-Key}
`)
	long := strings.Repeat("k", 256)
	tests := []struct {
		name, path, body string
		hdr              []string
		status           int
		problem          string
	}{
		{"not JSON", "/charges", `orderId=1`, nil, 400, "invalid-json"},
		{"truncated JSON", "/charges", `{"orderId": "A", "amount": 1`, nil, 400, "invalid-json"},
		{"a name twice", "/charges", `{"orderId": "A", "orderId": "B", "amount": 1}`, nil, 400, "invalid-json"},
		{"empty body", "/charges", ``, nil, 400, "invalid-json"},
		{"missing key", "/charges", `{"amount": 1}`, nil, 400, "missing-key"},
		{"null key", "/charges", `{"orderId": null, "amount": 1}`, nil, 400, "missing-key"},
		{"empty key", "/charges", `{"orderId": "", "amount": 1}`, nil, 400, "missing-key"},
		{"object key", "/charges", `{"orderId": {"id": 1}, "amount": 1}`, nil, 400, "invalid-key"},
		{"array key", "/charges", `{"orderId": [1], "amount": 1}`, nil, 400, "invalid-key"},
		{"control character in key", "/charges", `{"orderId": "A\u0007", "amount": 1}`, nil, 400, "invalid-key"},
		{"body too large", "/charges", `{"orderId": "A", "amount": 1, "pad": "` + strings.Repeat("x", 300) + `"}`, nil, 413, "body-too-large"},
		{"missing header key", "/orders/A/charges", `{"amount": 1}`, []string{"X-Api-Key", "k1"}, 400, "missing-key"},
		{"key longer than 255 bytes", "/orders/A/charges", `{"amount": 1}`, []string{"X-Api-Key", "k1", "Idempotency-Key", long}, 400, "invalid-key"},
		{"key header twice", "/orders/A/charges", `{"amount": 1}`, []string{"X-Api-Key", "k1", "Idempotency-Key", "a", "Idempotency-Key", "b"}, 400, "invalid-key"},
		{"missing scope", "/orders/A/charges", `{"amount": 1}`, []string{"Idempotency-Key", "k"}, 400, "missing-scope"},
	}
	for _, tt := range tests {
		a := e.do("POST", tt.path, tt.body, tt.hdr...)
		wantStatus(t, tt.name, a, tt.status, tt.problem)
		if got := a.field("status"); got != float64(tt.status) {
			t.Errorf("%s: problem status member = %v, want %d", tt.name, got, tt.status)
		}
	}
	if got := e.totalCharges(); got != 0 {
		t.Errorf("charges = %d, want 0: bad input must never reach the upstream", got)
	}
	if got := e.outcomes("charges", proxy.OutcomeBadRequest); got != 11 {
		t.Errorf("bad_request outcomes = %d, want 11", got)
	}
}

// TestChunkedBodyTooLarge: a body without Content-Length is cut at the limit.
func TestChunkedBodyTooLarge(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_body_bytes: 64
`)
	pr := strings.NewReader(`{"orderId": "A", "amount": 1, "pad": "` + strings.Repeat("x", 200) + `"}`)
	req, _ := http.NewRequest("POST", e.srv.URL+"/charges", struct{ *strings.Reader }{pr}) // hides the length
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", resp.StatusCode)
	}
}

func TestMissingKeyForward(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    on_missing_key: forward
`)
	for range 2 {
		wantStatus(t, "no key", e.charge(`"ORD-U"`, 1), 201, "")
	}
	if got := e.charges("ORD-U"); got != 2 {
		t.Errorf("charges = %d, want 2 (forwarded unprotected)", got)
	}
	if got := e.outcomes("charges", proxy.OutcomeUnprotected); got != 2 {
		t.Errorf("unprotected outcomes = %d, want 2", got)
	}
	wantStatus(t, "with key", e.charge(`"ORD-U"`, 1, "Idempotency-Key", "k1"), 201, "")
	if a := e.charge(`"ORD-U"`, 1, "Idempotency-Key", "k1"); !a.replayed() {
		t.Errorf("a keyed request on a forward route was not protected: %s", a)
	}
}

func TestPathAndCompositeKeys(t *testing.T) {
	e := newEnv(t, `
  - name: by-path
    match: POST /orders/{orderId}/charges
    key:
      parts: [{path: orderId}, {json: kind}]
`)
	charge := func(order, kind string) answer {
		return e.do("POST", "/orders/"+order+"/charges", fmt.Sprintf(`{"amount": 5, "kind": %q}`, kind))
	}
	wantStatus(t, "first charge", charge("ORD-P", "deposit"), 201, "")
	wantStatus(t, "second kind of charge", charge("ORD-P", "balance"), 201, "")
	if a := charge("ORD-P", "deposit"); !a.replayed() {
		t.Errorf("repeated deposit not replayed: %s", a)
	}
	if got := e.charges("ORD-P"); got != 2 {
		t.Errorf("charges = %d, want 2 (one per kind)", got)
	}
	if got := e.state("by-path", "", "ORD-P|deposit"); got != store.StateCompleted {
		t.Errorf("state of ORD-P|deposit = %q, want completed", got)
	}
}

func TestScopeIsolation(t *testing.T) {
	e := newEnv(t, `
  - name: payments
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
    scope: {header: X-Api-Key}
`)
	alice := e.do("POST", "/orders/A-1/charges", `{"amount": 5}`, "Idempotency-Key", "same", "X-Api-Key", "alice")
	bob := e.do("POST", "/orders/B-1/charges", `{"amount": 7}`, "Idempotency-Key", "same", "X-Api-Key", "bob")
	wantStatus(t, "alice", alice, 201, "")
	wantStatus(t, "bob", bob, 201, "")
	if bob.replayed() || strings.Contains(string(bob.body), "A-1") {
		t.Fatalf("bob received alice's stored answer: %s", bob.body)
	}
	again := e.do("POST", "/orders/A-1/charges", `{"amount": 5}`, "Idempotency-Key", "same", "X-Api-Key", "alice")
	if !again.replayed() || string(again.body) != string(alice.body) {
		t.Errorf("alice's retry = %s, want her own answer replayed", again)
	}
	if e.state("payments", "alice", "same") != store.StateCompleted || e.state("payments", "", "same") != "" {
		t.Errorf("the scope is not part of the store key")
	}
}

func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	e := &env{t: t}
	e.start("http://"+addr, chargesByOrder)
	a := e.charge(`"ORD-D"`, 1)
	wantStatus(t, "upstream down", a, http.StatusBadGateway, "upstream-unreachable")
	if got := e.state("charges", "", "ORD-D"); got != "" {
		t.Errorf("state = %q, want no record: a request that was never sent releases its key", got)
	}
	if got := e.outcomes("charges", proxy.OutcomeReleased); got != 1 {
		t.Errorf("released outcomes = %d, want 1", got)
	}
}

func TestStoreUnavailable(t *testing.T) {
	tests := []struct {
		name, onStoreError string
		status             int
		problem            string
		charges            int
	}{
		{"fail closed", "reject", 503, "store-unavailable", 0},
		{"fail open", "forward", 201, "", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    on_store_error: %s
`, tt.onStoreError))
			e.store.Close()
			wantStatus(t, "store closed", e.charge(`"ORD-S"`, 1), tt.status, tt.problem)
			if got := e.charges("ORD-S"); got != tt.charges {
				t.Errorf("charges = %d, want %d", got, tt.charges)
			}
			if got := e.outcomes("charges", proxy.OutcomeStoreError); got != 1 {
				t.Errorf("store_error outcomes = %d, want 1", got)
			}
			if got := counterValue(t, e.reg, "idemproxy_store_errors_total", map[string]string{"store": "badger", "operation": "reserve"}); got != 1 {
				t.Errorf("store errors = %v, want 1", got)
			}
		})
	}
}

// TestPassthrough: requests that match no route reach the upstream
// untouched and never touch the store.
func TestPassthrough(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	wantStatus(t, "charge", e.charge(`"ORD-X"`, 3), 201, "")
	before := storeOps(t, e)
	a := e.do("GET", "/orders/ORD-X/charges", "")
	wantStatus(t, "statement", a, 200, "")
	if !strings.Contains(string(a.body), `"charges":1`) {
		t.Errorf("statement = %s", a.body)
	}
	wantStatus(t, "unknown path", e.do("GET", "/nope", ""), 404, "")
	if got := storeOps(t, e); got != before {
		t.Errorf("store operations went from %d to %d: passthrough must not touch the store", before, got)
	}
	if got := e.outcomes("", proxy.OutcomePassthrough); got != 2 {
		t.Errorf("passthrough outcomes = %d, want 2", got)
	}
}

// storeOps counts the store operations observed so far.
func storeOps(t *testing.T, e *env) uint64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == "idemproxy_store_operation_duration_seconds" {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// TestReplayHeaders: a replay carries the allow-listed headers only.
func TestReplayHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/charges/1")
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Internal", "yes")
		w.WriteHeader(201)
		w.Write([]byte(`{"ok": true}`))
	}))
	defer up.Close()
	e := &env{t: t}
	e.start(up.URL, chargesByOrder)
	first := e.charge(`"ORD-H"`, 1)
	replay := e.charge(`"ORD-H"`, 1)
	if first.header.Get("Set-Cookie") == "" {
		t.Errorf("the first answer lost its Set-Cookie: the proxy must pass the real answer through")
	}
	if !replay.replayed() || replay.status != 201 || string(replay.body) != `{"ok": true}` {
		t.Fatalf("replay = %s", replay)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if replay.header.Get(h) != first.header.Get(h) {
			t.Errorf("replayed %s = %q, want %q", h, replay.header.Get(h), first.header.Get(h))
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Internal"} {
		if v := replay.header.Get(h); v != "" {
			t.Errorf("replay carries %s: %q", h, v)
		}
	}
}

// TestAnswerTooLargeToStore: the first client gets the whole answer; a
// duplicate gets 409, never a second charge.
func TestAnswerTooLargeToStore(t *testing.T) {
	e := newEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_stored_body_bytes: 16
`)
	first := e.charge(`"ORD-BIG"`, 1)
	wantStatus(t, "first", first, 201, "")
	if !strings.Contains(string(first.body), "ORD-BIG") {
		t.Errorf("first answer truncated: %s", first.body)
	}
	dup := e.charge(`"ORD-BIG"`, 1)
	wantStatus(t, "duplicate", dup, 409, "response-not-replayable")
	if got := dup.field("stored_status"); got != float64(201) {
		t.Errorf("stored_status = %v, want 201", got)
	}
	if got := e.charges("ORD-BIG"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestClientGivesUp: a client that disconnects while the upstream works
// does not cancel the charge; its retry gets the answer replayed.
func TestClientGivesUp(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	e.fault("delay", 1, "400ms")
	impatient := &http.Client{Timeout: 100 * time.Millisecond}
	if a := send(impatient, "POST", e.srv.URL+"/charges", `{"orderId": "ORD-G", "amount": 1}`); a.err == nil {
		t.Fatalf("the impatient client got an answer: %s", a)
	}
	wantStatus(t, "retry while in flight", e.charge(`"ORD-G"`, 1), 409, "request-in-flight")
	eventually(t, "the answer is committed", func() bool { return e.state("charges", "", "ORD-G") == store.StateCompleted })
	retry := e.charge(`"ORD-G"`, 1)
	if retry.status != 201 || !retry.replayed() {
		t.Errorf("retry = %s, want the committed 201 replayed", retry)
	}
	if got := e.charges("ORD-G"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestLeaseRunsOut: a reservation whose lease ran out is in doubt.
func TestLeaseRunsOut(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	ctx := context.Background()
	key := store.Key("charges", "", "ORD-O")
	if rec, err := e.store.Reserve(ctx, key, store.Reservation{Token: "orphan", Lease: 100 * time.Millisecond, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("reserve: %v %v", rec, err)
	}
	wantStatus(t, "while leased", e.charge(`"ORD-O"`, 1), 409, "request-in-flight")
	time.Sleep(150 * time.Millisecond)
	wantStatus(t, "lease ran out", e.charge(`"ORD-O"`, 1), 409, "outcome-in-doubt")
	if got := e.charges("ORD-O"); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// TestReload: a reload swaps routes atomically.
func TestReload(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	if !e.p.HasRoute("charges") {
		t.Fatal("route charges missing")
	}
	cfg := parseConfig(t, e.stub.URL, `
  - name: charges-v2
    match: POST /charges
    key: {header: Idempotency-Key}
`)
	if err := e.p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if e.p.HasRoute("charges") || !e.p.HasRoute("charges-v2") {
		t.Errorf("routes not swapped")
	}
	wantStatus(t, "old key source", e.charge(`"ORD-RL"`, 1), 400, "missing-key")
}

// TestAfterShutdown: once the upstream requests were aborted, a new
// request is not sent and leaves its key free; once the proxy waited for
// its requests, new ones do not touch the store.
func TestAfterShutdown(t *testing.T) {
	e := newEnv(t, chargesByOrder)
	e.p.Abort()
	wantStatus(t, "after abort", e.charge(`"ORD-SD"`, 1), 503, "shutting-down")
	if got := e.state("charges", "", "ORD-SD"); got != "" {
		t.Errorf("state = %q, want the key left free", got)
	}
	e.p.Wait()
	before := storeOps(t, e)
	wantStatus(t, "after wait", e.charge(`"ORD-SD"`, 1), 503, "shutting-down")
	if got := storeOps(t, e); got != before {
		t.Errorf("a request after Wait touched the store (%d -> %d operations)", before, got)
	}
	if got := e.totalCharges(); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// TestPathVariantsAreProtected: "/charges/", "//charges" and
// "/x/../charges" are protected by the POST /charges route (many upstreams
// treat them as one endpoint) and reach the upstream as sent.
func TestPathVariantsAreProtected(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(201)
	}))
	defer up.Close()
	e := &env{t: t}
	e.start(up.URL, chargesByOrder)
	body := `{"orderId": "ORD-V", "amount": 1}`
	wantStatus(t, "canonical path", e.do("POST", "/charges", body), 201, "")
	for _, p := range []string{"/charges/", "//charges", "/x/../charges"} {
		req, _ := http.NewRequest("POST", e.srv.URL+"/", strings.NewReader(body))
		req.URL.Path = p // sent as is, not cleaned by the client
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("POST %s = %d (replayed %q), want the stored answer replayed", p, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
		}
	}
	wantStatus(t, "first time through a variant", e.do("POST", "/charges/", `{"orderId": "ORD-W", "amount": 1}`), 201, "")
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/charges", "/charges/"}; fmt.Sprint(paths) != fmt.Sprint(want) {
		t.Errorf("upstream saw %v, want %v (one forward per order, the path as sent)", paths, want)
	}
}

// TestQueryIsPartOfTheRequest: the same key with another query string is
// another request (422), the same query in another order is not.
func TestQueryIsPartOfTheRequest(t *testing.T) {
	e := newEnv(t, `
  - name: refunds
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
`)
	wantStatus(t, "first", e.do("POST", "/orders/O-Q/charges?amount=100&currency=EUR", `{"amount": 1}`, "Idempotency-Key", "k"), 201, "")
	if a := e.do("POST", "/orders/O-Q/charges?currency=EUR&amount=100", `{"amount": 1}`, "Idempotency-Key", "k"); !a.replayed() {
		t.Errorf("same query, other order: %s, want a replay", a)
	}
	wantStatus(t, "other query", e.do("POST", "/orders/O-Q/charges?amount=900&currency=EUR", `{"amount": 1}`, "Idempotency-Key", "k"), 422, "fingerprint-mismatch")
	// Queries Go cannot parse are fingerprinted too.
	wantStatus(t, "unparsable", e.do("POST", "/orders/O-Q/charges?amount=100;", `{"amount": 1}`, "Idempotency-Key", "k2"), 201, "")
	wantStatus(t, "other unparsable", e.do("POST", "/orders/O-Q/charges?amount=900;", `{"amount": 1}`, "Idempotency-Key", "k2"), 422, "fingerprint-mismatch")
	wantStatus(t, "bad escape", e.do("POST", "/orders/O-Q/charges?amount=%zz9", `{"amount": 1}`, "Idempotency-Key", "k2"), 422, "fingerprint-mismatch")
}

// TestReplayNeverCarriesCredentials: even when validation is bypassed (a
// configuration built in code), a credential, a session or the client's
// scope header in replay_headers is neither stored nor replayed; and a
// record stored with one (before credentials were refused) replays
// without it.
func TestReplayNeverCarriesCredentials(t *testing.T) {
	secrets := map[string]string{
		"Authorization": "Bearer client-a", "X-Api-Key": "key-of-a", "Set-Cookie": "sid=a",
		"X-Tenant": "tenant-a", "X-Csrf-Token": "csrf-a", "Www-Authenticate": `Bearer realm="a"`,
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for k, v := range secrets {
			w.Header().Set(k, v)
		}
		w.WriteHeader(201)
		w.Write([]byte(`{"ok": true}`))
	}))
	defer up.Close()
	cfg := parseConfig(t, up.URL, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    scope: {header: X-Tenant}
    fingerprint: {disabled: true}
`)
	// Bypass validation, in any letter case.
	cfg.Routes[0].ReplayHeaders = []string{"Content-Type", "Authorization", "x-api-key", "Set-Cookie", "X-Tenant",
		"X-Csrf-Token", "Www-Authenticate"}
	e := &env{t: t}
	e.startConfig(cfg)

	first := e.charge(`"ORD-CRED"`, 1, "X-Tenant", "tenant-a")
	replay := e.charge(`"ORD-CRED"`, 1, "X-Tenant", "tenant-a")
	if first.status != 201 || first.header.Get("Authorization") == "" {
		t.Fatalf("first = %s: the first client must get the upstream's real answer", first)
	}
	if !replay.replayed() || replay.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay = %s, want a replay with its Content-Type", replay)
	}
	for k := range secrets {
		if v := replay.header.Get(k); v != "" {
			t.Errorf("replay carries %s: %q", k, v)
		}
	}
	rec, err := e.store.Get(context.Background(), store.Key("charges", "tenant-a", "ORD-CRED"))
	if err != nil || rec == nil || rec.Response == nil {
		t.Fatalf("stored record = %+v, %v", rec, err)
	}
	for k := range secrets {
		if v := rec.Response.Header.Get(k); v != "" {
			t.Errorf("the store holds %s: %q", k, v)
		}
	}

	// A record stored with credentials, as an earlier release allowed.
	key := store.Key("charges", "tenant-a", "ORD-OLD")
	ctx := context.Background()
	if _, err := e.store.Reserve(ctx, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	old := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`), BodyStored: true}
	for k, v := range secrets {
		old.Header.Set(k, v)
	}
	if err := e.store.Commit(ctx, key, "t", old, time.Hour); err != nil {
		t.Fatal(err)
	}
	replay = e.charge(`"ORD-OLD"`, 1, "X-Tenant", "tenant-a")
	if !replay.replayed() || replay.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay of the old record = %s", replay)
	}
	for k := range secrets {
		if v := replay.header.Get(k); v != "" {
			t.Errorf("replay of the old record carries %s: %q", k, v)
		}
	}
}
