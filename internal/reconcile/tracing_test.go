package reconcile_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/idemproxy/idemproxy/internal/reconcile"
	"github.com/idemproxy/idemproxy/internal/testenv/otlptest"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/store"
)

// tracedReconcileEnv is newReconcileEnv with the proxy tracing to a real
// OTLP/HTTP receiver, and upstream in front of the gate.
func tracedReconcileEnv(t *testing.T, upstream http.Handler) (*proxytest.Env, *reconcile.Reconciler, *otlptest.Receiver) {
	t.Helper()
	r := otlptest.NewHTTP(t)
	tr := r.Tracing(t)
	e := &proxytest.Env{T: t, Tracing: tr}
	e.Stub = httptest.NewServer(upstream)
	t.Cleanup(e.Stub.Close)
	// Credentials in the upstream's URL, which no span may show.
	e.Start(strings.Replace(e.Stub.URL, "http://", "http://idem:s3cret@", 1), reconcileRoute)
	rec, err := reconcile.New(e.Proxy.ReconcileHost(), reconcile.Options{Store: e.Store})
	if err != nil {
		t.Fatal(err)
	}
	return e, rec, r
}

func reconcileSpan(s otlptest.Span) bool { return s.Name == "reconcile charges" }

// TestReconcileSpansNameTheKeyByItsHashOnly: the lookup's URL holds the
// key (GET /orders/{key}/charge), but neither the reconcile span nor the
// lookup's client span may: a key taken from the body is never in the
// logs, and is not in the traces either (docs/observability.md); nor are
// the credentials of the upstream's URL.
func TestReconcileSpansNameTheKeyByItsHashOnly(t *testing.T) {
	const key = "R-SECRET-4111"
	e, rec, r := tracedReconcileEnv(t, newGate())
	inDoubtCharged(e, `"`+key+`"`)
	reconcileUntil(t, rec, "the key is completed", func() bool { return e.State("charges", "", key) == store.StateCompleted })
	spans := r.WaitFor(t, 10*time.Second, "the reconcile span and its lookup", func(s []otlptest.Span) bool {
		rs := otlptest.Find(s, reconcileSpan)
		return len(rs) > 0 && len(otlptest.Find(otlptest.ChildrenOf(s, rs[0]), otlptest.Named("GET"))) > 0
	})
	rs := otlptest.Find(spans, reconcileSpan)[0]
	lookups := otlptest.Find(otlptest.ChildrenOf(spans, rs), otlptest.Named("GET"))
	if len(lookups) != 1 {
		t.Fatalf("children of the reconcile span: %v, want one GET (the lookup)", otlptest.ChildrenOf(spans, rs))
	}
	if got, want := lookups[0].Attr("url.full"), e.Stub.URL+"/orders/{key}/charge"; got != want {
		t.Errorf("lookup span url.full = %q, want %q (the lookup's template, not the key)", got, want)
	}
	if got, want := rs.Attr("idemproxy.key_hash"), store.KeyHash(store.Key("charges", "", key)); got != want {
		t.Errorf("reconcile span idemproxy.key_hash = %q, want %q", got, want)
	}
	for _, secret := range []string{key, "s3cret"} {
		for _, s := range spans {
			for k, v := range s.Attrs {
				if strings.Contains(fmt.Sprint(v), secret) {
					t.Errorf("span %q: attribute %s = %q holds %q", s.Name, k, v, secret)
				}
			}
			for _, ev := range s.Events {
				for k, v := range ev.Attrs {
					if strings.Contains(fmt.Sprint(v), secret) {
						t.Errorf("span %q, event %s: attribute %s = %q holds %q", s.Name, ev.Name, k, v, secret)
					}
				}
			}
		}
	}
}

// latin1Lookup answers the first lookup with a reason phrase in ISO 8859-1
// (an upstream behind an old French gateway), written on the raw
// connection since net/http writes only its own phrases.
type latin1Lookup struct {
	*lookupGate
	done atomic.Bool
}

func (l *latin1Lookup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/charge") || l.done.Swap(true) {
		l.lookupGate.ServeHTTP(w, r)
		return
	}
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	buf.WriteString("HTTP/1.1 503 Service indisponible, r\xe9essayez\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	buf.Flush()
}

// TestReconcileSpanOfAnUpstreamsLatin1Status: a lookup answered with a
// reason phrase that is not UTF-8 still exports its span (and the other
// spans of its batch): OTLP refuses a string that is not UTF-8, and the
// exporter then drops the whole batch.
func TestReconcileSpanOfAnUpstreamsLatin1Status(t *testing.T) {
	up := &latin1Lookup{lookupGate: newGate()}
	e, rec, r := tracedReconcileEnv(t, up)
	inDoubtCharged(e, `"R-LATIN1"`)
	reconcileUntil(t, rec, "the Latin-1 lookup was answered", func() bool { return up.done.Load() })
	spans := r.WaitFor(t, 10*time.Second, "the span of the lookup answered in Latin-1", func(s []otlptest.Span) bool {
		return len(otlptest.Find(s, reconcileSpan)) > 0
	})
	rs := otlptest.Find(spans, reconcileSpan)[0]
	if got := rs.Attr("idemproxy.reconcile.result"); got != reconcile.ResultError {
		t.Errorf("reconcile span result = %q, want %q", got, reconcile.ResultError)
	}
	if rs.Status != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("reconcile span status = %v, want an error", rs.Status)
	}
}
