package admin

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWriteJSONEncodeError: a value that does not encode answers 500 with
// a JSON error instead of panicking (errors.Unwrap of most encoding errors
// is nil) or claiming success.
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
			writeJSON(rec, http.StatusOK, tt.v)
			if rec.Code != http.StatusInternalServerError {
				t.Errorf("status = %d, want 500", rec.Code)
			}
			var got map[string]string
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got["error"] == "" {
				t.Errorf("body = %q (%v), want a JSON error", rec.Body, err)
			}
		})
	}
}
