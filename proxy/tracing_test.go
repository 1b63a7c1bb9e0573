package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/idemproxy/idemproxy/internal/testenv/otlptest"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// tracedEnv starts the stub, behind a recorder of the traceparent headers
// it gets, and a proxy of routes tracing to a real OTLP/HTTP receiver.
func tracedEnv(t *testing.T, routes string) (*proxytest.Env, *otlptest.Receiver, *parents) {
	e, r, seen, _ := tracedEnvLog(t, routes)
	return e, r, seen
}

// tracedEnvLog is tracedEnv that also returns the proxy's log.
func tracedEnvLog(t *testing.T, routes string) (*proxytest.Env, *otlptest.Receiver, *parents, *lockedBuffer) {
	t.Helper()
	r := otlptest.NewHTTP(t)
	tr := r.Tracing(t)
	seen := &parents{}
	h := stub.New(slog.New(slog.DiscardHandler))
	log := &lockedBuffer{}
	e := &proxytest.Env{T: t, Tracing: tr, Log: log}
	e.Stub = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		seen.add(req.Header.Get("traceparent"))
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, routes)
	return e, r, seen, log
}

// lockedBuffer is a log written by the proxy's requests and read by the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// parents are the traceparent headers the upstream got.
type parents struct {
	mu   sync.Mutex
	list []string
}

func (p *parents) add(s string) { p.mu.Lock(); p.list = append(p.list, s); p.mu.Unlock() }
func (p *parents) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.list...)
}

// serverSpans returns the proxy's server spans among spans, in the order
// received.
func serverSpans(spans []otlptest.Span) []otlptest.Span {
	return otlptest.Find(spans, func(s otlptest.Span) bool { return s.Kind == tracepb.Span_SPAN_KIND_SERVER })
}

func nServers(n int) func([]otlptest.Span) bool {
	return func(s []otlptest.Span) bool { return len(serverSpans(s)) >= n }
}

const tracedRoute = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
`

// TestTraceOfAChargeAndItsReplay: the charge's span tree (server span,
// store spans and the upstream's client span under it, the upstream
// continuing the client span), and the replay's link to the charge's span.
func TestTraceOfAChargeAndItsReplay(t *testing.T) {
	e, r, seen, log := tracedEnvLog(t, tracedRoute)
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-TR"`, 5, "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), 201, "")
	replay := e.Charge(`"ORD-TR"`, 5)
	if !replay.Replayed() {
		t.Fatalf("retry: %v, want a replay", replay)
	}
	spans := r.WaitFor(t, 10*time.Second, "two server spans", nServers(2))
	servers := serverSpans(spans)
	charge, again := servers[0], servers[1] // by arrival: the charge ended first
	if charge.Attr("idemproxy.outcome") == "replayed" {
		charge, again = again, charge
	}

	wantKeyHash := store.KeyHash(store.Key("charges", "", "ORD-TR"))
	for _, c := range []struct{ attr, want string }{
		{"http.request.method", "POST"},
		{"http.route", "/charges"},
		{"url.path", "/charges"},
		{"http.response.status_code", "201"},
		{"idemproxy.route", "charges"},
		{"idemproxy.key_hash", wantKeyHash},
		{"idemproxy.policy", "reserve-then-commit"},
		{"idemproxy.store", "badger"},
		{"idemproxy.outcome", "committed"},
		{"idemproxy.replayed", "false"},
	} {
		if got := charge.Attr(c.attr); got != c.want {
			t.Errorf("charge span %s = %q, want %q", c.attr, got, c.want)
		}
	}
	if charge.Name != "POST /charges" {
		t.Errorf("charge span name = %q, want %q", charge.Name, "POST /charges")
	}
	if charge.TraceID != "0af7651916cd43dd8448eb211c80319c" || charge.ParentID != "b7ad6b7169203331" {
		t.Errorf("charge span trace, parent = %s, %s; want the client's traceparent continued", charge.TraceID, charge.ParentID)
	}
	children := otlptest.ChildrenOf(spans, charge)
	var names []string
	var client otlptest.Span
	for _, c := range children {
		names = append(names, c.Name)
		if c.Kind == tracepb.Span_SPAN_KIND_CLIENT && c.Name == "POST" {
			client = c
		}
	}
	for _, want := range []string{"store reserve", "store commit", "POST"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Errorf("children of the charge span = %v, want %q among them", names, want)
		}
	}
	if client.SpanID == "" {
		t.Fatalf("no client span under the charge span: %v", names)
	}
	if got := client.Attr("http.response.status_code"); got != "201" {
		t.Errorf("client span status = %q, want 201", got)
	}
	wantParent := "00-" + charge.TraceID + "-" + client.SpanID + "-01"
	if got := seen.all(); len(got) != 1 || got[0] != wantParent {
		t.Errorf("upstream got traceparent %v, want [%s] (the proxy's client span)", got, wantParent)
	}
	for _, c := range children {
		if strings.HasPrefix(c.Name, "store ") && c.Attr("db.system.name") != "badger" {
			t.Errorf("%s: db.system.name = %q, want badger", c.Name, c.Attr("db.system.name"))
		}
	}

	if got := again.Attr("idemproxy.replayed"); got != "true" {
		t.Errorf("replay span idemproxy.replayed = %q, want true", got)
	}
	if len(again.Links) != 1 || again.Links[0].TraceID != charge.TraceID || again.Links[0].SpanID != charge.SpanID {
		t.Errorf("replay span links = %+v, want one to the charge's span %s/%s", again.Links, charge.TraceID, charge.SpanID)
	}
	wantLine := `"key_hash":"` + wantKeyHash + `","trace_id":"` + charge.TraceID + `"`
	proxytest.Eventually(t, "the access log line names the charge's trace", func() bool { return strings.Contains(log.String(), wantLine) })
	if again.TraceID == charge.TraceID {
		t.Errorf("the replay continued the charge's trace %s; it is a request of its own", charge.TraceID)
	}
}

