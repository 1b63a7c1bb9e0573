//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// partialRun is a run of the partial faults' own: no proxies (so no proxy
// reports the loss, and the operator waits -detect-within and 5 s for
// nothing), one shared store started by the run's own code.
func partialRun(t *testing.T) (*run, *injector) {
	t.Helper()
	r := &run{out: t.TempDir(), log: io.Discard, rec: &recorder{start: time.Now()}, opts: options{detectWithin: 100 * time.Millisecond}}
	t.Cleanup(r.stopAll)
	return r, &injector{r: r, applied: map[string]int{}}
}

// TestRedisEvictEvicts: redis-evict really evicts keys of the master (at
// run time, under the drawn policy), puts noeviction and no maxmemory
// back, and records a partial loss with its detection window.
func TestRedisEvictEvicts(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is needed (the store tests need it too)")
	}
	for _, count := range []int{1, 2} { // allkeys-lru, volatile-lru
		t.Run(strconv.Itoa(count), func(t *testing.T) {
			r, in := partialRun(t)
			ctx := context.Background()
			s, err := r.startRedis(ctx)
			if s != nil {
				r.stores = append(r.stores, s)
			}
			if err != nil {
				t.Fatal(err)
			}
			m, _ := s.prim()
			// Keys with a TTL, as the proxies write them, and one without,
			// as the epoch marker.
			const n = 5000
			for i := range n {
				if _, err := redisDo(m.addr(), "SET", fmt.Sprintf("chaos:k%d", i), "a record of about a hundred bytes, as a small answer is: 0123456789abcdef", "EX", "3600"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := redisDo(m.addr(), "SET", "chaos:epoch", "marker"); err != nil {
				t.Fatal(err)
			}
			f := fault{Kind: kEvict, For: 300 * time.Millisecond, Count: count}
			// Evictions happen as commands run: a client writes during
			// the fault, as the proxies do.
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = redisDo(m.addr(), "SET", fmt.Sprintf("chaos:w%d", i), "x", "EX", "3600")
				}
			}()
			err = in.evict(ctx, s, f)
			close(stop)
			<-done
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range map[string]string{"maxmemory": "0", "maxmemory-policy": "noeviction"} {
				if got, err := redisDo(m.addr(), "CONFIG", "GET", k); err != nil || len(got) != 2 || got[1] != want {
					t.Errorf("CONFIG GET %s = %q, %v after the fault; want %s", k, got, err, want)
				}
			}
			if ev := redisInfoInt(m.addr(), "stats", "evicted_keys"); ev <= 0 {
				t.Errorf("evicted_keys = %d: nothing evicted", ev)
			}
			if count%2 == 0 {
				if got, _ := redisDo(m.addr(), "EXISTS", "chaos:epoch"); len(got) != 1 || got[0] != "1" {
					t.Errorf("volatile-lru evicted the key without a TTL")
				}
			}
			if len(r.losses) != 1 || !r.losses[0].Partial || r.losses[0].Detect != r.losses[0].At+int64(100*time.Millisecond) || r.losses[0].Accepted != 0 {
				t.Errorf("losses %+v; want one partial loss, its window -detect-within long, not accepted (no proxy reported it)", r.losses)
			}
		})
	}
}

// TestRedisFailoverLaggingLosesTheLastWrites: redis-failover-lagging cuts
// the replica off, so the Sentinel promotes a replica without the
// master's last writes (laggingFailover checks its own key, missing on
// the new master, and fails otherwise); the old master then follows the
// new one, and a partial loss is recorded from the promotion.
func TestRedisFailoverLaggingLosesTheLastWrites(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is needed (the store tests need it too)")
	}
	r, in := partialRun(t)
	ctx := context.Background()
	s, err := r.startRedis(ctx)
	if s != nil {
		r.stores = append(r.stores, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	old, next := s.prim()
	if err := in.laggingFailover(ctx, s, fault{Kind: kLagging, For: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// The Sentinel turns the old master into the new one's replica on its
	// own time, after the promotion the fault waited for (a parallel run
	// read it still "master"): waited for, with a generous deadline.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m, _ := s.prim()
		if m == next && redisRole(old.addr()) == "slave" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the fault: the master is %s, %s is %q; want %s the master, %s its replica", m.name, old.name, redisRole(old.addr()), next.name, old.name)
		}
	}
	if len(r.losses) != 1 || !r.losses[0].Partial || r.losses[0].At == 0 {
		t.Errorf("losses %+v; want one partial loss from the promotion", r.losses)
	}
}

// TestPostgresRestoreOldUndoesTheWritesSince: postgres-restore-old takes a
// dump of the idemproxy tables, and restores it after the fault's
// duration: the rows written meanwhile are gone, those changed are as
// they were, the others are back, and a partial loss is recorded.
func TestPostgresRestoreOldUndoesTheWritesSince(t *testing.T) {
	t.Parallel()
	if _, err := postgresBin(); err != nil {
		t.Fatal(err)
	}
	r, in := partialRun(t)
	// PostgreSQL runs as the postgres user when the test is root: it must
	// reach the run's folder, which t.TempDir makes private.
	for _, d := range []string{r.out, filepath.Dir(r.out)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	s, err := r.startPostgres(ctx)
	if s != nil {
		r.stores = append(r.stores, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	p, _ := s.prim()
	sql := func(q string) string {
		t.Helper()
		out, err := s.psql(ctx, p, q)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	sql("CREATE TABLE " + pgTable + " (key text PRIMARY KEY, state text NOT NULL); " +
		"INSERT INTO " + pgTable + " SELECT 'old' || i, 'in-flight' FROM generate_series(1, 100) i")
	done := make(chan error, 1)
	go func() {
		done <- in.restoreOld(ctx, s, fault{Kind: kRestoreOld, For: 3 * time.Second})
	}()
	// Once the dump is taken, the proxies go on writing.
	deadline := time.Now().Add(30 * time.Second)
	for sql("SELECT count(*) FROM pg_tables WHERE tablename = 'chaos_dump_"+pgTable+"'") != "1" {
		if time.Now().After(deadline) {
			t.Fatal("no dump within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sql("INSERT INTO " + pgTable + " SELECT 'new' || i, 'completed' FROM generate_series(1, 50) i; " +
		"UPDATE " + pgTable + " SET state = 'completed' WHERE key = 'old1'")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := sql("SELECT count(*) FILTER (WHERE key LIKE 'old%') || ' ' || count(*) FILTER (WHERE key LIKE 'new%') || ' ' || " +
		"(SELECT state FROM " + pgTable + " WHERE key = 'old1') FROM " + pgTable); got != "100 0 in-flight" {
		t.Errorf("after the restore: %q; want the 100 old rows as they were, none of the new ones", got)
	}
	if got := sql("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'chaos_dump_%'"); got != "0" {
		t.Errorf("%s dump tables left after the restore", got)
	}
	if len(r.losses) != 1 || !r.losses[0].Partial {
		t.Errorf("losses %+v; want one partial loss", r.losses)
	}
}
