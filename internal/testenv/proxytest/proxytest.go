// Package proxytest is the harness of the proxy's tests and of the tests of
// the packages built on it (internal/reconcile): a real proxy.Proxy in front
// of the real upstream stub (upstream-stub/stub), on a real Badger store in a
// temporary directory, and helpers to send requests through it and read what
// the stub, the store and the metrics saw. It is a normal package imported
// only by tests; it fakes nothing.
//
// The proxy's own internal tests (package proxy) cannot use it, since it
// imports proxy.
package proxytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// Env is a proxy in front of the real upstream stub, on a real Badger
// store in a temporary directory. New builds a whole one; a test that needs
// another upstream sets T (and Stub) itself and calls Start or StartConfig,
// and a test that builds its own proxy may fill in only the fields the
// methods it calls read.
type Env struct {
	// T is the test; the helpers fail it.
	T testing.TB
	// Stub is the upstream: the stub's helpers (Charges, TotalCharges,
	// Fault) talk to it.
	Stub *httptest.Server
	// Server serves Proxy; Do and Charge send to it.
	Server *httptest.Server
	// Proxy is the proxy under test, set by Start and StartConfig.
	Proxy *proxy.Proxy
	// Store is the Badger store of Proxy, set by Start and StartConfig;
	// State reads it.
	Store *badger.Store
	// Registry holds Proxy's metrics, set by Start and StartConfig;
	// Outcomes reads it.
	Registry *prometheus.Registry
	// Log, when set before Start, receives the proxy's log (JSON); nil
	// discards it.
	Log io.Writer
	// Tracing, when set before Start, traces the proxy's requests; nil:
	// no traces.
	Tracing *tracing.Tracing
	// WrapStore, when set before Start, gives the store the proxy uses in
	// place of the Badger store (a wrapper of it that counts or fails
	// calls); Store is still the Badger store.
	WrapStore func(*badger.Store) store.Store
}

// New starts the stub and a proxy whose configuration is routes (the
// YAML of the routes list), with the stub as upstream. Everything stops
// when the test ends.
func New(t testing.TB, routes string) *Env {
	t.Helper()
	e := &Env{T: t}
	e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, routes)
	return e
}

// Start starts a proxy in front of upstream whose routes are routes (see
// ParseConfig), on a new Badger store.
func (e *Env) Start(upstream, routes string) {
	e.T.Helper()
	e.StartConfig(ParseConfig(e.T, upstream, routes))
}

// StartConfig starts a proxy serving cfg on a new Badger store, and sets
// Proxy, Store, Registry and Server.
func (e *Env) StartConfig(cfg *config.Config) {
	t := e.T
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	e.Store = st
	t.Cleanup(func() { st.Close() })
	e.Registry = prometheus.NewRegistry()
	logger := slog.New(slog.DiscardHandler)
	if e.Log != nil {
		logger = slog.New(slog.NewJSONHandler(e.Log, nil))
	}
	var ps store.Store = st
	if e.WrapStore != nil {
		ps = e.WrapStore(st)
	}
	e.Proxy, err = proxy.New(cfg, proxy.Options{Store: ps, StoreName: "badger", Metrics: proxy.NewMetrics(e.Registry), Logger: logger,
		Tracing: e.Tracing})
	if err != nil {
		t.Fatal(err)
	}
	e.Server = httptest.NewServer(e.Proxy)
	t.Cleanup(e.Server.Close)
}

// ParseConfig returns the configuration of a proxy in front of upstream
// whose routes list is routes (YAML, indented as an item of the routes
// list), with a Badger store; it fails the test if the configuration does
// not parse.
func ParseConfig(t testing.TB, upstream, routes string) *config.Config {
	t.Helper()
	y := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: %s\nstore: {badger: {dir: unused}}\nroutes:\n%s", upstream, routes)
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// Answer is a response as the client saw it. Err is the error of the
// request or of reading the body; the other fields are zero when the
// request failed.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	Err    error
}

// Replayed reports whether the proxy answered with a stored response
// (Idempotent-Replayed: true).
func (a Answer) Replayed() bool { return a.Header.Get("Idempotent-Replayed") == "true" }

// ProblemType returns the name of a problem made by the proxy, "" for any
// other answer (the upstream's own problems included).
func (a Answer) ProblemType() string {
	if a.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	if err := json.Unmarshal(a.Body, &p); err != nil {
		return "unparsable problem: " + err.Error()
	}
	name, ours := strings.CutPrefix(p.Type, problem.TypePrefix)
	if !ours {
		return ""
	}
	return name
}