// TestTraceEvents: a key left in doubt, a fingerprint mismatch and a wait
// for an in-flight twin each mark the span.
func TestTraceEvents(t *testing.T) {
	e, r, _ := tracedEnv(t, `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 300ms
    lease: 2s
  - name: waits
    match: POST /orders/{id}/charges
    key: {path: id}
    concurrent: wait
    wait_timeout: 5s
`)
	e.Fault("delay", 1, "1s")
	proxytest.WantStatus(t, "late", e.Charge(`"ORD-EV"`, 1), http.StatusGatewayTimeout, "upstream-timeout")
	proxytest.WantStatus(t, "mismatch", e.Charge(`"ORD-EV"`, 2), http.StatusUnprocessableEntity, "fingerprint-mismatch")
	spans := r.WaitFor(t, 10*time.Second, "two server spans", nServers(2))
	byOutcome := map[string]otlptest.Span{}
	for _, s := range serverSpans(spans) {
		byOutcome[s.Attr("idemproxy.outcome")] = s
	}
	if s := byOutcome["in_doubt"]; !s.HasEvent(tracing.EventInDoubt) {
		t.Errorf("in-doubt span %v: no %s event", s, tracing.EventInDoubt)
	}
	mm, ok := byOutcome["mismatch"]
	if !ok || !mm.HasEvent(tracing.EventFingerprintMismatch) {
		t.Errorf("mismatch span %v: no %s event", mm, tracing.EventFingerprintMismatch)
	}
	if d := byOutcome["in_doubt"]; len(mm.Links) != 1 || mm.Links[0].SpanID != d.SpanID {
		t.Errorf("mismatch span links = %+v, want one to the span that forwarded the key (%s)", mm.Links, d.SpanID)
	}

	e.Fault("delay", 1, "400ms")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.Do("POST", "/orders/ORD-W/charges", `{"amount":1}`) }()
	time.Sleep(100 * time.Millisecond) // the first holds the key
	twin := e.Do("POST", "/orders/ORD-W/charges", `{"amount":1}`)
	wg.Wait()
	if !twin.Replayed() {
		t.Fatalf("twin: %v, want the first's answer replayed after waiting", twin)
	}
	spans = r.WaitFor(t, 10*time.Second, "the waiting twin's span", func(s []otlptest.Span) bool {
		return len(otlptest.Find(s, func(s otlptest.Span) bool { return s.HasEvent(tracing.EventWait) })) > 0
	})
	w := otlptest.Find(spans, func(s otlptest.Span) bool { return s.HasEvent(tracing.EventWait) })[0]
	if !w.HasEvent(tracing.EventWaitEnd) || w.Attr("idemproxy.outcome") != "replayed" {
		t.Errorf("waiting span %v: want %s and %s events, outcome replayed", w, tracing.EventWait, tracing.EventWaitEnd)
	}
	// The wait's polls (every 100 ms, up to wait_timeout) are the two
	// events, not a span each: a client's twins must not multiply its
	// spans by the dozen and crowd out everyone else's in the export queue.
	if polls := otlptest.Find(otlptest.ChildrenOf(r.Spans(), w), otlptest.Named("store get")); len(polls) != 0 {
		t.Errorf("waiting span has %d store get spans, want none (its polls are its wait events)", len(polls))
	}
}

