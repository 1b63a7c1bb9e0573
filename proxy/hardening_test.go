package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// hostPost sends a charge with the given Host header.
func hostPost(e *proxytest.Env, host, body string) proxytest.Answer {
	e.T.Helper()
	req, err := http.NewRequest("POST", e.Server.URL+"/charges", strings.NewReader(body))
	if err != nil {
		e.T.Fatal(err)
	}
	req.Host = host
	resp, err := e.Server.Client().Do(req)
	if err != nil {
		return proxytest.Answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b, Err: err}
}

// TestHostPatternsMatchAsDNSNames: a host-bound route protects its host
// however the client spells it; before, "API.EXAMPLE.COM" and
// "api.example.com." passed through unprotected and were charged each time.
func TestHostPatternsMatchAsDNSNames(t *testing.T) {
	t.Parallel()
	for _, pattern := range []string{"POST api.example.com/charges", "POST API.Example.com./charges"} {
		e := proxytest.New(t, fmt.Sprintf(`
  - name: charges
    match: %s
    key: {json: orderId}
`, pattern))
		for i, host := range []string{"api.example.com", "API.EXAMPLE.COM", "api.example.com.", "api.example.com:8080", "Api.Example.Com.:443"} {
			order := fmt.Sprintf("ORD-H%d", i)
			for range 3 {
				a := hostPost(e, host, fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order))
				if a.Status != 201 {
					t.Fatalf("%s, Host %s: %s", pattern, host, a)
				}
			}
			if got := e.Charges(order); got != 1 {
				t.Errorf("%s, Host %q: charged %d times, want 1", pattern, host, got)
			}
		}
		// Another host is not this route's.
		hostPost(e, "other.example.com", `{"orderId": "ORD-OTHER", "amount": 1}`)
		hostPost(e, "other.example.com", `{"orderId": "ORD-OTHER", "amount": 1}`)
		if got := e.Charges("ORD-OTHER"); got != 2 {
			t.Errorf("%s: another host charged %d times, want 2 (passthrough)", pattern, got)
		}
	}
}

// TestRepeatedScopeHeader: two scope values are a 400, never scoped by
// the first (eve's request in alice's key space, or the reverse).
func TestRepeatedScopeHeader(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    scope: {header: X-Api-Key}
`)
	a := e.Charge(`"ORD-S"`, 1, "X-Api-Key", "eve", "X-Api-Key", "alice")
	proxytest.WantStatus(t, "repeated scope", a, 400, "invalid-scope")
	if got := e.Charges("ORD-S"); got != 0 {
		t.Errorf("charged %d times, want 0", got)
	}
	proxytest.WantStatus(t, "one scope", e.Charge(`"ORD-S"`, 1, "X-Api-Key", "alice"), 201, "")
}

// TestValidationErrorIsReleased: an upstream 400 ("amount must be greater
// than zero") keeps nothing, so the corrected request under the same key
// is charged, not a 422 for the key's whole TTL.
func TestValidationErrorIsReleased(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	proxytest.WantStatus(t, "amount 0", e.Charge(`"ORD-V"`, 0), 400, "")
	if st := e.State("charges", "", "ORD-V"); st != "" {
		t.Errorf("after the upstream's 400 the key is %q, want released", st)
	}
	proxytest.WantStatus(t, "corrected", e.Charge(`"ORD-V"`, 10), 201, "")
	proxytest.WantStatus(t, "retry", e.Charge(`"ORD-V"`, 10), 201, "")
	if got := e.Charges("ORD-V"); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	if got := e.Outcomes("charges", proxy.OutcomeReleased); got != 1 {
		t.Errorf("released = %d, want 1", got)
	}
}

// TestKeyNameInAnotherCase: with on_missing_key: forward, {"OrderId": "X"}
// is read as the key (a Go upstream decodes it as orderId), not forwarded
// unprotected on every retry.
func TestKeyNameInAnotherCase(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    on_missing_key: forward
`)
	for range 3 {
		e.Do("POST", "/charges", `{"OrderId": "ORD-C", "amount": 5}`)
	}
	if got := e.Charges("ORD-C"); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	a := e.Do("POST", "/charges", `{"orderId": "ORD-D", "OrderId": "ORD-E", "amount": 5}`)
	proxytest.WantStatus(t, "two cases", a, 400, "invalid-json")
	if got := e.TotalCharges(); got != 1 {
		t.Errorf("total charges %d, want 1", got)
	}
}

