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

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

const chargesByOrder = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
`

// storm sends n identical charges at once and returns their answers.
func storm(e *proxytest.Env, n int, order string, hdr ...string) []proxytest.Answer {
	var wg sync.WaitGroup
	answers := make([]proxytest.Answer, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = proxytest.Send(e.Server.Client(), "POST", e.Server.URL+"/charges",
				fmt.Sprintf(`{"orderId": %q, "amount": 10}`, order), hdr...)
		}()
	}
	close(start)
	wg.Wait()
	return answers
}

func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	t.Parallel()
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
			e := proxytest.New(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    concurrent: %s
    wait_timeout: 5s
`, tt.concurrent))
			const n = 50
			// The stub holds the first answer long enough for every copy to arrive.
			answers := storm(e, n, "ORD-STORM", "X-Stub-Fault", "delay", "X-Stub-Delay", "300ms")
			var created, replayed, inFlight int
			for _, a := range answers {
				switch {
				case a.Err != nil:
					t.Fatalf("request failed: %v", a.Err)
				case a.Status == 201 && a.Replayed():
					replayed++
				case a.Status == 201:
					created++
				case a.Status == 409 && a.ProblemType() == "request-in-flight":
					inFlight++
					if a.Header.Get("Retry-After") == "" {
						t.Errorf("409 in flight without Retry-After")
					}
				default:
					t.Errorf("unexpected answer %s", a)
				}
			}
			if created != 1 {
				t.Errorf("first answers = %d, want exactly 1", created)
			}
			if got := e.Charges("ORD-STORM"); got != 1 {
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
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	const orders, copies = 40, 5
	var wg sync.WaitGroup
	for i := range orders * copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proxytest.Send(e.Server.Client(), "POST", e.Server.URL+"/charges", fmt.Sprintf(`{"orderId": "K-%d", "amount": 1}`, i%orders))
		}()
	}
	wg.Wait()
	if got := e.TotalCharges(); got != orders {
		t.Errorf("charges = %d, want %d (one per order)", got, orders)
	}
}

func TestFingerprintAndKeyCanonicalisation(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: order.id}
    fingerprint: {ignore: [sentAt]}
`)
	first := e.Do("POST", "/charges", `{"order": {"id": 1001}, "orderId": "1001", "amount": 10, "sentAt": "10:00"}`)
	proxytest.WantStatus(t, "first", first, 201, "")
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
		a := e.Do("POST", "/charges", tt.body)
		proxytest.WantStatus(t, tt.name, a, tt.status, tt.problem)
		if a.Replayed() != tt.replayed {
			t.Errorf("%s: replayed = %v, want %v", tt.name, a.Replayed(), tt.replayed)
		}
	}
	if got := e.Charges("1001"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestNumberAndStringAreOneKey: 1001 and "1001" are the same key; with the
// fingerprint off (the body differs), the second is a replay.
func TestNumberAndStringAreOneKey(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    fingerprint: {disabled: true}
`)
	proxytest.WantStatus(t, "number", e.Charge(`1001`, 10), 201, "")
	second := e.Charge(`"1001"`, 10)
	proxytest.WantStatus(t, "string", second, 201, "")
	if !second.Replayed() {
		t.Errorf("the string key was not a replay of the number key")
	}
	if got := e.Charges("1001"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
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
		a := e.Do("POST", tt.path, tt.body, tt.hdr...)
		proxytest.WantStatus(t, tt.name, a, tt.status, tt.problem)
		if got := a.Field("status"); got != float64(tt.status) {
			t.Errorf("%s: problem status member = %v, want %d", tt.name, got, tt.status)
		}
	}
	if got := e.TotalCharges(); got != 0 {
		t.Errorf("charges = %d, want 0: bad input must never reach the upstream", got)
	}
	if got := e.Outcomes("charges", proxy.OutcomeBadRequest); got != 11 {
		t.Errorf("bad_request outcomes = %d, want 11", got)
	}
}

