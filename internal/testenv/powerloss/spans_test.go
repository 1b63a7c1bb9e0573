package powerloss

import (
	"reflect"
	"testing"
)

func TestSpansMergeOverlappingAndTouchingRanges(t *testing.T) {
	tests := []struct {
		name string
		add  []span
		want spans
	}{
		{"empty range ignored", []span{{5, 5}}, nil},
		{"disjoint kept sorted", []span{{20, 30}, {0, 10}}, spans{{0, 10}, {20, 30}}},
		{"touching merged", []span{{0, 10}, {10, 20}}, spans{{0, 20}}},
		{"overlap merged", []span{{0, 10}, {5, 15}}, spans{{0, 15}}},
		{"bridge merges three", []span{{0, 10}, {20, 30}, {40, 50}, {5, 45}}, spans{{0, 50}}},
		{"inside is absorbed", []span{{0, 100}, {10, 20}}, spans{{0, 100}}},
		{"before all", []span{{50, 60}, {0, 10}, {20, 30}}, spans{{0, 10}, {20, 30}, {50, 60}}},
		{"between, touching left", []span{{0, 10}, {30, 40}, {10, 15}}, spans{{0, 15}, {30, 40}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s spans
			for _, r := range tt.add {
				s = s.add(r.off, r.end)
			}
			if !reflect.DeepEqual(s, tt.want) {
				t.Errorf("got %v, want %v", s, tt.want)
			}
		})
	}
}