// syncBuffer is a bytes.Buffer safe for the proxy's concurrent log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRewrittenPathAnswerIsNotKept: a request matched in cleaned form that
// the upstream did not serve for its path (the stub's mux answers 404 for
// /charges/ and redirects //charges) must not settle the key: the client's
// correct POST /charges is then charged, not answered with that 404 or
// redirect for 24 h. The access log shows the path as sent.
func TestRewrittenPathAnswerIsNotKept(t *testing.T) {
	t.Parallel()
	for i, raw := range []string{"/charges/", "//charges", "/./charges", "/charges%2F"} {
		t.Run(raw, func(t *testing.T) {
			var log syncBuffer
			e := &proxytest.Env{T: t, Log: &log}
			e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
			t.Cleanup(e.Stub.Close)
			// release_statuses without 404: the rule holds whatever the set.
			e.Start(e.Stub.URL, chargesByOrder+"    release_statuses: [429]\n")
			order := fmt.Sprintf("ORD-P%d", i)
			body := fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order)
			resp := rawExchange(t, e.Server.Listener.Addr().String(), fmt.Sprintf(
				"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
				raw, len(body), body))
			if resp.StatusCode != 404 && resp.StatusCode/100 != 3 {
				t.Fatalf("the stub answered %s for %s; the test needs a 404 or a redirect", resp.Status, raw)
			}
			if st := e.State("charges", "", order); st != "" {
				t.Errorf("after %d for %s the key is %q, want released", resp.StatusCode, raw, st)
			}
			a := e.Do("POST", "/charges", body)
			if a.Status != 201 || a.Replayed() {
				t.Errorf("the correct request after %s: got %s (replayed %v), want a fresh 201", raw, a, a.Replayed())
			}
			if got := e.Charges(order); got != 1 {
				t.Errorf("charged %d times, want 1", got)
			}
			if !strings.Contains(log.String(), fmt.Sprintf(`"path":%q`, raw)) {
				t.Errorf("access log does not show the path as sent (%s):\n%s", raw, log.String())
			}
		})
	}
}

// TestRedirectAfterProcessingIsKept: an upstream that routes /charges/ as
// /charges (Express, Rails) and answers a charge it made with a redirect to
// the new charge (303 See Other, or Rails' and Express' default 302), or
// with a 303 back to the list at /charges, has served the request: the key
// must be committed. Before, every redirect to a request matched in cleaned
// form released the key, and each retry was charged again. A 301, 307 or
// 308 to the request's own path in canonical form still releases it
// (TestRewrittenPathAnswerIsNotKept).
func TestRedirectAfterProcessingIsKept(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	charged := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || strings.TrimSuffix(r.URL.Path, "/") != "/charges" {
			http.NotFound(w, r)
			return
		}
		var c struct{ OrderID string }
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		charged[c.OrderID]++
		n := charged[c.OrderID]
		mu.Unlock()
		switch {
		case strings.HasSuffix(c.OrderID, "-302"):
			http.Redirect(w, r, fmt.Sprintf("/charges/%s-%d", c.OrderID, n), http.StatusFound)
		case strings.HasSuffix(c.OrderID, "-index"): // back to the list of charges
			http.Redirect(w, r, "/charges", http.StatusSeeOther)
		default:
			http.Redirect(w, r, fmt.Sprintf("/charges/%s-%d", c.OrderID, n), http.StatusSeeOther)
		}
	}))
	t.Cleanup(up.Close)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByOrder)
	for _, order := range []string{"ORD-R303", "ORD-R-302", "ORD-R-index"} {
		body := fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order)
		for i := range 2 {
			resp := rawExchange(t, e.Server.Listener.Addr().String(), fmt.Sprintf(
				"POST /charges/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
				len(body), body))
			want := "/charges/" + order + "-1"
			if strings.HasSuffix(order, "-index") {
				want = "/charges"
			}
			if resp.StatusCode/100 != 3 || resp.Header.Get("Location") != want {
				t.Errorf("%s, request %d: got %s to %q, want a redirect to %s", order, i+1, resp.Status, resp.Header.Get("Location"), want)
			}
			if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
				t.Errorf("%s, request %d: replayed %v", order, i+1, replayed)
			}
		}
		mu.Lock()
		got := charged[order]
		mu.Unlock()
		if got != 1 {
			t.Errorf("%s: charged %d times, want 1", order, got)
		}
		if st := e.State("charges", "", order); st != store.StateCompleted {
			t.Errorf("%s: the key is %q, want completed", order, st)
		}
	}
}