// TestTracingOffAddsNothing: with tracing off the upstream gets the
// client's traceparent as sent, and nothing is exported.
func TestTracingOffAddsNothing(t *testing.T) {
	r := otlptest.NewHTTP(t)
	r.Setenv(t)
	seen := &parents{}
	h := stub.New(slog.New(slog.DiscardHandler))
	e := &proxytest.Env{T: t, Tracing: tracing.New(nil)} // never configured: off
	e.Stub = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		seen.add(req.Header.Get("traceparent"))
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(e.Stub.Close)
	e.Start(e.Stub.URL, tracedRoute)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-OFF"`, 1, "traceparent", tp), 201, "")
	if got := seen.all(); len(got) != 1 || got[0] != tp {
		t.Errorf("upstream got traceparent %v, want the client's %s untouched", got, tp)
	}
	if n := r.Exports(); n != 0 {
		t.Errorf("%d exports with tracing off, want 0", n)
	}
}

// TestExemplars: a sampled request's duration carries its trace ID as an
// exemplar.
func TestExemplars(t *testing.T) {
	e, r, _ := tracedEnv(t, tracedRoute)
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-EX"`, 1), 201, "")
	spans := r.WaitFor(t, 10*time.Second, "a server span", nServers(1))
	want := serverSpans(spans)[0].TraceID
	if got := exemplarTraceIDs(t, e.Registry, "idemproxy_request_duration_seconds"); !strings.Contains(strings.Join(got, ","), want) {
		t.Errorf("exemplar trace IDs %v, want %s among them", got, want)
	}
}

func exemplarTraceIDs(t *testing.T, reg prometheus.Gatherer, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				ids = append(ids, labelsOf(b.GetExemplar())...)
			}
		}
	}
	return ids
}

func labelsOf(ex *dto.Exemplar) []string {
	var out []string
	for _, l := range ex.GetLabel() {
		if l.GetName() == "trace_id" {
			out = append(out, l.GetValue())
		}
	}
	return out
}

