package e2e

// End-to-end tests of the traces (issue 29, docs/observability.md) with the
// real binary and real OTLP receivers (internal/testenv/otlptest decodes the
// official protobuf messages, over HTTP and over gRPC): the span tree of a
// request (server span, store spans, the upstream call's client span, the
// traceparent the upstream gets), the link from a replay to the span that
// forwarded the original request (in one process, across a restart on
// Badger, across two replicas on Redis and on PostgreSQL), the events, a
// client's trace continued, tracing turned on and off by a reload, sampled
// out or disabled, a collector that is down, a client's invalid UTF-8, the
// exemplars on /metrics, and the admin API's and the reconciler's spans.
//
// A test that asserts that something was not exported stops the proxy
// first: a stopped process has exported all it ever will.

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/idemproxy/idemproxy/internal/testenv/otlptest"
	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// tracingOn is the configuration's section that turns tracing on.
const tracingOn = "tracing:\n  enabled: true\n"

// startTracedProxy starts the binary with tracing on, the charges route
// to upstream and a Badger directory of its own, and env added to its
// environment (the receiver's OTEL_* variables, say).
func startTracedProxy(t *testing.T, upstream string, env ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	return startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), upstream, filepath.Join(dir, "data"), tracingOn, chargesRoute), env...)
}

// spanWait is how long a test waits for spans to arrive: a wait, not an
// assertion on time (they come within about 50 ms, OTEL_BSP_SCHEDULE_DELAY).
const spanWait = 15 * time.Second

const (
	spanServer = tracepb.Span_SPAN_KIND_SERVER
	spanClient = tracepb.Span_SPAN_KIND_CLIENT
)

// tracedStub is the upstream stub behind a handler that records the
// traceparent header of every request it gets, and holds the requests
// that carry X-Test-Hold until releaseHeld.
type tracedStub struct {
	*httptest.Server
	mu      sync.Mutex
	seen    []upstreamRequest
	held    atomic.Int32
	release chan struct{}
	once    sync.Once
}

type upstreamRequest struct{ method, path, traceparent string }

// startTracedStub starts one, closed when the test ends.
func startTracedStub(t *testing.T) *tracedStub {
	t.Helper()
	u := &tracedStub{release: make(chan struct{})}
	h := stub.New(slog.New(slog.DiscardHandler))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, upstreamRequest{r.Method, r.URL.Path, r.Header.Get("Traceparent")})
		u.mu.Unlock()
		if r.Header.Get("X-Test-Hold") != "" {
			u.held.Add(1)
			<-u.release
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		u.releaseHeld()
		u.Close()
	})
	return u
}

// releaseHeld lets the held requests (and any later one) through.
func (u *tracedStub) releaseHeld() { u.once.Do(func() { close(u.release) }) }

// traceparents returns the traceparent headers ("" for none) of the
// requests method path that reached the stub, in order.
func (u *tracedStub) traceparents(method, path string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, r := range u.seen {
		if r.method == method && r.path == path {
			out = append(out, r.traceparent)
		}
	}
	return out
}

// traceparentIDs returns the trace ID, the parent span ID and the flags
// of a W3C traceparent header.
func traceparentIDs(v string) (traceID, spanID, flags string) {
	f := strings.Split(v, "-")
	if len(f) != 4 {
		return "", "", ""
	}
	return f[1], f[2], f[3]
}

// orderHash is the idemproxy.key_hash of order on the charges route.
func orderHash(order string) string { return store.KeyHash(store.Key("charges", "", order)) }

// requestSpan matches the server span of the request for order on the
// charges route that ended with outcome.
func requestSpan(order, outcome string) func(otlptest.Span) bool {
	return otlptest.All(otlptest.OfKind(spanServer), otlptest.WithAttr("idemproxy.key_hash", orderHash(order)),
		otlptest.WithAttr("idemproxy.outcome", outcome))
}

// spanNamed matches spans by name and kind.
func spanNamed(name string, kind tracepb.Span_SpanKind) func(otlptest.Span) bool {
	return otlptest.All(otlptest.Named(name), otlptest.OfKind(kind))
}

// oneSpan returns the only span of spans that match matches; it fails the
// test when there is none or more than one.
func oneSpan(t *testing.T, spans []otlptest.Span, what string, match func(otlptest.Span) bool) otlptest.Span {
	t.Helper()
	found := otlptest.Find(spans, match)
	if len(found) != 1 {
		t.Fatalf("%s: %d spans, want 1:\n%s", what, len(found), spanList(spans))
	}
	return found[0]
}

// spanList is spans, one a line, for a failure's message.
func spanList(spans []otlptest.Span) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString("  " + s.String() + "\n")
	}
	return b.String()
}

// waitSpans waits until every one of matches matches at least one of the
// spans rcv received, and returns them.
func waitSpans(t *testing.T, rcv *otlptest.Receiver, what string, matches ...func(otlptest.Span) bool) []otlptest.Span {
	t.Helper()
	return rcv.WaitFor(t, spanWait, what, func(spans []otlptest.Span) bool {
		for _, m := range matches {
			if len(otlptest.Find(spans, m)) == 0 {
				return false
			}
		}
		return true
	})
}

// checkSpanAttrs reports every attribute of s that is not as want says.
func checkSpanAttrs(t *testing.T, what string, s otlptest.Span, want map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if got := s.Attr(k); got != want[k] {
			t.Errorf("%s: %s = %q, want %q", what, k, got, want[k])
		}
	}
}

