package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestStatementsUseIndexes plans every statement the store runs against a
// table of 50,000 records (analyzed, as autovacuum would have it): none
// scans the table. A scan per request, or per sweep or reconcile pass,
// would grow with the number of keys kept.
func TestStatementsUseIndexes(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, Options{DSN: srv.DSN(), Table: "plans", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv.MustExec(`INSERT INTO plans (key, state, token, fingerprint, created_at, lease_expires_at, expires_at, response, next_lookup)
		SELECT 'r/-/' || i,
			CASE WHEN i % 100 = 0 THEN 'in_doubt' WHEN i % 100 = 1 THEN 'in_flight' ELSE 'completed' END,
			't', 'fp', now(),
			CASE WHEN i % 100 = 1 THEN now() + interval '1 minute' END,
			now() + (i % 7 - 1) * interval '1 hour',
			CASE WHEN i % 100 > 1 THEN '{"status": 200}'::jsonb END,
			CASE WHEN i % 200 = 0 THEN now() END
		FROM generate_series(1, 50000) AS i;
		ANALYZE plans`)

	const (
		key, tok, us = `'r/-/42'`, `'t'`, `1000000`
		ts           = `now()`
	)
	tests := []struct {
		name, sql string
		args      []string
		want      string // in the plan, when set
	}{
		{"reserve", s.sql.reserve, []string{key, tok, `'fp'`, us, us, ts}, ""},
		{"get", s.sql.get, []string{key}, ""},
		{"commit", s.sql.commit, []string{key, tok, `'{}'`, `'\x00'`, us}, ""},
		{"release", s.sql.release, []string{key, tok}, ""},
		{"mark in doubt", s.sql.markInDoubt, []string{key, tok, us}, ""},
		{"schedule", s.sql.schedule, []string{key, us}, ""},
		{"unschedule", s.sql.unschedule, []string{key}, ""},
		{"claim", s.sql.claim, []string{key, tok, us, `false`}, ""},
		{"claim state", s.sql.claimState, []string{key}, ""},
		{"resolve release", s.sql.resolveRelease, []string{key, tok}, ""},
		{"resolve applied", s.sql.resolveApplied, []string{key, tok, `'{}'`, `'\x00'`}, ""},
		{"resolve retry", s.sql.resolveRetry, []string{key, tok, us}, ""},
		// The batches are found through their index, then each row by its
		// key: a join could read every due or expired row per batch.
		{"due lookups", s.sql.due, []string{`100`, `'me'`, us}, "Index Cond: (key = ANY"},
		{"unscheduled", s.sql.unscheduled, []string{`'r/'`, `100`}, ""},
		{"sweep", s.sql.sweep, []string{`1000`}, "Index Cond: (key = ANY"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := srv.MustExec(fmt.Sprintf("PREPARE p%d AS %s;\nEXPLAIN EXECUTE p%d(%s)", i, tc.sql, i, strings.Join(tc.args, ", ")))
			if strings.Contains(plan, "Seq Scan") {
				t.Errorf("the plan scans the table:\n%s", plan)
			}
			if tc.want != "" && !strings.Contains(plan, tc.want) {
				t.Errorf("the plan has no %q:\n%s", tc.want, plan)
			}
		})
	}
}
