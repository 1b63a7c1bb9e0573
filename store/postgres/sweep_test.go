package postgres_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// churnKeys is how many keys one churn cycle reserves and commits.
const churnKeys = 2000

// churn writes churnKeys records (reserved, then committed with a small
// answer) that expire after ttl, waits until they have, and sweeps them.
func churn(tb testing.TB, s *postgres.Store, cycle int, ttl time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp := store.Response{Status: 201, Body: make([]byte, 200), BodyStored: true}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < churnKeys; i += 8 {
				key := fmt.Sprintf("churn/-/%d-%d", cycle, i)
				// The reservation outlives its commit however slow the
				// machine; the commit's ttl is what expires the record.
				rec, err := s.Reserve(ctx, key, store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
				if err == nil && rec != nil {
					err = fmt.Errorf("reserve %s found %+v", key, rec)
				}
				if err == nil {
					err = s.Commit(ctx, key, "t", resp, ttl)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	time.Sleep(ttl)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := s.Sweep(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("Sweep still deleting after 30s")
		}
	}
}

// relationSize returns the table's size with its indexes and TOAST, and its
// rows, live or expired.
func relationSize(tb testing.TB, srv *pgtest.Server, table string) (bytes, rows int64) {
	tb.Helper()
	out := srv.MustExec(fmt.Sprintf(`SELECT pg_total_relation_size('%[1]s'), (SELECT count(*) FROM %[1]s)`, table))
	var b, r int64
	if _, err := fmt.Sscanf(out, "%d|%d", &b, &r); err != nil {
		tb.Fatalf("size of %s: %q: %v", table, out, err)
	}
	return b, r
}

// TestExpiredRecordsAreSweptAndSpaceReused churns many short-lived records
// through the table: each sweep leaves no row behind, and once vacuumed (as
// autovacuum does) the table with its indexes does not grow from cycle to
// cycle: the space of swept rows is reused.
func TestExpiredRecordsAreSweptAndSpaceReused(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	s := newStore(t, srv, postgres.Options{Table: "churn", SweepInterval: -1, SweepBatch: 500})
	const cycles = 8
	var sizes []int64
	for cycle := range cycles {
		churn(t, s, cycle, 200*time.Millisecond)
		srv.MustExec("VACUUM churn")
		size, rows := relationSize(t, srv, "churn")
		if rows != 0 {
			t.Fatalf("cycle %d: %d rows left after the sweep; want 0", cycle, rows)
		}
		sizes = append(sizes, size)
	}
	t.Logf("table+indexes+TOAST after each cycle of %d records, bytes: %v", churnKeys, sizes)
	// The first cycles fill the free space map; from then on the size
	// holds. Without reuse every cycle would add its full size.
	if last, settled := sizes[cycles-1], sizes[1]; last > settled*3/2 {
		t.Errorf("size after %d cycles = %d bytes, after 2 = %d; want no growth with the cycles", cycles, last, settled)
	}
	// With seqscan off, as on a table too big to scan: the index serves it.
	plan := srv.MustExec(`SET enable_seqscan = off; EXPLAIN DELETE FROM churn AS r WHERE r.key IN (
		SELECT r.key FROM churn AS r WHERE r.expires_at <= statement_timestamp()
		ORDER BY r.expires_at LIMIT 500 FOR UPDATE SKIP LOCKED) AND r.expires_at <= statement_timestamp()`)
	t.Logf("sweep plan:\n%s", plan)
}

// BenchmarkExpiryChurn measures the table's size under TTL churn with only
// autovacuum to reclaim space (naptime 1s, as a busy server's tables are
// vacuumed often): go test -run '^$' -bench ExpiryChurn ./store/postgres/.
// It reports the size after the first cycle and after the last.
func BenchmarkExpiryChurn(b *testing.B) {
	srv := pgtest.Start(b, "autovacuum_naptime=1")
	s, err := postgres.New(context.Background(), postgres.Options{DSN: srv.DSN(), Table: "churn", SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var first, last int64
	cycle := 0
	for b.Loop() {
		churn(b, s, cycle, 500*time.Millisecond)
		size, _ := relationSize(b, srv, "churn")
		if cycle == 0 {
			first = size
		}
		last = size
		cycle++
	}
	b.ReportMetric(float64(first), "first-bytes")
	b.ReportMetric(float64(last), "last-bytes")
	b.ReportMetric(float64(cycle), "cycles")
	b.Log("autovacuum runs: " + srv.MustExec(`SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'churn'`) +
		", records per cycle: " + strconv.Itoa(churnKeys))
}
