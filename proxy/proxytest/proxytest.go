package proxy_test

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
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// env is a proxy in front of the real upstream stub, on a real Badger
// store in a temporary directory.
type env struct {
	t     *testing.T
	stub  *httptest.Server
	srv   *httptest.Server
	p     *proxy.Proxy
	store *badger.Store
	reg   *prometheus.Registry
	// log, when set before start, receives the proxy's log (JSON).
	log io.Writer
}

// newEnv starts the stub and a proxy whose configuration is routes (the
// YAML of the routes list), with the stub as upstream.
func newEnv(t *testing.T, routes string) *env {
	t.Helper()
	e := &env{t: t}
	e.stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.stub.Close)
	e.start(e.stub.URL, routes)
	return e
}

func (e *env) start(upstream, routes string) {
	e.t.Helper()
	e.startConfig(parseConfig(e.t, upstream, routes))
}

// startConfig starts a proxy serving cfg on a new Badger store.
func (e *env) startConfig(cfg *config.Config) {
	t := e.t
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir(), SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	t.Cleanup(func() { st.Close() })
	e.reg = prometheus.NewRegistry()
	logger := slog.New(slog.DiscardHandler)
	if e.log != nil {
		logger = slog.New(slog.NewJSONHandler(e.log, nil))
	}
	e.p, err = proxy.New(cfg, proxy.Options{Store: st, StoreName: "badger", Metrics: proxy.NewMetrics(e.reg), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.p)
	t.Cleanup(e.srv.Close)
}

func parseConfig(t *testing.T, upstream, routes string) *config.Config {
	t.Helper()
	y := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: %s\nstore: {badger: {dir: unused}}\nroutes:\n%s", upstream, routes)
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// answer is a response as the client saw it.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// problemType returns the name of a problem made by the proxy, "" for any
// other answer (the upstream's own problems included).
func (a answer) problemType() string {
	if a.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	if err := json.Unmarshal(a.body, &p); err != nil {
		return "unparsable problem: " + err.Error()
	}
	name, ours := strings.CutPrefix(p.Type, problem.TypePrefix)
	if !ours {
		return ""
	}
	return name
}

func (a answer) field(name string) any {
	var m map[string]any
	json.Unmarshal(a.body, &m)
	return m[name]
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, a.body)
}

// do sends one request through the proxy. hdr alternates names and values.
func (e *env) do(method, path, body string, hdr ...string) answer {
	e.t.Helper()
	return send(e.srv.Client(), method, e.srv.URL+path, body, hdr...)
}

func send(c *http.Client, method, url, body string, hdr ...string) answer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return answer{err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// charge posts a charge for order.
func (e *env) charge(order string, amount int, hdr ...string) answer {
	e.t.Helper()
	return e.do("POST", "/charges", fmt.Sprintf(`{"orderId": %s, "amount": %d}`, order, amount), hdr...)
}

// charges returns how many times the stub charged order.
func (e *env) charges(order string) int {
	e.t.Helper()
	resp, err := http.Get(e.stub.URL + "/orders/" + order + "/charges")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Charges int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		e.t.Fatal(err)
	}
	return st.Charges
}

// totalCharges returns how many charges the stub recorded in all.
func (e *env) totalCharges() int {
	e.t.Helper()
	resp, err := http.Get(e.stub.URL + "/charges")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Charges int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		e.t.Fatal(err)
	}
	return st.Charges
}

// fault queues a stub fault for the next count charge requests.
func (e *env) fault(name string, count int, delay string) {
	e.t.Helper()
	body := fmt.Sprintf(`{"fault": %q, "count": %d, "delay": %q}`, name, count, delay)
	resp, err := http.Post(e.stub.URL+"/faults", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("queue fault %s: %s", body, resp.Status)
	}
}

// state returns the state of a key on a route ("" when there is no record).
func (e *env) state(route, scope, key string) store.State {
	e.t.Helper()
	rec, err := e.store.Get(context.Background(), store.Key(route, scope, key))
	if err != nil {
		e.t.Fatal(err)
	}
	if rec == nil {
		return ""
	}
	return rec.State
}

// outcomes returns idemproxy_requests_total{route, outcome}.
func (e *env) outcomes(route string, o proxy.Outcome) int {
	e.t.Helper()
	return int(counterValue(e.t, e.reg, "idemproxy_requests_total", map[string]string{"route": route, "outcome": string(o)}))
}

// counterValue returns the value of the counter (or gauge) name with
// exactly labels.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
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

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

func wantStatus(t *testing.T, what string, a answer, status int, problemType string) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	if a.status != status || a.problemType() != problemType {
		t.Errorf("%s: got %d %q (%s), want %d %q", what, a.status, a.problemType(), bytes.TrimSpace(a.body), status, problemType)
	}
}
