package admin

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/problem"
)

// TestWriteJSONEncodeError: a value that does not encode answers 500 with
// an internal-error problem instead of panicking (errors.Unwrap of most
// encoding errors is nil) or claiming success.
func TestWriteJSONEncodeError(t *testing.T) {
	tests := []struct {
		name string
		v    any
	}{
		{"unsupported value", map[string]any{"n": math.Inf(1)}},
		{"unsupported type", map[string]any{"c": make(chan int)}},
		{"time out of range", keyView{CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeJSON(rec, httptest.NewRequest(http.MethodGet, "/v1/keys/charges/k", nil), http.StatusOK, tt.v)
			if rec.Code != http.StatusInternalServerError {
				t.Errorf("status = %d, want 500", rec.Code)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q, want application/problem+json", ct)
			}
			var got struct {
				Type   string `json:"type"`
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if want := problem.TypePrefix + "internal-error"; got.Type != want || got.Status != 500 || got.Detail == "" {
				t.Errorf("problem = %+v, want type %s, status 500 and a detail", got, want)
			}
		})
	}
}