// rawExchange writes req byte for byte to addr and returns the final
// answer.
func rawExchange(t *testing.T, addr, req string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestExpectContinueOnce: the client gets exactly one 100 Continue, the
// proxy's; before, the upstream's was passed on as a second one.
func TestExpectContinueOnce(t *testing.T) {
	t.Parallel()
	e := proxytest.New(t, chargesByOrder)
	conn, err := net.Dial("tcp", e.Server.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"orderId": "ORD-X", "amount": 1}`
	fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", len(body))
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("first line %q (%v), want a 100 Continue", line, err)
	}
	io.WriteString(conn, body)
	rest, _ := io.ReadAll(br)
	all := line + string(rest)
	if n := strings.Count(all, "HTTP/1.1 100"); n != 1 {
		t.Errorf("got %d 100 Continue answers, want 1:\n%s", n, all)
	}
	if !strings.Contains(all, "HTTP/1.1 201") {
		t.Errorf("no 201:\n%s", all)
	}
}

// holdGate is an upstream in front of the stub that holds every request sent
// with X-Hold until opened, and counts the requests it holds.
type holdGate struct {
	open    chan struct{}
	arrived chan struct{}
}

func newHoldGate(t *testing.T) (*holdGate, *httptest.Server) {
	g := &holdGate{open: make(chan struct{}), arrived: make(chan struct{}, 100)}
	st := stub.New(slog.New(slog.DiscardHandler))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			g.arrived <- struct{}{}
			<-g.open
		}
		st.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
	})
	return g, up
}

// bigCharge is a charge body of about size bytes.
func bigCharge(order string, size int) string {
	return fmt.Sprintf(`{"orderId": %q, "amount": 1, "note": %q}`, order, strings.Repeat("x", size))
}

// TestBufferedBytesBudget: while two 600 KiB bodies wait for a slow
// upstream, a third does not fit server.max_buffered_bytes (1.5 MiB): it is
// a 503 with Retry-After, nothing stored or forwarded, and goes through once
// the others are done. Bodies of unknown length (chunked) count too.
func TestBufferedBytesBudget(t *testing.T) {
	t.Parallel()
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			g, up := newHoldGate(t)
			e := &proxytest.Env{T: t, Stub: up}
			cfg := proxytest.ParseConfig(t, up.URL, chargesByOrder)
			cfg.Server.MaxBufferedBytes = 1536 << 10
			e.StartConfig(cfg)
			post := func(order string, hold bool) proxytest.Answer {
				body := bigCharge(order, 600<<10)
				var rd io.Reader = strings.NewReader(body)
				if chunked {
					rd = io.MultiReader(rd) // no length: sent chunked
				}
				req, _ := http.NewRequest("POST", e.Server.URL+"/charges", rd)
				if hold {
					req.Header.Set("X-Hold", "1")
				}
				resp, err := e.Server.Client().Do(req)
				if err != nil {
					return proxytest.Answer{Err: err}
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
			}
			held := make(chan proxytest.Answer, 2)
			for _, o := range []string{"ORD-B1", "ORD-B2"} {
				go func() { held <- post(o, true) }()
			}
			<-g.arrived
			<-g.arrived
			a := post("ORD-B3", false)
			proxytest.WantStatus(t, "third body", a, 503, "overloaded")
			if a.Header.Get("Retry-After") == "" {
				t.Errorf("503 overloaded without Retry-After")
			}
			if st := e.State("charges", "", "ORD-B3"); st != "" {
				t.Errorf("refused request left its key %q", st)
			}
			close(g.open)
			for range 2 {
				if a := <-held; a.Status != 201 {
					t.Errorf("held request: %s", a)
				}
			}
			proxytest.WantStatus(t, "third body, retried", post("ORD-B3", false), 201, "")
			if got := e.TotalCharges(); got != 3 {
				t.Errorf("charges = %d, want 3", got)
			}
			if got := e.Outcomes("charges", proxy.OutcomeOverloaded); got != 1 {
				t.Errorf("overloaded = %d, want 1", got)
			}
		})
	}
}

// TestChunkedBodyFitsASmallBudget: a body of unknown length (chunked) takes
// the budget in steps, but never more than the route's max_body_bytes: a
// server.max_buffered_bytes below the step (valid, since it covers every
// route's max_body_bytes) refused every chunked request with 503 overloaded,
// with nothing else buffered.
func TestChunkedBodyFitsASmallBudget(t *testing.T) {
	t.Parallel()
	e := &proxytest.Env{T: t}
	e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.Stub.Close)
	cfg := proxytest.ParseConfig(t, e.Stub.URL, chargesByOrder+"    max_body_bytes: 1024\n")
	cfg.Server.MaxBufferedBytes = 16 << 10
	e.StartConfig(cfg)
	for i := range 2 {
		body := strings.NewReader(`{"orderId": "ORD-SMALL", "amount": 1}`)
		req, _ := http.NewRequest("POST", e.Server.URL+"/charges", struct{ *strings.Reader }{body}) // hides the length
		resp, err := e.Server.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		proxytest.WantStatus(t, fmt.Sprintf("chunked request %d", i+1), proxytest.Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, 201, "")
	}
	if got := e.Charges("ORD-SMALL"); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
}

// TestBrokenStoreDoesNotCrash: Badger with its data directory removed
// fails to rotate its memtable and then panics (nil memtable) in every
// transaction: in the request's goroutine for reads, in the store's
// group-commit writer for writes, and so also under the background release
// of a failed reservation, where nothing but the store or the proxy can
// catch it. The proxy must answer, not die, even on a bare (unguarded)
// Badger store.
func TestBrokenStoreDoesNotCrash(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		w.Write(make([]byte, 8<<10)) // stored in Badger's memtable: fills it fast
	}))
	t.Cleanup(up.Close)
	e := &proxytest.Env{T: t, Stub: up}
	cfg := proxytest.ParseConfig(t, up.URL, chargesByOrder)
	dir := t.TempDir()
	st, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	// Not closed: a Badger that lost its directory hangs in Close.
	e.Proxy, err = proxy.New(cfg, proxy.Options{Store: st, StoreName: "badger"})
	if err != nil {
		t.Fatal(err)
	}
	e.Server = httptest.NewServer(e.Proxy)
	t.Cleanup(e.Server.Close)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := 0; i < 3000 && failed < 30; i++ {
		a := e.Charge(fmt.Sprintf(`"ORD-BROKEN-%d"`, i), 1)
		if a.Err != nil || a.Status != 201 {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("the store never failed; the test proves nothing")
	}
	// Still alive and answering: the background releases have run.
	time.Sleep(100 * time.Millisecond)
	a := e.Charge(`"ORD-BROKEN-LAST"`, 1)
	if a.Err == nil && a.Status != 503 && a.Status != 201 {
		t.Errorf("after the store broke: %s, want 503 store-unavailable", a)
	}
}

// TestForwardedHostAsSent: a request matched by its host as a DNS name
// (another case, a port) is forwarded with X-Forwarded-Host as the client
// sent it, as passthrough does: an upstream that builds absolute URLs from
// it would otherwise store a Location without the port for the whole TTL.
func TestForwardedHostAsSent(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Forwarded-Host")
		w.WriteHeader(201)
	}))
	t.Cleanup(up.Close)
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: charges
    match: POST api.example.com/charges
    key: {json: orderId}
`)
	for i, host := range []string{"api.example.com", "API.Example.com:8443", "api.example.com."} {
		a := hostPost(e, host, fmt.Sprintf(`{"orderId": "ORD-XF%d", "amount": 1}`, i))
		if a.Status != 201 {
			t.Fatalf("Host %s: %s", host, a)
		}
		if got := <-seen; got != host {
			t.Errorf("Host %q: upstream saw X-Forwarded-Host %q, want it as sent", host, got)
		}
	}
}