// TestTracesSurviveHostileInput: a path with an invalid UTF-8 byte, such a
// User-Agent and an invented method must not cost the batch its spans
// (OTLP refuses a string that is not UTF-8, and drops the whole export):
// they are exported with U+FFFD, and an unknown method is _OTHER, so
// clients cannot grow span names without bound.
func TestTracesSurviveHostileInput(t *testing.T) {
	e, r, _ := tracedEnv(t, tracedRoute)
	req, _ := http.NewRequest("GET", e.Server.URL+"/statement%ff", nil)
	req.Header.Set("User-Agent", "curl\xff")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	req, _ = http.NewRequest("BREW", e.Server.URL+"/pot", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-UTF"`, 1), 201, "")
	spans := r.WaitFor(t, 10*time.Second, "three server spans", nServers(3))
	byPath := map[string]otlptest.Span{}
	for _, s := range serverSpans(spans) {
		byPath[s.Attr("url.path")] = s
	}
	bad, ok := byPath["/statement\uFFFD"]
	if !ok {
		t.Fatalf("no span with url.path %q among %v", "/statement\uFFFD", serverSpans(spans))
	}
	if got := bad.Attr("user_agent.original"); got != "curl\uFFFD" {
		t.Errorf("user_agent.original = %q, want %q", got, "curl\uFFFD")
	}
	brew := byPath["/pot"]
	if brew.Name != "HTTP" || brew.Attr("http.request.method") != "_OTHER" || brew.Attr("http.request.method_original") != "BREW" {
		t.Errorf("invented method's span: name %q, method %q, original %q; want HTTP, _OTHER, BREW",
			brew.Name, brew.Attr("http.request.method"), brew.Attr("http.request.method_original"))
	}
}

// TestTracingTurnedOffAndOnMidRequest: a reload that turns tracing off
// while a charge is at the upstream, and on again, changes nothing a
// client gets: the charge is committed once, its retries are replayed,
// and the retry traced after tracing came back links to the charge's span.
func TestTracingTurnedOffAndOnMidRequest(t *testing.T) {
	e, r, seen := tracedEnv(t, tracedRoute)
	e.Fault("delay", 1, "300ms")
	done := make(chan proxytest.Answer, 1)
	go func() { done <- e.Charge(`"ORD-RELOAD"`, 7) }()
	// The stub saw the fault's request, then the charge's.
	proxytest.Eventually(t, "the charge is at the upstream", func() bool { return len(seen.all()) == 2 })
	if err := e.Tracing.Configure(false); err != nil {
		t.Fatal(err)
	}
	proxytest.WantStatus(t, "charge", <-done, http.StatusCreated, "")
	if a := e.Charge(`"ORD-RELOAD"`, 7); !a.Replayed() {
		t.Fatalf("retry with tracing off: %v, want a replay", a)
	}
	if err := e.Tracing.Configure(true); err != nil {
		t.Fatal(err)
	}
	if a := e.Charge(`"ORD-RELOAD"`, 7); !a.Replayed() {
		t.Fatalf("retry with tracing on again: %v, want a replay", a)
	}
	if got := e.Charges("ORD-RELOAD"); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	spans := r.WaitFor(t, 10*time.Second, "the charge's span and the last retry's", nServers(2))
	var charge, retry otlptest.Span
	for _, s := range serverSpans(spans) {
		switch s.Attr("idemproxy.outcome") {
		case "committed":
			charge = s
		case "replayed":
			retry = s
		}
	}
	if charge.SpanID == "" || len(retry.Links) != 1 || retry.Links[0].SpanID != charge.SpanID {
		t.Errorf("retry's links = %+v, want one to the charge's span %q", retry.Links, charge.SpanID)
	}
}

// TestLongHeadersCannotSinkABatch: a client's long User-Agent (the proxy
// takes headers of up to 64 KiB) is cut in the spans, and its tracestate,
// which every span of the trace carries, cut to the W3C's 512 characters,
// so that a few dozen such requests do not make an export larger than a
// collector takes (an OTLP/gRPC receiver's 4 MiB by default), which would
// lose the spans of everyone else in the batch.
func TestLongHeadersCannotSinkABatch(t *testing.T) {
	var members []string
	for i := range 32 { // the most a tracestate may have, each the longest
		members = append(members, fmt.Sprintf("k%0255d=%s", i, strings.Repeat("v", 256)))
	}
	for _, tc := range []struct {
		name   string
		header []string
		check  func(t *testing.T, s otlptest.Span)
	}{
		{"user agent", []string{"User-Agent", strings.Repeat("A", 60<<10)}, func(t *testing.T, s otlptest.Span) {
			if got := len(s.Attr("user_agent.original")); got > tracing.AttributeValueLengthLimit {
				t.Errorf("user_agent.original of %d bytes, want at most %d", got, tracing.AttributeValueLengthLimit)
			}
		}},
		{"tracestate", []string{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate", strings.Join(members, ",")},
			func(t *testing.T, s otlptest.Span) {
				if s.TraceID != "0af7651916cd43dd8448eb211c80319c" {
					t.Errorf("span of trace %s, want the caller's", s.TraceID)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := otlptest.NewGRPC(t)
			r.Setenv(t)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // one export, at Shutdown
			tr := tracing.New(nil)
			if err := tr.Configure(true); err != nil {
				t.Fatal(err)
			}
			e := &proxytest.Env{T: t, Tracing: tr}
			e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
			t.Cleanup(e.Stub.Close)
			e.Start(e.Stub.URL, tracedRoute)
			const n = 80
			for i := range n {
				proxytest.WantStatus(t, "charge", e.Charge(fmt.Sprintf(`"ORD-LONG-%d"`, i), 1, tc.header...), http.StatusCreated, "")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tr.Shutdown(ctx); err != nil {
				t.Fatalf("flushing the spans of %d requests: %v", n, err)
			}
			spans := serverSpans(r.Spans())
			if len(spans) != n {
				t.Fatalf("%d server spans exported, want %d", len(spans), n)
			}
			tc.check(t, spans[0])
		})
	}
}

// TestUnsampledRequests: a request the sampler drops is served as any
// other, exports nothing, keeps no origin in its record (a link would name
// a span no backend has), and the upstream still gets a trace context,
// marked not sampled, so that its own spans follow the decision.
func TestUnsampledRequests(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	e, r, seen := tracedEnv(t, tracedRoute)
	proxytest.WantStatus(t, "charge", e.Charge(`"ORD-UNS"`, 1), 201, "")
	if !e.Charge(`"ORD-UNS"`, 1).Replayed() {
		t.Fatal("retry not replayed")
	}
	rec, err := e.Store.Get(t.Context(), store.Key("charges", "", "ORD-UNS"))
	if err != nil || rec == nil || rec.Origin != "" {
		t.Errorf("record %+v, %v; want one without an origin", rec, err)
	}
	got := seen.all()
	if len(got) != 1 || !strings.HasPrefix(got[0], "00-") || !strings.HasSuffix(got[0], "-00") {
		t.Errorf("upstream got traceparent %v, want one not sampled (-00)", got)
	}
	e.Tracing.Shutdown(t.Context()) // flushes whatever was recorded
	if n := r.Exports(); n != 0 {
		t.Errorf("%d exports of requests the sampler dropped, want 0", n)
	}
}

// TestUpstreamGetsOnlyTheProxysTracestate: the upstream gets the
// tracestate of the trace context the proxy sends it, the one it cut, not
// the client's as it came: a client's 16 KiB of tracestate, every member
// longer than the W3C's 128 characters (cut to none), would reach every
// span of an upstream traced too; and a tracestate sent with a traceparent
// the proxy could not read belongs to no trace the upstream gets.
func TestUpstreamGetsOnlyTheProxysTracestate(t *testing.T) {
	var long []string
	for i := range 32 {
		long = append(long, fmt.Sprintf("k%0255d=%s", i, strings.Repeat("v", 256)))
	}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tests := []struct {
		name        string
		sampler     string
		traceparent string
		tracestate  string
		want        string
	}{
		{name: "a short tracestate", traceparent: parent, tracestate: "vendor=abc", want: "vendor=abc"},
		{name: "every member too long", traceparent: parent, tracestate: strings.Join(long, ","), want: ""},
		{name: "every member too long, not sampled", sampler: "always_off", traceparent: parent, tracestate: strings.Join(long, ","), want: ""},
		{name: "an unreadable traceparent", traceparent: "00-zz-b7ad6b7169203331-01", tracestate: "vendor=abc", want: ""},
		{name: "no traceparent", tracestate: "vendor=abc", want: ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.sampler != "" {
				t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			}
			r := otlptest.NewHTTP(t)
			var mu sync.Mutex
			var got []string
			h := stub.New(slog.New(slog.DiscardHandler))
			e := &proxytest.Env{T: t, Tracing: r.Tracing(t)}
			e.Stub = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				mu.Lock()
				got = append(got, req.Header.Get("tracestate"))
				mu.Unlock()
				h.ServeHTTP(w, req)
			}))
			t.Cleanup(e.Stub.Close)
			e.Start(e.Stub.URL, tracedRoute)
			var hdr []string
			if tc.traceparent != "" {
				hdr = append(hdr, "traceparent", tc.traceparent)
			}
			hdr = append(hdr, "tracestate", tc.tracestate)
			proxytest.WantStatus(t, "charge", e.Charge(fmt.Sprintf(`"ORD-TS-%d"`, i), 1, hdr...), http.StatusCreated, "")
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 {
				t.Fatalf("the upstream got %d requests, want 1", len(got))
			}
			if got[0] != tc.want {
				t.Errorf("the upstream got a tracestate of %d bytes %.60q, want %q", len(got[0]), got[0], tc.want)
			}
		})
	}
}