// keyOrigin returns the origin the admin API shows for order's record on
// the charges route ("" for none); p's admin token is "tok".
func keyOrigin(t *testing.T, p *proc, order string) string {
	t.Helper()
	r := do("GET", p.adminURL("/v1/keys/charges/"+order), "", "Authorization", "Bearer tok")
	var v struct{ Origin string }
	if err := json.Unmarshal([]byte(r.body), &v); r.status != 200 || err != nil {
		t.Fatalf("GET /v1/keys/charges/%s = %d %s %v", order, r.status, r.body, err)
	}
	return v.Origin
}

// wantReplay requires r to be a replayed 201 with the body of first.
func wantReplay(t *testing.T, what string, r, first result) {
	t.Helper()
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.body != first.body {
		t.Fatalf("%s = %d %s %v (replayed %q), want the first answer %q replayed",
			what, r.status, r.body, r.err, r.header.Get("Idempotent-Replayed"), first.body)
	}
}

// wantForwarded requires r to be a forwarded 201.
func wantForwarded(t *testing.T, what string, r result) {
	t.Helper()
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("%s = %d %s %v (replayed %q), want a forwarded 201",
			what, r.status, r.body, r.err, r.header.Get("Idempotent-Replayed"))
	}
}

// TestTracingSpanTreeAndReplayLink: over OTLP/HTTP and OTLP/gRPC (the
// start log says which, where to, and the sampler), a charge gives a
// server span with the HTTP and idemproxy attributes (its key hash
// the access log's), the store's reserve and commit spans and the upstream
// call's client span as its children, and the upstream gets that client
// span as its parent; the retry's server span says replayed and links to
// the first request's span.
func TestTracingSpanTreeAndReplayLink(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		receiver func(testing.TB) *otlptest.Receiver
	}{
		{"otlp-http", otlptest.NewHTTP},
		{"otlp-grpc", otlptest.NewGRPC},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rcv := tt.receiver(t)
			up := startTracedStub(t)
			p := startTracedProxy(t, up.URL, append(rcv.Env(), "IDEMPROXY_ADMIN_TOKEN=tok")...)
			first := charge(p, "TR-1")
			wantForwarded(t, "TR-1", first)
			wantReplay(t, "TR-1's retry", charge(p, "TR-1"), first)

			orig := requestSpan("TR-1", "committed")
			spans := rcv.WaitFor(t, spanWait, "TR-1's spans", func(got []otlptest.Span) bool {
				servers := otlptest.Find(got, orig)
				if len(servers) == 0 || len(otlptest.Find(got, requestSpan("TR-1", "replayed"))) == 0 {
					return false
				}
				children := otlptest.ChildrenOf(got, servers[0])
				return slices.ContainsFunc(children, spanNamed("store reserve", spanClient)) &&
					slices.ContainsFunc(children, spanNamed("store commit", spanClient)) &&
					slices.ContainsFunc(children, spanNamed("POST", spanClient))
			})

			var logged map[string]any
			eventually(t, "the access log line of the charge", func() bool {
				for _, l := range p.log.logLines("request") {
					if l["outcome"] == "committed" {
						logged = l
						return true
					}
				}
				return false
			})
			server := oneSpan(t, spans, "TR-1's server span", orig)
			if l := p.log.logLines("tracing on"); len(l) != 1 || l[0]["protocol"] != rcv.Protocol || l[0]["endpoint"] != rcv.Endpoint ||
				l[0]["sampler"] != "parentbased_always_on" {
				t.Errorf("start log lines \"tracing on\": %v, want one with protocol %s, endpoint %s, sampler parentbased_always_on",
					l, rcv.Protocol, rcv.Endpoint)
			}
			if logged["trace_id"] != server.TraceID {
				t.Errorf("the access log line's trace_id = %v, want the server span's %s", logged["trace_id"], server.TraceID)
			}
			if got := keyOrigin(t, p, "TR-1"); got != server.TraceID+"-"+server.SpanID {
				t.Errorf("GET /v1/keys/charges/TR-1: origin %q, want the server span's %s-%s", got, server.TraceID, server.SpanID)
			}
			if server.Name != "POST /charges" || server.ParentID != "" || server.Service != "idemproxy" || server.Scope != tracing.ScopeName {
				t.Errorf("server span = %s in scope %q, want a root span \"POST /charges\" of service idemproxy in scope %q",
					server, server.Scope, tracing.ScopeName)
			}
			checkSpanAttrs(t, "server span", server, map[string]string{
				"http.request.method":       "POST",
				"http.route":                "/charges",
				"url.path":                  "/charges",
				"url.scheme":                "http",
				"http.response.status_code": "201",
				"idemproxy.route":           "charges",
				"idemproxy.key_hash":        fmt.Sprint(logged["key_hash"]),
				"idemproxy.policy":          "reserve-then-commit",
				"idemproxy.store":           "badger",
				"idemproxy.outcome":         "committed",
				"idemproxy.replayed":        "false",
			})
			children := otlptest.ChildrenOf(spans, server)
			for _, op := range []string{"reserve", "commit"} {
				s := oneSpan(t, children, "the store "+op+" span under the server span", spanNamed("store "+op, spanClient))
				checkSpanAttrs(t, "store "+op+" span", s, map[string]string{"db.system.name": "badger", "db.operation.name": op})
			}
			client := oneSpan(t, children, "the upstream call's client span under the server span", spanNamed("POST", spanClient))
			checkSpanAttrs(t, "client span", client, map[string]string{
				"http.request.method": "POST", "http.response.status_code": "201", "server.address": "127.0.0.1",
				"url.full": up.URL + "/charges",
			})
			tps := up.traceparents("POST", "/charges")
			if len(tps) != 1 {
				t.Fatalf("the upstream got %d charges (traceparents %q), want 1", len(tps), tps)
			}
			if tid, sid, flags := traceparentIDs(tps[0]); tid != server.TraceID || sid != client.SpanID || flags != "01" {
				t.Errorf("the upstream's traceparent = %q, want trace %s, parent %s (the client span), sampled",
					tps[0], server.TraceID, client.SpanID)
			}

			retry := oneSpan(t, spans, "the retry's server span", requestSpan("TR-1", "replayed"))
			checkSpanAttrs(t, "retry's server span", retry, map[string]string{
				"idemproxy.replayed": "true", "http.response.status_code": "201", "idemproxy.route": "charges",
			})
			if retry.TraceID == server.TraceID || retry.ParentID != "" {
				t.Errorf("retry's span %s: want a trace of its own (the client sent none)", retry)
			}
			if !retry.LinksTo(server) {
				t.Errorf("retry's span links %v, want a link to the first request's span %s-%s", retry.Links, server.TraceID, server.SpanID)
			} else if got := retry.Links[0].Attrs["idemproxy.link"]; got != "original" {
				t.Errorf("the link's idemproxy.link = %v, want original", got)
			}
			if c := otlptest.Find(otlptest.ChildrenOf(spans, retry), otlptest.OfKind(spanClient)); slices.ContainsFunc(c, otlptest.Named("POST")) {
				t.Errorf("the replay has an upstream call span: %v", c)
			}
		})
	}
}