// sizedAnswers starts the proxy with a charges route (its settings
// appended from route) before an upstream that answers 201 with as many
// bytes as the request's X-Answer-Bytes asks; budget, when not 0, is
// server.max_buffered_bytes. post sends a charge for order.
func sizedAnswers(t *testing.T, route string, budget int64) (post func(order string, answerBytes int) proxytest.Answer, e *proxytest.Env) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n, _ := strconv.Atoi(r.Header.Get("X-Answer-Bytes"))
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		w.Write(bytes.Repeat([]byte("a"), n))
	}))
	t.Cleanup(up.Close)
	e = &proxytest.Env{T: t, Stub: up}
	cfg := proxytest.ParseConfig(t, up.URL, `
  - name: charges
    match: POST /charges
    key: {json: orderId}`+route)
	if budget != 0 {
		cfg.Server.MaxBufferedBytes = budget
	}
	e.StartConfig(cfg)
	return func(order string, answerBytes int) proxytest.Answer {
		return e.Do("POST", "/charges", `{"orderId":"`+order+`"}`, "X-Answer-Bytes", strconv.Itoa(answerBytes))
	}, e
}

// TestCapturedAnswersCountInTheBudget: the copy of an answer kept for
// replay counts in server.max_buffered_bytes. An answer that does not fit
// still reaches its client whole, is committed (never charged twice) and
// is not replayable; the budget is given back when the request ends, so a
// later answer that fits is stored.
func TestCapturedAnswersCountInTheBudget(t *testing.T) {
	t.Parallel()
	post, _ := sizedAnswers(t, `
    max_body_bytes: 65536
    max_stored_body_bytes: 4194304
`, 1<<20)
	tests := []struct {
		order      string
		bytes      int
		replayable bool
	}{
		{"ORD-C1", 3 << 20, false},  // over the budget: not kept
		{"ORD-C2", 900 << 10, true}, // fits, once the first gave its share back
		{"ORD-C3", 900 << 10, true}, // and again: nothing leaked
	}
	for _, tt := range tests {
		// Bodies of megabytes: compare statuses only, not whole answers.
		status := func(what string, a proxytest.Answer, code int, problemType string) {
			t.Helper()
			if a.Err != nil {
				t.Fatalf("%s: %v", what, a.Err)
			}
			if a.Status != code || a.ProblemType() != problemType {
				t.Errorf("%s: got %d %q, want %d %q", what, a.Status, a.ProblemType(), code, problemType)
			}
		}
		a := post(tt.order, tt.bytes)
		status(tt.order, a, 201, "")
		if len(a.Body) != tt.bytes {
			t.Errorf("%s: client got %d bytes, want %d", tt.order, len(a.Body), tt.bytes)
		}
		dup := post(tt.order, tt.bytes)
		if tt.replayable {
			status(tt.order+" retried", dup, 201, "")
			if dup.Header.Get("Idempotent-Replayed") != "true" || len(dup.Body) != tt.bytes {
				t.Errorf("%s retried: replayed=%q, %d bytes, want the stored answer", tt.order, dup.Header.Get("Idempotent-Replayed"), len(dup.Body))
			}
		} else {
			status(tt.order+" retried", dup, 409, "response-not-replayable")
		}
	}
}