// TestChunkedBodyTooLarge: a body without Content-Length is cut at the limit.
func TestChunkedBodyTooLarge(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_body_bytes: 64
`)
	pr := strings.NewReader(`{"orderId": "A", "amount": 1, "pad": "` + strings.Repeat("x", 200) + `"}`)
	req, _ := http.NewRequest("POST", e.Server.URL+"/charges", struct{ *strings.Reader }{pr}) // hides the length
	resp, err := e.Server.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", resp.StatusCode)
	}
}

func TestMissingKeyForward(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
    on_missing_key: forward
`)
	for range 2 {
		proxytest.WantStatus(t, "no key", e.Charge(`"ORD-U"`, 1), 201, "")
	}
	if got := e.Charges("ORD-U"); got != 2 {
		t.Errorf("charges = %d, want 2 (forwarded unprotected)", got)
	}
	if got := e.Outcomes("charges", proxy.OutcomeUnprotected); got != 2 {
		t.Errorf("unprotected outcomes = %d, want 2", got)
	}
	proxytest.WantStatus(t, "with key", e.Charge(`"ORD-U"`, 1, "Idempotency-Key", "k1"), 201, "")
	if a := e.Charge(`"ORD-U"`, 1, "Idempotency-Key", "k1"); !a.Replayed() {
		t.Errorf("a keyed request on a forward route was not protected: %s", a)
	}
}

func TestPathAndCompositeKeys(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: by-path
    match: POST /orders/{orderId}/charges
    key:
      parts: [{path: orderId}, {json: kind}]
`)
	charge := func(order, kind string) proxytest.Answer {
		return e.Do("POST", "/orders/"+order+"/charges", fmt.Sprintf(`{"amount": 5, "kind": %q}`, kind))
	}
	proxytest.WantStatus(t, "first charge", charge("ORD-P", "deposit"), 201, "")
	proxytest.WantStatus(t, "second kind of charge", charge("ORD-P", "balance"), 201, "")
	if a := charge("ORD-P", "deposit"); !a.Replayed() {
		t.Errorf("repeated deposit not replayed: %s", a)
	}
	if got := e.Charges("ORD-P"); got != 2 {
		t.Errorf("charges = %d, want 2 (one per kind)", got)
	}
	if got := e.State("by-path", "", "ORD-P|deposit"); got != store.StateCompleted {
		t.Errorf("state of ORD-P|deposit = %q, want completed", got)
	}
}

func TestScopeIsolation(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: payments
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
    scope: {header: X-Api-Key}
`)
	alice := e.Do("POST", "/orders/A-1/charges", `{"amount": 5}`, "Idempotency-Key", "same", "X-Api-Key", "alice")
	bob := e.Do("POST", "/orders/B-1/charges", `{"amount": 7}`, "Idempotency-Key", "same", "X-Api-Key", "bob")
	proxytest.WantStatus(t, "alice", alice, 201, "")
	proxytest.WantStatus(t, "bob", bob, 201, "")
	if bob.Replayed() || strings.Contains(string(bob.Body), "A-1") {
		t.Fatalf("bob received alice's stored answer: %s", bob.Body)
	}
	again := e.Do("POST", "/orders/A-1/charges", `{"amount": 5}`, "Idempotency-Key", "same", "X-Api-Key", "alice")
	if !again.Replayed() || string(again.Body) != string(alice.Body) {
		t.Errorf("alice's retry = %s, want her own answer replayed", again)
	}
	if e.State("payments", "alice", "same") != store.StateCompleted || e.State("payments", "", "same") != "" {
		t.Errorf("the scope is not part of the store key")
	}
}

func TestUpstreamDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	e := &proxytest.Env{T: t}
	e.Start("http://"+addr, chargesByOrder)
	a := e.Charge(`"ORD-D"`, 1)
	proxytest.WantStatus(t, "upstream down", a, http.StatusBadGateway, "upstream-unreachable")
	if got := e.State("charges", "", "ORD-D"); got != "" {
		t.Errorf("state = %q, want no record: a request that was never sent releases its key", got)
	}
	if got := e.Outcomes("charges", proxy.OutcomeReleased); got != 1 {
		t.Errorf("released outcomes = %d, want 1", got)
	}
}

