package app

import (
	"slices"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestKeysMovedByNormalize: a reload that changes a route's key.normalize
// is logged as a key change (keys stored in another spelling are no longer
// found under the new rule), and one that leaves it alone is not.
func TestKeysMovedByNormalize(t *testing.T) {
	route := func(normalize string) *config.Config {
		return &config.Config{Routes: []config.Route{{Name: "charges",
			Key: config.Key{Header: "Idempotency-Key", Normalize: normalize}}}}
	}
	for _, tc := range []struct {
		old, new string
		moved    bool
	}{
		{config.NormalizeNone, config.NormalizeNFC, true},
		{config.NormalizeNFC, config.NormalizeNone, true},
		{config.NormalizeNFC, config.NormalizeNFC, false},
		{config.NormalizeNone, config.NormalizeNone, false},
	} {
		got := keysMoved(route(tc.old), route(tc.new))
		if slices.Contains(got, "charges") != tc.moved {
			t.Errorf("normalize %s → %s: keysMoved = %v, want moved %v", tc.old, tc.new, got, tc.moved)
		}
	}
}