// TestAnswerLargerThanBadgerHolds: with max_stored_body_bytes raised past
// the largest value Badger stores (16 MiB), a larger answer still reaches
// its client whole and its key is completed, not replayable: a retry gets
// 409 response-not-replayable, never a 409 in flight or in doubt for the
// key's whole TTL (the commit used to fail). An answer just under the
// limit is replayed.
func TestAnswerLargerThanBadgerHolds(t *testing.T) {
	t.Parallel()
	post, e := sizedAnswers(t, `
    max_stored_body_bytes: 33554432
`, 0)
	tests := []struct {
		order      string
		bytes      int
		replayable bool
	}{
		{"ORD-H1", 17 << 20, false},
		{"ORD-H2", 15 << 20, true},
	}
	for _, tt := range tests {
		a := post(tt.order, tt.bytes)
		if a.Err != nil || a.Status != 201 || len(a.Body) != tt.bytes {
			t.Fatalf("%s: %d, %d bytes, %v; want 201 with %d bytes", tt.order, a.Status, len(a.Body), a.Err, tt.bytes)
		}
		dup := post(tt.order, tt.bytes)
		switch {
		case dup.Err != nil:
			t.Fatalf("%s retried: %v", tt.order, dup.Err)
		case tt.replayable && (dup.Status != 201 || dup.Header.Get("Idempotent-Replayed") != "true" || len(dup.Body) != tt.bytes):
			t.Errorf("%s retried: %d, replayed=%q, %d bytes; want the stored answer", tt.order, dup.Status, dup.Header.Get("Idempotent-Replayed"), len(dup.Body))
		case !tt.replayable && (dup.Status != 409 || dup.ProblemType() != "response-not-replayable"):
			t.Errorf("%s retried: got %d %q, want 409 %q", tt.order, dup.Status, dup.ProblemType(), "response-not-replayable")
		}
		if rec, err := e.Store.Get(context.Background(), store.Key("charges", "", tt.order)); err != nil || rec == nil || rec.State != store.StateCompleted {
			t.Errorf("%s: stored %+v, %v; want completed", tt.order, rec, err)
		}
	}
}

