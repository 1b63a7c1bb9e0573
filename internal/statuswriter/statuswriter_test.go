package statuswriter_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemproxy/idemproxy/internal/statuswriter"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing written", func(http.ResponseWriter) {}, 0},
		{"a body alone", func(w http.ResponseWriter) { w.Write([]byte("ok")) }, 200},
		{"a final status", func(w http.ResponseWriter) { w.WriteHeader(502) }, 502},
		{"the first final status", func(w http.ResponseWriter) { w.WriteHeader(201); w.WriteHeader(500) }, 201},
		{"after 103 Early Hints", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(201) }, 201},
		{"after 100 Continue, a body", func(w http.ResponseWriter) { w.WriteHeader(100); w.Write([]byte("ok")) }, 200},
		{"101 Switching Protocols", func(w http.ResponseWriter) { w.WriteHeader(101) }, 101},
	} {
		rec := httptest.NewRecorder()
		sw := &statuswriter.Writer{ResponseWriter: rec}
		tc.write(sw)
		if sw.Status != tc.want {
			t.Errorf("%s: Status = %d, want %d", tc.name, sw.Status, tc.want)
		}
	}
}

// TestReachesTheConnection: a handler behind the Writer can still flush
// (a streamed pass-through answer depends on it).
func TestReachesTheConnection(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := &statuswriter.Writer{ResponseWriter: rec}
	if err := http.NewResponseController(sw).Flush(); err != nil {
		t.Fatalf("Flush through the Writer: %v", err)
	}
	if !rec.Flushed {
		t.Error("the recorder was not flushed")
	}
}
