//go:build linux

package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"
)

// TestStageShares: a real CPU profile is read whole: every stage and
// "other" get a share, and the shares add up to the whole profile.
func TestStageShares(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the profile has samples (100 a second).
	x := 0.0
	for t0 := time.Now(); time.Since(t0) < 300*time.Millisecond; {
		x += math.Sqrt(float64(x))
	}
	pprof.StopCPUProfile()
	f.Close()
	shares, err := stageShares(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(shares) != len(stages)+1 {
		t.Fatalf("%d shares, want one per stage and other: %v", len(shares), shares)
	}
	sum := 0.0
	for _, s := range shares {
		sum += s.share
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("the shares add up to %v, want 1: %v", sum, shares)
	}
	// The test's own code is none of the proxy's stages.
	if other := shares[len(shares)-1]; other.share < 0.5 {
		t.Errorf("other: %.2f, want most of a profile of no proxy code: %v", other.share, shares)
	}
}
