package badger_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/store/badger"
)

// TestManyStaleLookupsDoNotBreakTheStore: an operator who releases a few
// thousand in-doubt keys after an incident leaves as many due entries in
// the lookup index. DueLookups deletes them, and must do so in writes that
// fit a Badger transaction: one write for all of them failed with "Txn is
// too big" on every pass, which broke the guarded store (503s, a reopen,
// again at the next pass) and stopped every lookup until the entries
// expired.
func TestManyStaleLookupsDoNotBreakTheStore(t *testing.T) {
	t.Parallel()
	g := openGuarded(t, t.TempDir(), badger.GuardOptions{})
	ctx := context.Background()
	const n = 3000
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			k := fmt.Sprintf("r/-/released-%d", i)
			if _, err := g.Reserve(ctx, k, res); err != nil {
				t.Error(err)
				return
			}
			if err := g.MarkInDoubt(ctx, k, res.Token, res.TTL); err != nil {
				t.Error(err)
			}
			if err := g.ScheduleLookup(ctx, k, 0); err != nil {
				t.Error(err)
			}
			if err := g.Release(ctx, k, res.Token); err != nil { // the operator's release
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	const live = "r/-/live"
	if _, err := g.Reserve(ctx, live, res); err != nil {
		t.Fatal(err)
	}
	if err := g.MarkInDoubt(ctx, live, res.Token, res.TTL); err != nil {
		t.Fatal(err)
	}
	if err := g.ScheduleLookup(ctx, live, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the live key's lookup is due", func() bool {
		keys, err := g.DueLookups(ctx, 100)
		if err != nil {
			t.Fatalf("DueLookups: %v", err)
		}
		return slices.Contains(keys, live)
	})
	if err := g.Ping(ctx); err != nil {
		t.Errorf("Ping after DueLookups: %v", err)
	}
}