// TestTracingLinkAcrossRestart: a charge still at the upstream when the
// proxy gets SIGTERM finishes, and its span is exported before the process
// exits (its batch delay is a minute: only the flush at the exit sends
// it); a new process on the same Badger directory replays the charge,
// and the replay links to the span from before the restart.
func TestTracingLinkAcrossRestart(t *testing.T) {
	t.Parallel()
	rcv := otlptest.NewHTTP(t)
	up := startTracedStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), tracingOn, chargesRoute)
	p := startProxy(t, cfg, append(rcv.Env(), "OTEL_BSP_SCHEDULE_DELAY=60000")...)
	firstc := make(chan result, 1)
	go func() { firstc <- charge(p, "TR-R1", "X-Test-Hold", "1") }()
	eventually(t, "the charge is held at the upstream", func() bool { return up.held.Load() == 1 })
	p.signal(syscall.SIGTERM)
	eventually(t, "the proxy shuts down", func() bool { return len(p.log.logLines("shutting down")) == 1 })
	up.releaseHeld()
	first := <-firstc
	wantForwarded(t, "TR-R1, in flight at the SIGTERM", first)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
	}
	// The process flushed its spans before it exited: no wait.
	orig := oneSpan(t, rcv.Spans(), "the charge's span, exported before the exit", requestSpan("TR-R1", "committed"))

	p = startProxy(t, cfg, rcv.Env()...)
	wantReplay(t, "TR-R1 after the restart", charge(p, "TR-R1"), first)
	spans := waitSpans(t, rcv, "the replay's span", requestSpan("TR-R1", "replayed"))
	replay := oneSpan(t, spans, "the replay's span", requestSpan("TR-R1", "replayed"))
	if !replay.LinksTo(orig) {
		t.Errorf("the replay after the restart links %v, want a link to %s-%s, the span from before it", replay.Links, orig.TraceID, orig.SpanID)
	}
	if n := chargeCount(t, up.URL, "TR-R1"); n != 1 {
		t.Errorf("TR-R1 charges = %d, want 1", n)
	}
}