func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
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
			e := proxytest.New(t, fmt.Sprintf(`
  - name: charges
    match: POST /charges
    key: {json: orderId}
    on_store_error: %s
`, tt.onStoreError))
			e.Store.Close()
			proxytest.WantStatus(t, "store closed", e.Charge(`"ORD-S"`, 1), tt.status, tt.problem)
			if got := e.Charges("ORD-S"); got != tt.charges {
				t.Errorf("charges = %d, want %d", got, tt.charges)
			}
			if got := e.Outcomes("charges", proxy.OutcomeStoreError); got != 1 {
				t.Errorf("store_error outcomes = %d, want 1", got)
			}
			if got := proxytest.CounterValue(t, e.Registry, "idemproxy_store_errors_total", map[string]string{"store": "badger", "operation": "reserve"}); got != 1 {
				t.Errorf("store errors = %v, want 1", got)
			}
		})
	}
}

// TestPassthrough: requests that match no route reach the upstream
// untouched and never touch the store.
func TestPassthrough(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-X"`, 3), 201, "")
	before := storeOps(t, e)
	a := e.Do("GET", "/orders/ORD-X/charges", "")
	proxytest.WantStatus(t, "statement", a, 200, "")
	if !strings.Contains(string(a.Body), `"charges":1`) {
		t.Errorf("statement = %s", a.Body)
	}
	proxytest.WantStatus(t, "unknown path", e.Do("GET", "/nope", ""), 404, "")
	if got := storeOps(t, e); got != before {
		t.Errorf("store operations went from %d to %d: passthrough must not touch the store", before, got)
	}
	if got := e.Outcomes("", proxy.OutcomePassthrough); got != 2 {
		t.Errorf("passthrough outcomes = %d, want 2", got)
	}
}

// storeOps counts the store operations observed so far.
func storeOps(t *testing.T, e *proxytest.Env) uint64 {
	mfs, err := e.Registry.Gather()
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
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/charges/1")
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Internal", "yes")
		w.WriteHeader(201)
		w.Write([]byte(`{"ok": true}`))
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByOrder)
	first := e.Charge(`"ORD-H"`, 1)
	replay := e.Charge(`"ORD-H"`, 1)
	if first.Header.Get("Set-Cookie") == "" {
		t.Errorf("the first answer lost its Set-Cookie: the proxy must pass the real answer through")
	}
	if !replay.Replayed() || replay.Status != 201 || string(replay.Body) != `{"ok": true}` {
		t.Fatalf("replay = %s", replay)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if replay.Header.Get(h) != first.Header.Get(h) {
			t.Errorf("replayed %s = %q, want %q", h, replay.Header.Get(h), first.Header.Get(h))
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Internal"} {
		if v := replay.Header.Get(h); v != "" {
			t.Errorf("replay carries %s: %q", h, v)
		}
	}
}

