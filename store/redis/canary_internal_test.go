package redis

import "testing"

// TestKeySlot: keySlot is Redis Cluster's CLUSTER KEYSLOT, hash tags
// included.
func TestKeySlot(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int{
		"foo":            12182,
		"bar":            5061,
		"somekey":        11058,
		"{foo}.anything": 12182,
		"x{bar}y{foo}":   5061, // the first tag
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if keySlot("x{}y") != int(crc16("x{}y"))%clusterSlots {
		t.Errorf("an empty hash tag must hash the whole key")
	}
}
