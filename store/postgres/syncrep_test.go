package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestUnreplicatedWritesAreNotAcknowledged: while the synchronous standby
// is unreachable, PostgreSQL commits a write on the primary, waits for the
// standby, and when statement_timeout cancels that wait answers success
// with a warning: the write is on the primary only, and a failover loses
// it. A reservation acknowledged so would be forwarded, lost in the
// failover, and the retry charged again; so every write the standby has
// not confirmed is an error, never an acknowledgement: a write run alone,
// and every write of a batch (whose one commit waited for the standby).
func TestUnreplicatedWritesAreNotAcknowledged(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t, "synchronous_standby_names=absent", "synchronous_commit=on")
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batched"}[batch], func(t *testing.T) {
			unreplicatedWrites(t, primary, batch)
		})
	}
}

func unreplicatedWrites(t *testing.T, primary *pgtest.Server, batch bool) {
	table := map[bool]string{false: "sync", true: "sync_batched"}[batch]
	// The table and the records the writes below change are made without
	// waiting for the absent standby.
	local := newStore(t, primary, postgres.Options{Table: table, SynchronousCommit: "local"})
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	for _, k := range []string{"r/-/commit", "r/-/release", "r/-/doubt"} {
		if rec, err := local.Reserve(ctx(t), k, res); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) with synchronous_commit local = %+v, %v", k, rec, err)
		}
	}
	s := newStore(t, primary, postgres.Options{
		Table: table, SynchronousCommit: "on", StatementTimeout: 300 * time.Millisecond,
		ConnectTimeout: postgres.DefaultConnectTimeout,
	})
	if batch {
		s.AlwaysBatch()
	}
	resp := store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}
	writes := []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"Reserve", func(c context.Context) error {
			rec, err := s.Reserve(c, "r/-/new", res)
			if err == nil && rec != nil {
				t.Errorf("Reserve = %+v; want no record found", rec)
			}
			return err
		}},
		{"Commit", func(c context.Context) error { return s.Commit(c, "r/-/commit", "t", resp, time.Hour) }},
		{"Release", func(c context.Context) error { return s.Release(c, "r/-/release", "t") }},
		{"MarkInDoubt", func(c context.Context) error { return s.MarkInDoubt(c, "r/-/doubt", "t", time.Hour) }},
	}
	// Batched, the writes are made at once: the first goes alone (in a
	// batch of its own), the others queue behind it and share one batch.
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		if !batch {
			errs[i] = call(t, w.name, w.f)
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = call(t, w.name, w.f) }()
	}
	wg.Wait()
	for i, w := range writes {
		if errs[i] == nil {
			t.Errorf("%s with the synchronous standby unreachable = nil error; want an error (the write is not replicated)", w.name)
		}
	}
	// The proxy takes a failed reservation back (its release fails the
	// same way, but is applied on the primary): the key is free there, not
	// in flight and then in doubt for a request never forwarded.
	if err := call(t, "Release", func(c context.Context) error { return s.Release(c, "r/-/new", "t") }); err == nil {
		t.Errorf("Release of the failed reservation = nil error; want an error (not replicated)")
	}
	if rec, err := local.Reserve(ctx(t), "r/-/new", store.Reservation{Token: "retry", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Errorf("Reserve of the key whose failed reservation was taken back = %+v, %v; want nil, nil", rec, err)
	}
}
