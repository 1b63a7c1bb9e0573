package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
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
		{"reserve", s.sql.reserve, []string{key, tok, `'fp'`, us, us, ts, `'og'`}, ""},
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
		// A batch finds each of its keys by the index.
		{"batch", s.sql.batch, []string{
			`'{r/-/1,r/-/2,r/-/new}'`, `'{t,t,t}'`, `'{fp,fp,fp}'`, `'{` + us + `,` + us + `,` + us + `}'`, `'{` + us + `,` + us + `,` + us + `}'`,
			`ARRAY[` + ts + `,` + ts + `,` + ts + `]`, `'{"","",""}'`, `'{og,"",""}'`,
			`'{r/-/3,r/-/4}'`, `'{t,t}'`, `'{"{}","{}"}'`, `'{NULL,"\\x00"}'`, `'{` + us + `,` + us + `}'`,
			`'{r/-/5}'`, `'{t}'`,
			`'{r/-/6}'`, `'{t}'`, `'{` + us + `}'`,
		}, ""},
	}
	// PostgreSQL's plan cache keeps a generic plan of a prepared statement
	// once it looks as cheap as the custom ones (the batch statement's,
	// see TestBatchIsPlannedOnce): the generic plans, which know nothing of
	// the parameters, must not scan either.
	for _, mode := range []string{"auto", "force_generic_plan"} {
		for i, tc := range tests {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				plan := srv.MustExec(fmt.Sprintf("SET plan_cache_mode = %s;\nPREPARE p%d AS %s;\nEXPLAIN EXECUTE p%d(%s)", mode, i, tc.sql, i, strings.Join(tc.args, ", ")))
				if strings.Contains(plan, "Seq Scan") {
					t.Errorf("the plan scans the table:\n%s", plan)
				}
				if tc.want != "" && !strings.Contains(plan, tc.want) {
					t.Errorf("the plan has no %q:\n%s", tc.want, plan)
				}
			})
		}
	}
}

// TestBatchIsPlannedOnce: the batch statement, prepared on a connection as
// pgx prepares it, is planned once and its generic plan kept, whatever the
// sizes of the batches: planning it anew for each batch costs the database
// more than running it.
func TestBatchIsPlannedOnce(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, Options{DSN: srv.DSN(), Table: "planned", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	const runs = 20
	for i := range runs {
		var (
			keys, toks, fps, epochs []string
			origins                 []string
			us                      []int64
			deadlines               []time.Time
		)
		for j := range 1 + i%4 { // small batches, whose sizes a custom plan would see
			keys = append(keys, fmt.Sprintf("r/-/%d-%d", i, j))
			toks, fps, epochs, origins = append(toks, "t"), append(fps, "fp"), append(epochs, ""), append(origins, "")
			us, deadlines = append(us, int64(time.Hour/time.Microsecond)), append(deadlines, time.Now().Add(time.Minute))
		}
		rows, err := c.Query(ctx, s.sql.batch, keys, toks, fps, us, us, deadlines, epochs, origins,
			[]string{}, []string{}, []string{}, [][]byte{}, []int64{}, []string{}, []string{}, []string{}, []string{}, []int64{})
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int
	if err := c.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, s.sql.batch).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic < runs-5 {
		t.Errorf("the batch statement ran %d times with %d generic and %d custom plans; want the generic plan kept after the plan cache's 5 custom ones", runs, generic, custom)
	}
}
