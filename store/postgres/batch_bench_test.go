package postgres_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// BenchmarkConcurrentWrites: a reservation and its commit per operation,
// from 64 goroutines at once, as the proxy's requests make them; it
// reports the statements per write the database ran (pg_stat_statements),
// the batching the batcher gives (1 would be none).
func BenchmarkConcurrentWrites(b *testing.B) {
	srv := pgtest.Start(b, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
	srv.MustExec(`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	const table = "bench_writes"
	s, err := postgres.New(context.Background(), postgres.Options{DSN: srv.DSN(), Table: table, StatementTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	srv.MustExec(`SELECT pg_stat_statements_reset()`)
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0))) // 64 goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1)
			key, tok := fmt.Sprint("b/-/", i), "t"+strconv.FormatInt(i, 10)
			if _, err := s.Reserve(ctx, key, store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
				b.Error(err)
				return
			}
			if err := s.Commit(ctx, key, tok, store.Response{Status: 201, Body: []byte("ok"), BodyStored: true}, time.Hour); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	calls, err := strconv.Atoi(srv.MustExec(`SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%` + table + `%'`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(calls)/float64(2*b.N), "stmts/write")
}