// TestAnswerTooLargeToStore: the first client gets the whole answer; a
// duplicate gets 409, never a second charge.
func TestAnswerTooLargeToStore(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_stored_body_bytes: 16
`)
	first := e.Charge(`"ORD-BIG"`, 1)
	proxytest.WantStatus(t, "first", first, 201, "")
	if !strings.Contains(string(first.Body), "ORD-BIG") {
		t.Errorf("first answer truncated: %s", first.Body)
	}
	dup := e.Charge(`"ORD-BIG"`, 1)
	proxytest.WantStatus(t, "duplicate", dup, 409, "response-not-replayable")
	if got := dup.Field("stored_status"); got != float64(201) {
		t.Errorf("stored_status = %v, want 201", got)
	}
	if got := e.Charges("ORD-BIG"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestClientGivesUp: a client that disconnects while the upstream works
// does not cancel the charge; its retry gets the answer replayed.
func TestClientGivesUp(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	// The upstream answers after 3 s, long enough for the retry to find
	// the key in flight on a busy machine; the retry is sent once the
	// reservation exists (the client's timeout can pass before the proxy
	// has even reserved the key: CI under .ci/hog, where the retry was
	// the first to reserve and was forwarded).
	e.Fault("delay", 1, "3s")
	impatient := &http.Client{Timeout: 100 * time.Millisecond}
	if a := proxytest.Send(impatient, "POST", e.Server.URL+"/charges", `{"orderId": "ORD-G", "amount": 1}`); a.Err == nil {
		t.Fatalf("the impatient client got an answer: %s", a)
	}
	proxytest.Eventually(t, "the key reserved", func() bool { return e.State("charges", "", "ORD-G") == store.StateInFlight })
	proxytest.WantStatus(t, "retry while in flight", e.Charge(`"ORD-G"`, 1), 409, "request-in-flight")
	proxytest.Eventually(t, "the answer is committed", func() bool { return e.State("charges", "", "ORD-G") == store.StateCompleted })
	retry := e.Charge(`"ORD-G"`, 1)
	if retry.Status != 201 || !retry.Replayed() {
		t.Errorf("retry = %s, want the committed 201 replayed", retry)
	}
	if got := e.Charges("ORD-G"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestLeaseRunsOut: a reservation whose lease ran out is in doubt.
func TestLeaseRunsOut(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	ctx := context.Background()
	key := store.Key("charges", "", "ORD-O")
	if rec, err := e.Store.Reserve(ctx, key, store.Reservation{Token: "orphan", Lease: 100 * time.Millisecond, TTL: time.Hour}); err != nil || rec != nil {
		t.Fatalf("reserve: %v %v", rec, err)
	}
	proxytest.WantStatus(t, "while leased", e.Charge(`"ORD-O"`, 1), 409, "request-in-flight")
	time.Sleep(150 * time.Millisecond)
	proxytest.WantStatus(t, "lease ran out", e.Charge(`"ORD-O"`, 1), 409, "outcome-in-doubt")
	if got := e.Charges("ORD-O"); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// TestReload: a reload swaps routes atomically.
func TestReload(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	if !e.Proxy.HasRoute("charges") {
		t.Fatal("route charges missing")
	}
	cfg := proxytest.ParseConfig(t, e.Stub.URL, `
  - name: charges-v2
    match: POST /charges
    key: {header: Idempotency-Key}
`)
	if err := e.Proxy.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if e.Proxy.HasRoute("charges") || !e.Proxy.HasRoute("charges-v2") {
		t.Errorf("routes not swapped")
	}
	proxytest.WantStatus(t, "old key source", e.Charge(`"ORD-RL"`, 1), 400, "missing-key")
}

// TestAfterShutdown: once the upstream requests were aborted, a new
// request is not sent and leaves its key free; once the proxy waited for
// its requests, new ones do not touch the store.
func TestAfterShutdown(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	e.Proxy.Abort()
	proxytest.WantStatus(t, "after abort", e.Charge(`"ORD-SD"`, 1), 503, "shutting-down")
	if got := e.State("charges", "", "ORD-SD"); got != "" {
		t.Errorf("state = %q, want the key left free", got)
	}
	e.Proxy.Wait()
	before := storeOps(t, e)
	proxytest.WantStatus(t, "after wait", e.Charge(`"ORD-SD"`, 1), 503, "shutting-down")
	if got := storeOps(t, e); got != before {
		t.Errorf("a request after Wait touched the store (%d -> %d operations)", before, got)
	}
	if got := e.TotalCharges(); got != 0 {
		t.Errorf("charges = %d, want 0", got)
	}
}

// TestPathVariantsAreProtected: "/charges/", "//charges" and
// "/x/../charges" are protected by the POST /charges route (many upstreams
// treat them as one endpoint) and reach the upstream as sent.
func TestPathVariantsAreProtected(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(201)
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByOrder)
	body := `{"orderId": "ORD-V", "amount": 1}`
	proxytest.WantStatus(t, "canonical path", e.Do("POST", "/charges", body), 201, "")
	for _, p := range []string{"/charges/", "//charges", "/x/../charges"} {
		req, _ := http.NewRequest("POST", e.Server.URL+"/", strings.NewReader(body))
		req.URL.Path = p // sent as is, not cleaned by the client
		resp, err := e.Server.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("POST %s = %d (replayed %q), want the stored answer replayed", p, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
		}
	}
	proxytest.WantStatus(t, "first time through a variant", e.Do("POST", "/charges/", `{"orderId": "ORD-W", "amount": 1}`), 201, "")
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/charges", "/charges/"}; fmt.Sprint(paths) != fmt.Sprint(want) {
		t.Errorf("upstream saw %v, want %v (one forward per order, the path as sent)", paths, want)
	}
}

// TestQueryIsPartOfTheRequest: the same key with another query string is
// another request (422), the same query in another order is not.
func TestQueryIsPartOfTheRequest(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: refunds
    match: POST /orders/{orderId}/charges
    key: {header: Idempotency-Key}
`)
	proxytest.WantStatus(t, "first", e.Do("POST", "/orders/O-Q/charges?amount=100&currency=EUR", `{"amount": 1}`, "Idempotency-Key", "k"), 201, "")
	if a := e.Do("POST", "/orders/O-Q/charges?currency=EUR&amount=100", `{"amount": 1}`, "Idempotency-Key", "k"); !a.Replayed() {
		t.Errorf("same query, other order: %s, want a replay", a)
	}
	proxytest.WantStatus(t, "other query", e.Do("POST", "/orders/O-Q/charges?amount=900&currency=EUR", `{"amount": 1}`, "Idempotency-Key", "k"), 422, "fingerprint-mismatch")
	// Queries Go cannot parse are fingerprinted too.
	proxytest.WantStatus(t, "unparsable", e.Do("POST", "/orders/O-Q/charges?amount=100;", `{"amount": 1}`, "Idempotency-Key", "k2"), 201, "")
	proxytest.WantStatus(t, "other unparsable", e.Do("POST", "/orders/O-Q/charges?amount=900;", `{"amount": 1}`, "Idempotency-Key", "k2"), 422, "fingerprint-mismatch")
	proxytest.WantStatus(t, "bad escape", e.Do("POST", "/orders/O-Q/charges?amount=%zz9", `{"amount": 1}`, "Idempotency-Key", "k2"), 422, "fingerprint-mismatch")
}