// TestSmallAnswersTakeLittleBudget: answers being captured at once each
// take about their size from server.max_buffered_bytes, not a large step:
// with a budget of 128 KiB, 20 small answers whose upstream is still
// sending them, all at the same time, are all stored and replayed.
func TestSmallAnswersTakeLittleBudget(t *testing.T) {
	t.Parallel()
	const n = 20
	var started sync.WaitGroup
	started.Add(n)
	open := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, `{"charge":`)
		if r.Header.Get("X-Hold") != "" {
			w.(http.Flusher).Flush() // the proxy is capturing this answer now
			started.Done()
			<-open
		}
		io.WriteString(w, `"ch_1"}`)
	}))
	t.Cleanup(up.Close)
	e := &proxytest.Env{T: t, Stub: up}
	cfg := proxytest.ParseConfig(t, up.URL, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    max_body_bytes: 4096
`)
	cfg.Server.MaxBufferedBytes = 128 << 10
	e.StartConfig(cfg)
	done := make(chan proxytest.Answer, n)
	for i := range n {
		go func() {
			done <- e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":"S-%d","amount":1}`, i), "X-Hold", "1")
		}()
	}
	started.Wait()
	time.Sleep(50 * time.Millisecond) // the first parts reach the proxy
	close(open)
	for range n {
		if a := <-done; a.Status != 201 {
			t.Errorf("held request: %s", a)
		}
	}
	for i := range n {
		a := e.Do("POST", "/charges", fmt.Sprintf(`{"orderId":"S-%d","amount":1}`, i))
		if a.Status != 201 || a.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("S-%d retried: %d replayed=%q, want the stored answer", i, a.Status, a.Header.Get("Idempotent-Replayed"))
		}
	}
}
