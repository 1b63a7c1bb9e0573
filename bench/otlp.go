//go:build unix

package main

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Tracing targets.
//
// badger-sync-trace and badger-sync-trace1 are badger-sync with
// tracing.enabled, each exporting its spans over OTLP/HTTP (protobuf) to a
// receiver of its own: this command run with -otlp-listen, a process apart,
// so that what receiving costs is not counted in the proxy's CPU. The
// receiver counts the export requests, their bytes, and the spans in them
// (walking the protobuf wire format, without decoding the spans); after the
// measurements, each tracing proxy is stopped (it exports the spans it
// still holds as it stops) and reportTraces prints what its receiver got.

// traceSamplers are the tracing targets and the OTEL_* sampler variables
// each is started with.
var traceSamplers = map[string][]string{
	"badger-sync-trace":  {"OTEL_TRACES_SAMPLER=always_on"},
	"badger-sync-trace1": {"OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.01"},
}

// isTraced says whether a target name is one of the tracing targets.
func isTraced(name string) bool { _, ok := traceSamplers[name]; return ok }

// otlpStats is what a receiver got.
type otlpStats struct {
	Exports     int64 `json:"exports"`      // POST /v1/traces requests answered 200
	Bytes       int64 `json:"bytes"`        // their bodies, as sent (compressed or not)
	Spans       int64 `json:"spans"`        // spans in them
	ServerSpans int64 `json:"server_spans"` // of which of kind server: one per traced request
	Bad         int64 `json:"bad"`          // requests refused: not a POST, unreadable, not OTLP
}

// serveOTLP is the receiver: POST /v1/traces counts an export (OTLP/HTTP,
// protobuf, gzip or not) and answers an empty ExportTraceServiceResponse;
// GET /stats answers the counts so far as JSON.
func serveOTLP(listen string) {
	var (
		mu sync.Mutex
		st otlpStats
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/traces", func(w http.ResponseWriter, r *http.Request) {
		spans, server, n, err := readExport(r)
		mu.Lock()
		if err != nil {
			st.Bad++
		} else {
			st.Exports++
			st.Bytes += n
			st.Spans += spans
			st.ServerSpans += server
		}
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty message: every span accepted
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		s := st
		mu.Unlock()
		json.NewEncoder(w).Encode(s)
	})
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

// readExport reads one OTLP/HTTP export request and counts its spans; n is
// the body's size as sent.
func readExport(r *http.Request) (spans, server, n int64, err error) {
	if r.Method != http.MethodPost {
		return 0, 0, 0, fmt.Errorf("%s: want POST", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return 0, 0, 0, fmt.Errorf("content type %q: want application/x-protobuf", ct)
	}
	cr := &countingReader{r: r.Body}
	var body io.Reader = cr
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(cr)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("gzip: %w", err)
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read the export: %w", err)
	}
	spans, server, err = countSpans(b)
	return spans, server, cr.n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// The field numbers countSpans follows (opentelemetry/proto/collector/trace/v1
// and trace/v1): ExportTraceServiceRequest.resource_spans,
// ResourceSpans.scope_spans, ScopeSpans.spans, Span.kind.
const (
	fieldResourceSpans = 1
	fieldScopeSpans    = 2
	fieldSpans         = 2
	fieldSpanKind      = 6
	spanKindServer     = 2
)

// countSpans counts the spans in an ExportTraceServiceRequest, and those
// of kind server, by walking the protobuf wire format: every other field
// is skipped, not decoded.
func countSpans(b []byte) (spans, server int64, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != fieldResourceSpans || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num != fieldScopeSpans || typ != protowire.BytesType {
				return nil
			}
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != fieldSpans || typ != protowire.BytesType {
					return nil
				}
				spans++
				return eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
					if num == fieldSpanKind && typ == protowire.VarintType && x == spanKindServer {
						server++
					}
					return nil
				})
			})
		})
	})
	return spans, server, err
}

// eachField calls f with each field of the protobuf message b (OTLP's, a
// CPU profile's: budget.go): a length-delimited field's bytes in v, a
// varint's value in x (other types get neither).
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("not a protobuf message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("not a protobuf message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// fetchOTLPStats asks the receiver at addr what it got.
func fetchOTLPStats(addr string) (otlpStats, error) {
	resp, err := getOK("http://" + addr + "/stats")
	if err != nil {
		return otlpStats{}, fmt.Errorf("receiver stats: %w", err)
	}
	defer resp.Body.Close()
	var s otlpStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return otlpStats{}, fmt.Errorf("receiver stats: %w", err)
	}
	return s, nil
}

// reportTraces stops each tracing target (the measurements are done: it
// exports the spans it still holds as it stops) and prints what its
// receiver got, against the requests the target was sent.
func reportTraces(w io.Writer, ps *procSet, ts []*target) error {
	first := true
	var errs []error
	for _, t := range ts {
		if t.otlp == "" {
			continue
		}
		ps.stopOne(t.cmd)
		s, err := fetchOTLPStats(t.otlp)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.name, err))
			continue
		}
		if first {
			fmt.Fprintln(w, "traces, as each tracing target's OTLP/HTTP receiver got them (the target stopped, its last spans flushed):")
			first = false
		}
		perReq := 0.0
		if t.sent > 0 {
			perReq = float64(s.ServerSpans) / float64(t.sent)
		}
		fmt.Fprintf(w, "  %s (%s): %d requests sent, %d traced (%.3f a request), %d spans in %d exports, %.1f MiB",
			t.name, strings.Join(traceSamplers[baseName(t.name)], " "), t.sent, s.ServerSpans, perReq, s.Spans, s.Exports, mib(s.Bytes))
		if s.Bad > 0 {
			fmt.Fprintf(w, ", %d exports refused", s.Bad)
		}
		fmt.Fprintln(w)
	}
	return errors.Join(errs...)
}

// baseName is a target's name without its @N suffix (a prefilled twin's).
func baseName(name string) string {
	n, _, _ := strings.Cut(name, "@")
	return n
}