// TestTracingLinkAcrossReplicas: two replicas on one shared store (Redis,
// PostgreSQL), each its own service name and instance, export to one
// receiver; replica A forwards a charge, replica B replays it, and B's
// span links to A's.
func TestTracingLinkAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		store, dbSystem string
		// section starts the store and returns the configuration's store
		// section for it, and the replicas' environment.
		section func(t *testing.T) (yaml string, env []string)
	}{
		{"redis", "redis", func(t *testing.T) (string, []string) {
			rd := redistest.Start(t)
			return fmt.Sprintf("  redis:\n    addrs: [%s]\n    key_prefix: %q\n", rd.Addr(), e2eKeyPrefix), nil
		}},
		{"postgres", "postgresql", func(t *testing.T) (string, []string) {
			pg := pgtest.Start(t)
			return fmt.Sprintf("  postgres:\n    dsn_env: %s\n", pgDSNEnv), []string{pgDSNEnv + "=" + pg.DSN()}
		}},
	} {
		t.Run(tt.store, func(t *testing.T) {
			t.Parallel()
			rcv := otlptest.NewGRPC(t)
			up := startStub(t)
			section, env := tt.section(t)
			// A short epoch check: a new marker waits three of them before
			// the replicas serve.
			cfg := filepath.Join(t.TempDir(), "c.yaml")
			y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  epoch_check_interval: 100ms
%s%sroutes:
%s`, up.URL, section, tracingOn, chargesRoute)
			if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			replica := func(name string) *proc {
				return startProxy(t, cfg, append(append(rcv.Env(), env...), "OTEL_SERVICE_NAME=idemproxy-"+name,
					"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=replica-"+name+",deployment.environment.name=e2e")...)
			}
			a, b := replica("a"), replica("b")
			first := charge(a, "TR-S1")
			wantForwarded(t, "TR-S1 via A", first)
			wantReplay(t, "TR-S1 via B", charge(b, "TR-S1"), first)

			spans := waitSpans(t, rcv, "A's charge and B's replay",
				requestSpan("TR-S1", "committed"), requestSpan("TR-S1", "replayed"))
			orig := oneSpan(t, spans, "A's span", requestSpan("TR-S1", "committed"))
			replay := oneSpan(t, spans, "B's span", requestSpan("TR-S1", "replayed"))
			for _, c := range []struct {
				span          otlptest.Span
				name          string
				service, inst string
			}{
				{orig, "A's span", "idemproxy-a", "replica-a"},
				{replay, "B's span", "idemproxy-b", "replica-b"},
			} {
				if c.span.Service != c.service || c.span.Resource["service.instance.id"] != c.inst || c.span.Resource["deployment.environment.name"] != "e2e" {
					t.Errorf("%s: service %q, resource %v; want service %s, service.instance.id %s, deployment.environment.name e2e",
						c.name, c.span.Service, c.span.Resource, c.service, c.inst)
				}
				checkSpanAttrs(t, c.name, c.span, map[string]string{"idemproxy.store": tt.store})
			}
			if !replay.LinksTo(orig) {
				t.Errorf("B's replay links %v, want a link to A's span %s-%s", replay.Links, orig.TraceID, orig.SpanID)
			}
			reserve := oneSpan(t, otlptest.ChildrenOf(spans, orig), "A's store reserve span", spanNamed("store reserve", spanClient))
			checkSpanAttrs(t, "A's store reserve span", reserve, map[string]string{"db.system.name": tt.dbSystem})
		})
	}
}

// TestTracingEvents: the server spans carry the events an investigation
// looks for, and a request answered from a record (409, 422, a replay
// after a wait) links to the span that forwarded the record's request.
func TestTracingEvents(t *testing.T) {
	t.Parallel()
	waitRoute := chargesRoute + "    concurrent: wait\n"
	tests := []struct {
		name  string
		route string
		// run sends the original request and the one answered from its
		// record, for order.
		run                       func(t *testing.T, p *proc, up *tracedStub, order string) (first, second result)
		firstStatus, secondStatus int
		firstOutcome, secondOut   string
		firstEvents, secondEvents []string
		firstStoreOp              string // a store operation with a span under the first request's
		waitEnd                   string // the idemproxy.state of the second's wait_end event
	}{
		{
			name: "in doubt", route: chargesRoute,
			run: func(t *testing.T, p *proc, up *tracedStub, order string) (result, result) {
				return charge(p, order, "X-Stub-Fault", "drop-after-charge"), charge(p, order)
			},
			firstStatus: 502, secondStatus: 409, firstOutcome: "in_doubt", secondOut: "conflict",
			firstEvents: []string{tracing.EventInDoubt}, firstStoreOp: "mark_in_doubt",
		},
		{
			name: "fingerprint mismatch", route: chargesRoute,
			run: func(t *testing.T, p *proc, up *tracedStub, order string) (result, result) {
				first := charge(p, order)
				return first, do("POST", p.url("/charges"), fmt.Sprintf(`{"orderId": %q, "amount": 99}`, order))
			},
			firstStatus: 201, secondStatus: 422, firstOutcome: "committed", secondOut: "mismatch",
			secondEvents: []string{tracing.EventFingerprintMismatch}, firstStoreOp: "commit",
		},
		{
			name: "wait", route: waitRoute,
			run: func(t *testing.T, p *proc, up *tracedStub, order string) (result, result) {
				// The first is held at the upstream until the second
				// waits for it: polls the store for its key.
				firstc, secondc := make(chan result, 1), make(chan result, 1)
				go func() { firstc <- charge(p, order, "X-Test-Hold", "1") }()
				eventually(t, "the first charge is held at the upstream", func() bool { return up.held.Load() == 1 })
				const gets = "idemproxy_store_operation_duration_seconds_count"
				before := metricSum(t, p, gets, `operation="get"`)
				go func() { secondc <- charge(p, order) }()
				eventually(t, "the second charge waits", func() bool { return metricSum(t, p, gets, `operation="get"`) > before })
				up.releaseHeld()
				return <-firstc, <-secondc
			},
			firstStatus: 201, secondStatus: 201, firstOutcome: "committed", secondOut: "replayed",
			secondEvents: []string{tracing.EventWait, tracing.EventWaitEnd}, firstStoreOp: "commit", waitEnd: "completed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rcv := otlptest.NewHTTP(t)
			up := startTracedStub(t)
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), tracingOn, tt.route),
				rcv.Env()...)
			const order = "TR-E1"
			first, second := tt.run(t, p, up, order)
			if first.status != tt.firstStatus || second.status != tt.secondStatus {
				t.Fatalf("answers = %d %s, %d %s; want %d, %d", first.status, first.body, second.status, second.body, tt.firstStatus, tt.secondStatus)
			}
			spans := waitSpans(t, rcv, "both requests' spans", requestSpan(order, tt.firstOutcome), requestSpan(order, tt.secondOut))
			orig := oneSpan(t, spans, "the first request's span", requestSpan(order, tt.firstOutcome))
			next := oneSpan(t, spans, "the second request's span", requestSpan(order, tt.secondOut))
			for _, c := range []struct {
				what string
				span otlptest.Span
				want []string
			}{{"the first request's span", orig, tt.firstEvents}, {"the second request's span", next, tt.secondEvents}} {
				var got []string
				for _, e := range c.span.Events {
					if strings.HasPrefix(e.Name, "idemproxy.") {
						got = append(got, e.Name)
					}
				}
				if !slices.Equal(got, c.want) {
					t.Errorf("%s: idemproxy events %q, want %q", c.what, got, c.want)
				}
			}
			op := oneSpan(t, otlptest.ChildrenOf(spans, orig), "the store "+tt.firstStoreOp+" span under the first request's",
				spanNamed("store "+tt.firstStoreOp, spanClient))
			checkSpanAttrs(t, "the store "+tt.firstStoreOp+" span", op, map[string]string{"db.operation.name": tt.firstStoreOp})
			if i := slices.IndexFunc(next.Events, func(e otlptest.Event) bool { return e.Name == tracing.EventWaitEnd }); i >= 0 {
				if got := fmt.Sprint(next.Events[i].Attrs["idemproxy.state"]); got != tt.waitEnd {
					t.Errorf("wait_end's idemproxy.state = %q, want %q", got, tt.waitEnd)
				}
			}
			if !next.LinksTo(orig) {
				t.Errorf("the second request's span links %v, want a link to the first's %s-%s", next.Links, orig.TraceID, orig.SpanID)
			}
		})
	}
}

// TestTracingContinuesClientTrace: under the parent-based samplers, a
// client that sends a sampled traceparent gets its trace continued (the
// server span's trace and parent are the client's, and the upstream gets
// that trace too), one that sends an unsampled one gets no span exported
// (the upstream still gets the trace, unsampled), and a request without
// one is traced as the sampler's ratio says: always, or at 0 never.
func TestTracingContinuesClientTrace(t *testing.T) {
	t.Parallel()
	const (
		sampledTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
		unsampledTrace = "0af7651916cd43dd8448eb211c80319c"
		clientSpan     = "00f067aa0ba902b7"
	)
	for _, tt := range []struct {
		name          string
		env           []string
		rootsExported bool // a request without a traceparent
	}{
		{"parentbased_always_on (the default)", nil, true},
		{"parentbased_traceidratio 0", []string{"OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rcv := otlptest.NewHTTP(t)
			up := startTracedStub(t)
			p := startTracedProxy(t, up.URL, append(rcv.Env(), tt.env...)...)
			wantForwarded(t, "TR-C0", charge(p, "TR-C0", "Traceparent", "00-"+unsampledTrace+"-"+clientSpan+"-00"))
			wantForwarded(t, "TR-C1", charge(p, "TR-C1", "Traceparent", "00-"+sampledTrace+"-"+clientSpan+"-01"))
			wantForwarded(t, "TR-C2", charge(p, "TR-C2"))
			spans := waitSpans(t, rcv, "TR-C1's span", requestSpan("TR-C1", "committed"))
			server := oneSpan(t, spans, "TR-C1's span", requestSpan("TR-C1", "committed"))
			if server.TraceID != sampledTrace || server.ParentID != clientSpan {
				t.Errorf("server span trace %s parent %s, want the client's: trace %s parent %s", server.TraceID, server.ParentID, sampledTrace, clientSpan)
			}
			tps := up.traceparents("POST", "/charges")
			if len(tps) != 3 {
				t.Fatalf("the upstream got %d charges (%q), want 3", len(tps), tps)
			}
			for i, want := range []struct{ trace, flags string }{{unsampledTrace, "00"}, {sampledTrace, "01"}} {
				if tid, sid, flags := traceparentIDs(tps[i]); tid != want.trace || flags != want.flags || sid == clientSpan {
					t.Errorf("charge %d: the upstream's traceparent = %q, want trace %s, flags %s, and the proxy's span as parent",
						i, tps[i], want.trace, want.flags)
				}
			}
			// Stopped, the process has exported all it ever will.
			p.signal(syscall.SIGTERM)
			if code := p.wait(); code != 0 {
				t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
			}
			spans = rcv.Spans()
			if got := otlptest.Find(spans, func(s otlptest.Span) bool { return s.TraceID == unsampledTrace }); len(got) != 0 {
				t.Errorf("spans of the unsampled client trace were exported:\n%s", spanList(got))
			}
			roots := otlptest.Find(spans, requestSpan("TR-C2", "committed"))
			if got := len(roots) == 1; got != tt.rootsExported {
				t.Errorf("TR-C2, sent without a traceparent: %d server spans exported, want exported %v", len(roots), tt.rootsExported)
			}
		})
	}
}

// TestTracingReload: tracing off exports nothing; a SIGHUP with
// tracing.enabled: true turns it on; a SIGHUP back to false exports the
// spans still buffered (the batch delay here is a minute: only that flush
// sends them) and nothing after.
func TestTracingReload(t *testing.T) {
	t.Parallel()
	rcv := otlptest.NewHTTP(t)
	up := startStub(t)
	dir := t.TempDir()
	path, data := filepath.Join(dir, "c.yaml"), filepath.Join(dir, "data")
	p := startProxy(t, writeConfig(t, path, up.URL, data, "", chargesRoute), append(rcv.Env(), "OTEL_BSP_SCHEDULE_DELAY=60000")...)
	reload := func(extra, logged string) {
		t.Helper()
		writeConfig(t, path, up.URL, data, extra, chargesRoute)
		p.signal(syscall.SIGHUP)
		eventually(t, "the reload logs "+logged, func() bool { return len(p.log.logLines(logged)) == 1 })
	}
	wantForwarded(t, "TR-OFF1", charge(p, "TR-OFF1"))
	reload(tracingOn, "tracing on")
	wantForwarded(t, "TR-ON1", charge(p, "TR-ON1"))
	reload("tracing:\n  enabled: false\n", "tracing off")
	waitSpans(t, rcv, "span of TR-ON1, charged while tracing was on, flushed when it went off", requestSpan("TR-ON1", "committed"))
	wantForwarded(t, "TR-OFF2", charge(p, "TR-OFF2"))
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
	}
	for _, order := range []string{"TR-OFF1", "TR-OFF2"} {
		if got := otlptest.Find(rcv.Spans(), otlptest.WithAttr("idemproxy.key_hash", orderHash(order))); len(got) != 0 {
			t.Errorf("%s, charged while tracing was off, has spans:\n%s", order, spanList(got))
		}
	}
}

// TestTracingExportsNothing: tracing.enabled: true exports nothing when
// OTEL_SDK_DISABLED=true (and says so) or when the sampler keeps no
// trace; requests are served as usual, and /metrics has no exemplar.
func TestTracingExportsNothing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name             string
		env              []string
		wantLog, wantLvl string
	}{
		{"OTEL_SDK_DISABLED", []string{"OTEL_SDK_DISABLED=true"}, "tracing.enabled is true, but OTEL_SDK_DISABLED=true: no traces", "WARN"},
		{"traceidratio 0", []string{"OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=0"}, "tracing on", "INFO"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rcv := otlptest.NewHTTP(t)
			up := startStub(t)
			p := startTracedProxy(t, up.URL, append(append(rcv.Env(), "IDEMPROXY_ADMIN_TOKEN=tok"), tt.env...)...)
			first := charge(p, "TR-N1", "Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			wantForwarded(t, "TR-N1", first)
			wantReplay(t, "TR-N1's retry", charge(p, "TR-N1"), first)
			if n := chargeCount(t, up.URL, "TR-N1"); n != 1 {
				t.Errorf("TR-N1 charges = %d, want 1", n)
			}
			if ex := exemplars(t, p); len(ex) != 0 {
				t.Errorf("/metrics has exemplars %q, want none", ex)
			}
			if got := keyOrigin(t, p, "TR-N1"); got != "" {
				t.Errorf("TR-N1's record keeps the origin %q, want none (its span was not sampled)", got)
			}
			var lines []map[string]any
			eventually(t, "the access log lines of both requests", func() bool {
				lines = p.log.logLines("request")
				return len(lines) >= 2
			})
			for _, l := range lines {
				if id, ok := l["trace_id"]; ok {
					t.Errorf("an access log line has the trace_id %v of a span not sampled: %v", id, l)
				}
			}
			if l := p.log.logLines(tt.wantLog); len(l) != 1 || l[0]["level"] != tt.wantLvl {
				t.Errorf("log lines %q: %v, want one at %s\n%s", tt.wantLog, l, tt.wantLvl, p.log)
			}
			p.signal(syscall.SIGTERM)
			if code := p.wait(); code != 0 {
				t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
			}
			if n := rcv.Exports(); n != 0 {
				t.Errorf("%d exports arrived, want none:\n%s", n, spanList(rcv.Spans()))
			}
		})
	}
}

// exemplarLine is an idemproxy_request_duration_seconds bucket with an
// exemplar, in the OpenMetrics text format.
var exemplarLine = regexp.MustCompile(`^idemproxy_request_duration_seconds_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}`)

// exemplars scrapes p's /metrics in the OpenMetrics format and returns the
// trace IDs of the request-duration histogram's exemplars.
func exemplars(t *testing.T, p *proc) []string {
	t.Helper()
	r := do("GET", p.adminURL("/metrics"), "", "Accept", "application/openmetrics-text")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/openmetrics-text") {
		t.Fatalf("/metrics = %d %v, Content-Type %q; want 200 in the OpenMetrics format", r.status, r.err, r.header.Get("Content-Type"))
	}
	var ids []string
	for _, line := range strings.Split(r.body, "\n") {
		if m := exemplarLine.FindStringSubmatch(line); m != nil {
			ids = append(ids, m[1])
		}
	}
	return ids
}

// TestTracingExemplars: with tracing on, the request-duration histogram
// of /metrics (OpenMetrics) carries the trace ID of a request the
// receiver got as an exemplar.
func TestTracingExemplars(t *testing.T) {
	t.Parallel()
	rcv := otlptest.NewHTTP(t)
	up := startStub(t)
	p := startTracedProxy(t, up.URL, rcv.Env()...)
	wantForwarded(t, "TR-X1", charge(p, "TR-X1"))
	spans := waitSpans(t, rcv, "TR-X1's span", requestSpan("TR-X1", "committed"))
	server := oneSpan(t, spans, "TR-X1's span", requestSpan("TR-X1", "committed"))
	if ex := exemplars(t, p); !slices.Contains(ex, server.TraceID) {
		t.Errorf("exemplars of idemproxy_request_duration_seconds = %q, want the trace %s of TR-X1's span", ex, server.TraceID)
	}
}

// TestTracingAdminAndReconcile: an operator's reconcile of an in-doubt key
// is a server span on the admin listener, with the reconcile span under
// it and the lookup's client span under that (the upstream gets it as its
// parent); the retry's replay of the reconciled answer links to the span
// of the request that left the key in doubt; the background reconciler's
// lookup is a trace of its own; a listing, a reload and a release are
// server spans of their own; scrapes and probes are not traced.
func TestTracingAdminAndReconcile(t *testing.T) {
	t.Parallel()
	rcv := otlptest.NewHTTP(t)
	up := startTracedStub(t)
	dir := t.TempDir()
	route := `  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 1s
    lease: 1500ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 1h, interval: 1m}
  - name: orders
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    upstream_timeout: 200ms
    lease: 300ms
    reconcile: {lookup: "GET /orders/{key}/charge", grace: 400ms, interval: 200ms}
`
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), tracingOn, route),
		append(rcv.Env(), "IDEMPROXY_ADMIN_TOKEN=tok")...)
	if r := charge(p, "TR-A1", "X-Stub-Fault", "drop-after-charge"); r.status != 502 {
		t.Fatalf("TR-A1 with the answer dropped = %d %s, want 502 (in doubt)", r.status, r.body)
	}
	// The background reconciler looks TR-B1 up after its grace.
	if r := do("POST", p.url("/orders/TR-B1/charges"), `{"amount": 10}`, "X-Stub-Fault", "drop-after-charge"); r.status != 502 {
		t.Fatalf("TR-B1 with the answer dropped = %d %s, want 502 (in doubt)", r.status, r.body)
	}
	auth := []string{"Authorization", "Bearer tok", "X-Operator", "alice"}
	if r := do("POST", p.adminURL("/v1/keys/charges/TR-A1/reconcile"), "", auth...); r.status != 200 || !strings.Contains(r.body, `"applied"`) {
		t.Fatalf("reconcile = %d %s, want 200 applied", r.status, r.body)
	}
	if r := charge(p, "TR-A1"); r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotent-Reconciled") != "true" {
		t.Fatalf("TR-A1's retry = %d %s %v, want the lookup's answer replayed as reconcile.applied_status (201)", r.status, r.body, r.header)
	}
	do("GET", p.adminURL("/metrics"), "")
	do("GET", p.adminURL("/readyz"), "")
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/keys/charges"}, {"POST", "/-/reload"}, {"DELETE", "/v1/keys/charges/TR-A1"},
	} {
		if got := do(r.method, p.adminURL(r.path), "", auth...); got.status != 200 {
			t.Fatalf("%s %s = %d %s, want 200", r.method, r.path, got.status, got.body)
		}
	}

	reconcileAdmin := spanNamed("POST /v1/keys/{route}/{key}/reconcile", spanServer)
	release := spanNamed("DELETE /v1/keys/{route}/{key...}", spanServer)
	background := otlptest.All(otlptest.Named("reconcile orders"), otlptest.WithAttr("idemproxy.reconcile.result", "applied"))
	spans := waitSpans(t, rcv, "the admin and reconcile spans", reconcileAdmin, release,
		spanNamed("reconcile charges", tracepb.Span_SPAN_KIND_INTERNAL), spanNamed("GET", spanClient), background,
		requestSpan("TR-A1", "in_doubt"), requestSpan("TR-A1", "replayed"))
	admin := oneSpan(t, spans, "the reconcile's admin span", reconcileAdmin)
	checkSpanAttrs(t, "the reconcile's admin span", admin, map[string]string{
		"http.request.method": "POST", "http.route": "/v1/keys/{route}/{key}/reconcile",
		"url.path": "/v1/keys/charges/{key}/reconcile", "http.response.status_code": "200", "idemproxy.operator": "alice",
		"idemproxy.route": "charges",
	})
	rec := oneSpan(t, otlptest.ChildrenOf(spans, admin), "the reconcile span under the admin span", otlptest.Named("reconcile charges"))
	checkSpanAttrs(t, "the reconcile span", rec, map[string]string{
		"idemproxy.route": "charges", "idemproxy.key_hash": orderHash("TR-A1"), "idemproxy.reconcile.result": "applied",
		"idemproxy.reconcile.lookup_status": "200",
	})
	lookup := oneSpan(t, otlptest.ChildrenOf(spans, rec), "the lookup's client span under the reconcile span", spanNamed("GET", spanClient))
	checkSpanAttrs(t, "the lookup's span", lookup, map[string]string{
		"http.response.status_code": "200", "url.full": up.URL + "/orders/{key}/charge", // the key by its hash only
	})
	tps := up.traceparents("GET", "/orders/TR-A1/charge")
	if len(tps) != 1 {
		t.Fatalf("the upstream got %d lookups (%q), want 1", len(tps), tps)
	}
	if tid, sid, _ := traceparentIDs(tps[0]); tid != admin.TraceID || sid != lookup.SpanID {
		t.Errorf("the lookup's traceparent = %q, want trace %s, parent %s (the lookup's span)", tps[0], admin.TraceID, lookup.SpanID)
	}
	inDoubt := oneSpan(t, spans, "TR-A1's span", requestSpan("TR-A1", "in_doubt"))
	if retry := oneSpan(t, spans, "the retry's span", requestSpan("TR-A1", "replayed")); !retry.LinksTo(inDoubt) {
		t.Errorf("the replay of the reconciled answer links %v, want a link to %s-%s, the request left in doubt",
			retry.Links, inDoubt.TraceID, inDoubt.SpanID)
	}
	for _, name := range []string{"GET /v1/keys/{route}", "POST /-/reload"} {
		s := oneSpan(t, spans, "the span of "+name, spanNamed(name, spanServer))
		checkSpanAttrs(t, name, s, map[string]string{"http.response.status_code": "200", "idemproxy.operator": "alice"})
	}
	bg := oneSpan(t, spans, "the background reconcile span", background)
	checkSpanAttrs(t, "the background reconcile span", bg, map[string]string{
		"idemproxy.route": "orders", "idemproxy.key_hash": store.KeyHash(store.Key("orders", "", "TR-B1")),
	})
	if bg.ParentID != "" {
		t.Errorf("the background reconcile span %s: want a root span", bg)
	}
	bgLookup := oneSpan(t, otlptest.ChildrenOf(spans, bg), "the background lookup's client span", spanNamed("GET", spanClient))
	if tps := up.traceparents("GET", "/orders/TR-B1/charge"); len(tps) != 1 {
		t.Errorf("the upstream got %d lookups of TR-B1 (%q), want 1", len(tps), tps)
	} else if tid, sid, _ := traceparentIDs(tps[0]); tid != bg.TraceID || sid != bgLookup.SpanID {
		t.Errorf("the background lookup's traceparent = %q, want trace %s, parent %s", tps[0], bg.TraceID, bgLookup.SpanID)
	}
	del := oneSpan(t, spans, "the release's span", release)
	checkSpanAttrs(t, "the release's span", del, map[string]string{
		"http.request.method": "DELETE", "url.path": "/v1/keys/charges/{key}", "http.response.status_code": "200",
		"idemproxy.route": "charges", "idemproxy.operator": "alice",
	})
	if del.ParentID != "" || del.TraceID == admin.TraceID {
		t.Errorf("the release's span %s: want a trace of its own", del)
	}
	// The scrape and the probe, answered before the release, would have
	// been exported with it or before it.
	for _, s := range spans {
		if strings.Contains(s.Name, "/metrics") || strings.Contains(s.Name, "/readyz") {
			t.Errorf("a scrape or probe was traced: %s", s)
		}
	}
}

// TestTracingSurvivesInvalidUTF8: OTLP's strings must be UTF-8, and an
// exporter drops its whole batch when one is not; a client's path with
// %FF and a raw byte in its User-Agent arrive cleaned (U+FFFD), and the
// spans exported with them arrive too; an invented method is _OTHER.
func TestTracingSurvivesInvalidUTF8(t *testing.T) {
	t.Parallel()
	rcv := otlptest.NewHTTP(t)
	up := startStub(t)
	p := startTracedProxy(t, up.URL, rcv.Env()...)
	if r := do("GET", p.url("/orders/%FF/charges"), "", "User-Agent", "curl\xff/8"); r.err != nil || r.status == 0 {
		t.Fatalf("GET /orders/%%FF/charges: %d %v", r.status, r.err)
	}
	if r := do("BREW", p.url("/pot"), ""); r.err != nil {
		t.Fatalf("BREW /pot: %v", r.err)
	}
	wantForwarded(t, "TR-U1", charge(p, "TR-U1"))
	// Stopped, the process has exported all it ever will.
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
	}
	spans := rcv.Spans()
	odd := oneSpan(t, spans, "the span of the request with invalid UTF-8", otlptest.All(spanNamed("GET", spanServer),
		otlptest.WithAttr("url.path", "/orders/\uFFFD/charges")))
	checkSpanAttrs(t, "the span of the request with invalid UTF-8", odd, map[string]string{
		"user_agent.original": "curl\uFFFD/8", "idemproxy.outcome": "passthrough",
	})
	brew := oneSpan(t, spans, "the BREW request's span", otlptest.All(otlptest.OfKind(spanServer), otlptest.WithAttr("url.path", "/pot")))
	checkSpanAttrs(t, "the BREW request's span", brew, map[string]string{
		"http.request.method": "_OTHER", "http.request.method_original": "BREW",
	})
	oneSpan(t, spans, "TR-U1's span", requestSpan("TR-U1", "committed"))
}

// TestTracingCollectorDown: a collector that does not answer costs the
// spans only: requests are served, one warning says the export failed,
// and the proxy stops cleanly.
func TestTracingCollectorDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	up := startStub(t)
	p := startTracedProxy(t, up.URL,
		"OTEL_EXPORTER_OTLP_ENDPOINT="+down, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_EXPORTER_OTLP_TIMEOUT=300")
	first := charge(p, "TR-D1")
	wantForwarded(t, "TR-D1", first)
	wantReplay(t, "TR-D1's retry", charge(p, "TR-D1"), first)
	const warned = "tracing: spans could not be exported (at most one such line a minute)"
	eventually(t, "the export failure's warning", func() bool { return len(p.log.logLines(warned)) > 0 })
	wantForwarded(t, "TR-D2", charge(p, "TR-D2"))
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0\n%s", code, p.log)
	}
	if l := p.log.logLines(warned); len(l) != 1 || l[0]["level"] != "WARN" {
		t.Errorf("export failure lines: %v, want one warning", l)
	}
}

// TestTracingRefusesUnusableProtocol: an OTLP protocol idemproxy cannot
// export with (http/json) stops a start with tracing on, naming it, and
// fails a reload that turns tracing on, which keeps the running
// configuration: tracing stays off, requests are served.
func TestTracingRefusesUnusableProtocol(t *testing.T) {
	t.Parallel()
	const refused = `OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not supported (grpc or http/protobuf)`
	up := startStub(t)
	dir := t.TempDir()
	env := []string{"OTEL_EXPORTER_OTLP_PROTOCOL=http/json", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9", "IDEMPROXY_ADMIN_TOKEN=tok"}

	on := writeConfig(t, filepath.Join(dir, "on.yaml"), up.URL, filepath.Join(dir, "data-on"), tracingOn, chargesRoute)
	var out strings.Builder
	cmd := exec.Command(bin, "-config", on)
	cmd.Env, cmd.Stderr = append(os.Environ(), env...), &out
	err := cmd.Run()
	failed := logLinesOf(out.String(), "idemproxy failed")
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0]["err"]), refused) {
		t.Errorf("a start with tracing on: %v, want exit status 1 and %q:\n%s", err, refused, out.String())
	}
	// Refused before the store opens: a misconfigured replica writes
	// nothing to a shared store (not even an epoch marker).
	if _, err := os.Stat(filepath.Join(dir, "data-on")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused start's store directory: %v, want none: the store was opened", err)
	}

	path, data := filepath.Join(dir, "c.yaml"), filepath.Join(dir, "data")
	p := startProxy(t, writeConfig(t, path, up.URL, data, "", chargesRoute), env...)
	writeConfig(t, path, up.URL, data, tracingOn, chargesRoute)
	r := do("POST", p.adminURL("/-/reload"), "", "Authorization", "Bearer tok")
	var prob struct{ Detail string }
	if json.Unmarshal([]byte(r.body), &prob); r.status != 400 || problemType(r) != "reload-failed" || !strings.Contains(prob.Detail, refused) {
		t.Errorf("a reload turning tracing on = %d %s, want 400 reload-failed naming %q", r.status, r.body, refused)
	}
	if l := p.log.logLines("tracing on"); len(l) != 0 {
		t.Errorf("tracing went on: %v", l)
	}
	wantForwarded(t, "TR-P1", charge(p, "TR-P1"))
}