// Field returns the top-level member name of the JSON body, nil when the
// body has none or is not a JSON object.
func (a Answer) Field(name string) any {
	var m map[string]any
	json.Unmarshal(a.Body, &m)
	return m[name]
}

// String returns the status and the body, or the error.
func (a Answer) String() string {
	if a.Err != nil {
		return "error: " + a.Err.Error()
	}
	return fmt.Sprintf("%d %s", a.Status, a.Body)
}

// Do sends one request through the proxy. hdr alternates names and values.
func (e *Env) Do(method, path, body string, hdr ...string) Answer {
	e.T.Helper()
	return Send(e.Server.Client(), method, e.Server.URL+path, body, hdr...)
}

// Send sends one request to url with c and reads the whole answer. A
// non-empty body is sent as application/json; hdr alternates names and
// values.
func Send(c *http.Client, method, url, body string, hdr ...string) Answer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return Answer{Err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: b, Err: err}
}

// Charge posts a charge for order (a JSON value: `"A-1"` is a string,
// `7` a number) through the proxy.
func (e *Env) Charge(order string, amount int, hdr ...string) Answer {
	e.T.Helper()
	return e.Do("POST", "/charges", fmt.Sprintf(`{"orderId": %s, "amount": %d}`, order, amount), hdr...)
}

// Charges returns how many times the stub charged order.
func (e *Env) Charges(order string) int {
	e.T.Helper()
	return e.stubCharges("/orders/" + order + "/charges")
}

// TotalCharges returns how many charges the stub recorded in all.
func (e *Env) TotalCharges() int {
	e.T.Helper()
	return e.stubCharges("/charges")
}

// stubCharges returns the charges count the stub answers at path.
func (e *Env) stubCharges(path string) int {
	e.T.Helper()
	resp, err := http.Get(e.Stub.URL + path)
	if err != nil {
		e.T.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Charges int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		e.T.Fatal(err)
	}
	return st.Charges
}

// Fault queues a stub fault for the next count charge requests; delay is
// a duration ("1s"), "" for none.
func (e *Env) Fault(name string, count int, delay string) {
	e.T.Helper()
	body := fmt.Sprintf(`{"fault": %q, "count": %d, "delay": %q}`, name, count, delay)
	resp, err := http.Post(e.Stub.URL+"/faults", "application/json", strings.NewReader(body))
	if err != nil {
		e.T.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		e.T.Fatalf("queue fault %s: %s", body, resp.Status)
	}
}

// State returns the state of a key on a route ("" when there is no record).
func (e *Env) State(route, scope, key string) store.State {
	e.T.Helper()
	rec, err := e.Store.Get(context.Background(), store.Key(route, scope, key))
	if err != nil {
		e.T.Fatal(err)
	}
	if rec == nil {
		return ""
	}
	return rec.State
}

// Outcomes returns idemproxy_requests_total{route, outcome}.
func (e *Env) Outcomes(route string, o proxy.Outcome) int {
	e.T.Helper()
	return int(CounterValue(e.T, e.Registry, "idemproxy_requests_total", map[string]string{"route": route, "outcome": string(o)}))
}

// CounterValue returns the value of the counter (or gauge) name with
// exactly labels (nil for none), 0 when reg has no such series.
func CounterValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// Eventually polls cond for up to EventuallyLimit, and fails the test with what if it
// never holds.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, EventuallyLimit, what, cond)
}

// EventuallyLimit is how long Eventually waits: long enough for a loaded
// machine (the tests pass with both cores of a 2-core machine kept busy);
// a test that passes waits only as long as its condition takes.
const EventuallyLimit = 30 * time.Second

// EventuallyWithin is Eventually with a limit of the test's own (a bound
// that the test derived from its settings, plus EventuallyLimit).
func EventuallyWithin(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
	}
}

// WantStatus fails the test (named what) if a is not an answer with status
// and the proxy's problem problemType ("" for an answer that is not one of
// the proxy's problems). A request that failed stops the test.
func WantStatus(t testing.TB, what string, a Answer, status int, problemType string) {
	t.Helper()
	if a.Err != nil {
		t.Fatalf("%s: %v", what, a.Err)
	}
	if a.Status != status || a.ProblemType() != problemType {
		t.Errorf("%s: got %d %q (%s), want %d %q", what, a.Status, a.ProblemType(), bytes.TrimSpace(a.Body), status, problemType)
	}
}
