package admin

import (
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/internal/statuswriter"
	"github.com/idemproxy/idemproxy/internal/tracing"
)

// tracedPattern reports whether requests to the endpoint pattern are
// traced: the operators' actions (the key API, accept-loss, reload), not
// the scrapes and probes that arrive every few seconds.
func tracedPattern(pattern string) bool {
	_, path, _ := strings.Cut(pattern, " ")
	return strings.HasPrefix(path, "/v1/") || path == "/-/reload"
}

// consoleActs are the console's acts, traced like the key API's (its
// pages are not: they only read).
var consoleActs = map[string]bool{"/ui/reconcile": true, "/ui/release": true, "/ui/bulk-release": true}

// serveTraced serves r under a server span of its own while tracing is on
// and the endpoint pattern is an operator's action; it reports whether it
// did.
func (h *Handler) serveTraced(w http.ResponseWriter, r *http.Request, pattern string) bool {
	tr := h.opts.Tracing.Tracer()
	if tr == nil {
		return false
	}
	_, route, _ := strings.Cut(pattern, " ")
	switch {
	case pattern == "/ui/" && r.Method == http.MethodPost && consoleActs[r.URL.Path]:
		route = r.URL.Path
	case !tracedPattern(pattern):
		return false
	case pattern == http.MethodPost+" "+keyPattern:
		route = reconcileRoute // the one POST a key's path takes (postKey)
	}
	ctx := tracing.Extract(r.Context(), r.Header)
	ctx, span := tr.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(route)))
	defer span.End()
	sw := &statuswriter.Writer{ResponseWriter: w}
	rc := r.WithContext(ctx)
	h.mux.ServeHTTP(sw, rc)
	if sw.Status == 0 {
		sw.Status = http.StatusOK
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(sw.Status), semconv.URLPath(tracing.Text(spanPath(rc, route))))
	if route := rc.PathValue("route"); route != "" {
		span.SetAttributes(tracing.AttrRoute.String(tracing.Text(route)))
	}
	// A console act's operator is its session's (console.act): an
	// X-Operator the request carries names no one there.
	if op := r.Header.Get("X-Operator"); op != "" && pattern != "/ui/" {
		span.SetAttributes(tracing.AttrOperator.String(tracing.Text(op[:min(len(op), 256)]))) // as sent, before the token was checked
	}
	if sw.Status >= 500 {
		span.SetStatus(codes.Error, "")
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(sw.Status)))
	}
	return true
}

// spanPath is the url.path of r's span, served by the endpoint whose
// pattern's path is route: the path as sent, but a key in it (the key
// API's {key}) is left as the placeholder, since the traces, as the audit
// log, name a key only by its hash.
func spanPath(r *http.Request, route string) string {
	if !strings.Contains(route, "{key") {
		return r.URL.Path
	}
	return strings.NewReplacer("{route}", r.PathValue("route"), "{key...}", "{key}").Replace(route)
}