// TestReplayNeverCarriesCredentials: even when validation is bypassed (a
// configuration built in code), a credential, a session or the client's
// scope header in replay_headers is neither stored nor replayed; and a
// record stored with one (before credentials were refused) replays
// without it.
func TestReplayNeverCarriesCredentials(t *testing.T) {
	t.Parallel()
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
	cfg := proxytest.ParseConfig(t, up.URL, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    scope: {header: X-Tenant}
    fingerprint: {disabled: true}
`)
	// Bypass validation, in any letter case.
	cfg.Routes[0].ReplayHeaders = []string{"Content-Type", "Authorization", "x-api-key", "Set-Cookie", "X-Tenant",
		"X-Csrf-Token", "Www-Authenticate"}
	e := &proxytest.Env{T: t}
	e.StartConfig(cfg)

	first := e.Charge(`"ORD-CRED"`, 1, "X-Tenant", "tenant-a")
	replay := e.Charge(`"ORD-CRED"`, 1, "X-Tenant", "tenant-a")
	if first.Status != 201 || first.Header.Get("Authorization") == "" {
		t.Fatalf("first = %s: the first client must get the upstream's real answer", first)
	}
	if !replay.Replayed() || replay.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay = %s, want a replay with its Content-Type", replay)
	}
	for k := range secrets {
		if v := replay.Header.Get(k); v != "" {
			t.Errorf("replay carries %s: %q", k, v)
		}
	}
	rec, err := e.Store.Get(context.Background(), store.Key("charges", "tenant-a", "ORD-CRED"))
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
	if _, err := e.Store.Reserve(ctx, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	old := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`), BodyStored: true}
	for k, v := range secrets {
		old.Header.Set(k, v)
	}
	if err := e.Store.Commit(ctx, key, "t", old, time.Hour); err != nil {
		t.Fatal(err)
	}
	replay = e.Charge(`"ORD-OLD"`, 1, "X-Tenant", "tenant-a")
	if !replay.Replayed() || replay.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay of the old record = %s", replay)
	}
	for k := range secrets {
		if v := replay.Header.Get(k); v != "" {
			t.Errorf("replay of the old record carries %s: %q", k, v)
		}
	}
}
