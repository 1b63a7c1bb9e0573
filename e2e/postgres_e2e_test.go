package e2e

// End-to-end tests of the PostgreSQL store (issue #17) with the real
// binary on a real PostgreSQL: replicas that share one database agree on
// who owns a key and replay each other's answers byte for byte, a database
// that stops fails closed (or open, where the route says so) and the proxy
// recovers by itself with its keys, and a replica killed mid-flight leaves
// its key in doubt for the others, never forwarded again.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// pgDSNEnv is the variable the configurations written here name in
// dsn_env; each proxy gets it in its environment.
const pgDSNEnv = "IDEMPROXY_POSTGRES_DSN"

// writePostgresConfig writes a configuration for upstream and a PostgreSQL
// store (its DSN in pgDSNEnv) with the given routes, and returns its path.
// Extra lines of the store.postgres block (indented by four spaces) come
// in extra.
func writePostgresConfig(t *testing.T, path, upstream, routes string, extra ...string) string {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: %s
admin:
  listen: 127.0.0.1:0
store:
  postgres:
    dsn_env: %s
    max_conns: 8
    connect_timeout: 1s
    statement_timeout: 500ms
%sroutes:
%s`, upstream, pgDSNEnv, strings.Join(extra, ""), routes)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startPostgresProxy runs the binary on cfg with pg's DSN in pgDSNEnv.
func startPostgresProxy(t *testing.T, cfg string, pg *pgtest.Server) *proc {
	t.Helper()
	return startProxy(t, cfg, pgDSNEnv+"="+pg.DSN(), "IDEMPROXY_ADMIN_TOKEN=s3cret")
}

// waitChargesRoute makes duplicates wait for the first request's answer
// instead of getting 409, so that every answer of a storm is the charge.
const waitChargesRoute = chargesRoute + `    concurrent: wait
    wait_timeout: 10s
`

// TestPostgresReplicasChargeOnce: two replicas sharing one PostgreSQL, a
// storm of identical requests for one order spread over both: exactly one
// is forwarded and charged, and every answer, on either replica, is that
// charge byte for byte. Then an order charged through A and retried
// through B is replayed by B, byte-identical, without a second charge.
func TestPostgresReplicasChargeOnce(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, waitChargesRoute)
	procs := []*proc{startPostgresProxy(t, cfg, pg), startPostgresProxy(t, cfg, pg)}

	const n = 40
	answers := burst(t, procs, "ORD-P1", n)
	var forwarded []sent
	perReplica := map[int]int{}
	for _, a := range answers {
		if a.status != 201 {
			t.Errorf("ORD-P1 via replica %d = %d %s, want 201 (duplicates wait for the answer)", a.replica, a.status, a.body)
			continue
		}
		perReplica[a.replica]++
		if a.header.Get("Idempotent-Replayed") == "" {
			forwarded = append(forwarded, a)
		}
	}
	t.Logf("storm: %d answers, %d forwarded, 201s per replica %v", n, len(forwarded), perReplica)
	if len(forwarded) != 1 {
		t.Fatalf("forwarded answers = %d, want exactly 1", len(forwarded))
	}
	if got := chargeCount(t, up.URL, "ORD-P1"); got != 1 {
		t.Errorf("ORD-P1 charges = %d, want 1", got)
	}
	first := forwarded[0]
	for _, a := range answers {
		if a.status == 201 && a.body != first.body {
			t.Errorf("replica %d answered %q, want the one charge %q", a.replica, a.body, first.body)
		}
		if got, want := a.header.Get("Content-Type"), first.header.Get("Content-Type"); a.status == 201 && got != want {
			t.Errorf("replica %d answered Content-Type %q, want %q", a.replica, got, want)
		}
	}

	// Charged through A, retried through B: replayed, byte-identical.
	charged := charge(procs[0], "ORD-P2")
	if charged.status != 201 || charged.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("ORD-P2 via A = %d %s %v, want a forwarded 201", charged.status, charged.body, charged.err)
	}
	for i := range 3 {
		r := replayed(t, procs[1], "ORD-P2")
		if r.body != charged.body {
			t.Errorf("retry %d of ORD-P2 via B replays %q, want A's answer %q", i, r.body, charged.body)
		}
		if got, want := r.header.Get("Content-Type"), charged.header.Get("Content-Type"); got != want {
			t.Errorf("retry %d of ORD-P2 via B: Content-Type %q, want %q", i, got, want)
		}
	}
	for order, want := range map[string]int{"ORD-P1": 1, "ORD-P2": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
}

// TestPostgresReplicasRejectDuplicatesInFlight: under the default
// concurrent: reject, a storm over two replicas gets one charge, the others
// 409 request-in-flight or the charge replayed; never a second charge.
func TestPostgresReplicasRejectDuplicatesInFlight(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, chargesRoute)
	procs := []*proc{startPostgresProxy(t, cfg, pg), startPostgresProxy(t, cfg, pg)}

	answers := burst(t, procs, "ORD-P3", 40)
	forwarded, nReplayed, nInFlight := tally(t, "ORD-P3", answers)
	t.Logf("burst: %d forwarded, %d replayed, %d request-in-flight", len(forwarded), nReplayed, nInFlight)
	if len(forwarded) != 1 {
		t.Errorf("forwarded answers = %d, want exactly 1", len(forwarded))
	}
	if got := chargeCount(t, up.URL, "ORD-P3"); got != 1 {
		t.Errorf("ORD-P3 charges = %d, want 1", got)
	}
}

// postgresMetricNames returns the names of the idemproxy_postgres_* series
// p's /metrics exports.
func postgresMetricNames(t *testing.T, p *proc) []string {
	t.Helper()
	r := do("GET", p.adminURL("/metrics"), "")
	if r.err != nil || r.status != 200 {
		t.Fatalf("/metrics = %d %v", r.status, r.err)
	}
	seen := map[string]bool{}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(r.body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "idemproxy_postgres_") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// TestPostgresDownFailsClosedAndRecovers: with PostgreSQL stopped, a
// protected request gets 503 store-unavailable and is not forwarded,
// /readyz is 503, the store errors are counted, and a route with
// on_store_error: forward forwards unprotected. When PostgreSQL comes back
// the same process serves again by itself, and the answer committed
// before the stop is still replayed; so are the answers committed before
// PostgreSQL crashed (killed, then recovered on its next start).
func TestPostgresDownFailsClosedAndRecovers(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	p := startPostgresProxy(t, writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, redisDownRoutes), pg)

	first := charge(p, "ORD-K1")
	if first.status != 201 {
		t.Fatalf("ORD-K1 = %d %s %v, want 201", first.status, first.body, first.err)
	}
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 200 {
		t.Fatalf("readyz with PostgreSQL up = %d %s", r.status, r.body)
	}
	replayed(t, p, "ORD-K1")
	names := postgresMetricNames(t, p)
	t.Logf("idemproxy_postgres_* metrics: %v", names)
	if len(names) == 0 {
		t.Error("/metrics has no idemproxy_postgres_* series with the PostgreSQL store")
	}

	pg.Stop()
	for _, order := range []string{"ORD-K2", "ORD-K2", "ORD-K1"} {
		r := charge(p, order)
		if r.status != 503 || problemType(r) != "store-unavailable" {
			t.Errorf("%s with PostgreSQL down = %d %s %v, want 503 store-unavailable", order, r.status, r.body, r.err)
		}
		if got := r.header.Get("Retry-After"); r.status == 503 && got != "1" {
			t.Errorf("%s with PostgreSQL down: Retry-After %q, want 1", order, got)
		}
	}
	for order, want := range map[string]int{"ORD-K1": 1, "ORD-K2": 0} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges with PostgreSQL down = %d, want %d: nothing may be forwarded", order, got, want)
		}
	}
	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 503 {
		t.Errorf("readyz with PostgreSQL down = %d %s, want 503", r.status, r.body)
	}
	if n := metricSum(t, p, "idemproxy_store_errors_total", `store="postgres"`); n <= 0 {
		t.Errorf(`idemproxy_store_errors_total{store="postgres"} = %v with PostgreSQL down, want > 0`, n)
	}
	if n := metricSum(t, p, "idemproxy_requests_total", `route="charges"`, `outcome="store_error"`); n != 3 {
		t.Errorf(`idemproxy_requests_total{route="charges",outcome="store_error"} = %v, want 3`, n)
	}

	// Fail open where the route asks for it.
	open := do("POST", p.url("/orders/ORD-K3/charges"), `{"amount": 10}`)
	if open.status != 201 {
		t.Errorf("open-charges with PostgreSQL down = %d %s %v, want 201 (on_store_error: forward)", open.status, open.body, open.err)
	}
	if got := chargeCount(t, up.URL, "ORD-K3"); got != 1 {
		t.Errorf("ORD-K3 charges = %d, want 1", got)
	}
	if n := metricSum(t, p, "idemproxy_requests_total", `route="open-charges"`, `outcome="store_error"`); n < 1 {
		t.Errorf(`idemproxy_requests_total{route="open-charges",outcome="store_error"} = %v, want >= 1`, n)
	}

	// PostgreSQL returns: the same process serves again without a restart.
	pg.Start()
	eventually(t, "readyz turns 200 again", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	var again result
	eventually(t, "ORD-K2 is served after the recovery", func() bool {
		again = charge(p, "ORD-K2")
		return again.status != 503
	})
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("ORD-K2 after recovery = %d %s %v, want a forwarded 201", again.status, again.body, again.err)
	}
	if r := replayed(t, p, "ORD-K1"); r.body != first.body {
		t.Errorf("ORD-K1 after the PostgreSQL restart replays %q, want %q", r.body, first.body)
	}
	k2 := replayed(t, p, "ORD-K2")

	// A crash of PostgreSQL (every process killed, crash recovery on the
	// next start) keeps the committed answers too.
	pg.Kill()
	if r := charge(p, "ORD-K4"); r.status != 503 || problemType(r) != "store-unavailable" {
		t.Errorf("ORD-K4 with PostgreSQL killed = %d %s %v, want 503 store-unavailable", r.status, r.body, r.err)
	}
	pg.Start()
	eventually(t, "ORD-K1 is served after the crash recovery", func() bool { return charge(p, "ORD-K1").status != 503 })
	for order, want := range map[string]string{"ORD-K1": first.body, "ORD-K2": k2.body} {
		if r := replayed(t, p, order); r.body != want {
			t.Errorf("%s after PostgreSQL crashed replays %q, want %q", order, r.body, want)
		}
	}
	for order, want := range map[string]int{"ORD-K1": 1, "ORD-K2": 1, "ORD-K3": 1, "ORD-K4": 0} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
}

// killRoute gives the request time to be held at the upstream while its
// proxy is killed (upstream_timeout), and a short lease, so that its key
// turns in doubt soon after.
const killRoute = `
  - name: charges
    match: POST /charges
    key: {json: orderId}
    upstream_timeout: 3s
    lease: 4s
`

// TestPostgresReplicaKilledMidFlight: replica A is killed with SIGKILL
// while the upstream holds its charge. Replica B, on the same PostgreSQL,
// answers the retry with 409 (request-in-flight while A's lease holds),
// then, once the lease lapsed on the database's clock, 409
// outcome-in-doubt; it never forwards the order again, nor does A started
// again, and the admin API shows the key in doubt.
func TestPostgresReplicaKilledMidFlight(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, killRoute)
	a, b := startPostgresProxy(t, cfg, pg), startPostgresProxy(t, cfg, pg)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Held by the stub for longer than the test waits; cut by the kill.
		charge(a, "ORD-X1", "X-Stub-Fault", "delay", "X-Stub-Delay", "20s")
	}()
	eventually(t, "the stub charged ORD-X1", func() bool { return chargeCount(t, up.URL, "ORD-X1") == 1 })
	a.signal(syscall.SIGKILL)
	a.wait()
	wg.Wait()

	r := charge(b, "ORD-X1")
	if r.status != 409 || (problemType(r) != "request-in-flight" && problemType(r) != "outcome-in-doubt") {
		t.Errorf("ORD-X1 via B right after A was killed = %d %s %v, want 409 request-in-flight or outcome-in-doubt",
			r.status, r.body, r.err)
	}
	eventually(t, "ORD-X1 turns in doubt on B once A's lease lapsed", func() bool {
		r = charge(b, "ORD-X1")
		return problemType(r) == "outcome-in-doubt"
	})
	if r.status != 409 {
		t.Errorf("ORD-X1 via B in doubt = %d %s, want 409 outcome-in-doubt", r.status, r.body)
	}
	a2 := startPostgresProxy(t, cfg, pg) // A comes back
	for i, p := range []*proc{b, a2, b} {
		if r := charge(p, "ORD-X1"); r.status != 409 || problemType(r) != "outcome-in-doubt" {
			t.Errorf("retry %d of ORD-X1 = %d %s %v, want 409 outcome-in-doubt", i, r.status, r.body, r.err)
		}
	}
	k := do("GET", b.adminURL("/v1/keys/charges/ORD-X1"), "", "Authorization", "Bearer s3cret")
	if k.status != 200 || !strings.Contains(k.body, `"in_doubt"`) {
		t.Errorf("admin GET of ORD-X1 = %d %s, want the key in_doubt", k.status, k.body)
	}
	if got := chargeCount(t, up.URL, "ORD-X1"); got != 1 {
		t.Errorf("ORD-X1 charges = %d, want 1: an in-doubt key is never forwarded again", got)
	}
	if n := metricSum(t, b, "idemproxy_requests_total", `route="charges"`, `outcome="conflict"`); n < 4 {
		t.Errorf(`idemproxy_requests_total{route="charges",outcome="conflict"} on B = %v, want >= 4`, n)
	}
}

// TestPostgresSynchronousStandbyMissingFailsClosed pins the durability
// promise of synchronous_commit: "on" with a synchronous standby: a
// reservation is acknowledged only once the standby has it, so while the
// standby named in synchronous_standby_names does not answer (here it does
// not exist: every commit waits for it), a protected request is answered
// 503 store-unavailable and not forwarded, even though the primary holds
// the reservation locally. Forwarding it would be charging on a reservation
// that a failover to the standby loses. When the standby requirement is
// lifted, requests are served again, and the order that got 503s is
// charged at most once.
func TestPostgresSynchronousStandbyMissingFailsClosed(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	cfg := writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, chargesRoute, "    synchronous_commit: \"on\"\n")
	p := startPostgresProxy(t, cfg, pg) // creates the table before commits wait

	if r := charge(p, "ORD-Y0"); r.status != 201 {
		t.Fatalf("ORD-Y0 with no standby required = %d %s %v, want 201", r.status, r.body, r.err)
	}
	setStandbys := func(names string) {
		t.Helper()
		pg.MustExec("ALTER SYSTEM SET synchronous_standby_names = '" + names + "'")
		pg.MustExec("SELECT pg_reload_conf()")
		eventually(t, "synchronous_standby_names = '"+names+"' is in force", func() bool {
			out, err := pg.Exec("SHOW synchronous_standby_names")
			return err == nil && strings.Contains(out, names)
		})
	}
	setStandbys("standby_that_never_answers")

	for i := range 3 {
		r := charge(p, "ORD-Y1")
		if r.status != 503 || problemType(r) != "store-unavailable" {
			t.Errorf("attempt %d of ORD-Y1 while the synchronous standby is missing = %d %s %v, want 503 store-unavailable",
				i, r.status, r.body, r.err)
		}
	}
	if got := chargeCount(t, up.URL, "ORD-Y1"); got != 0 {
		t.Errorf("ORD-Y1 charges while the synchronous standby is missing = %d, want 0: "+
			"a reservation the standby does not have must not be forwarded", got)
	}

	setStandbys("")
	var r result
	eventually(t, "ORD-Y2 is served once no standby is required", func() bool {
		r = charge(p, "ORD-Y2")
		return r.status != 503
	})
	if r.status != 201 {
		t.Errorf("ORD-Y2 = %d %s, want 201", r.status, r.body)
	}
	for range 3 {
		charge(p, "ORD-Y1")
	}
	if got := chargeCount(t, up.URL, "ORD-Y1"); got > 1 {
		t.Errorf("ORD-Y1 charges = %d, want at most 1", got)
	}
}

// TestPostgresDocsShowTheSchema: docs/postgres.md shows the statements
// that create the table, as the store runs them, for administrators who
// create it themselves.
func TestPostgresDocsShowTheSchema(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("docs/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := postgres.SchemaSQL("", ""); !strings.Contains(string(b), "```sql\n"+want+"```") {
		t.Errorf("docs/postgres.md does not show the store's schema in a sql block; want:\n%s", want)
	}
}

// TestPostgresFailoverToSynchronousStandby: two replicas on a primary whose
// standby is synchronous (synchronous_standby_names, synchronous_commit:
// "on"), with a DSN that lists both servers and asks for a read-write
// session. An order charged before the primary is killed and the standby
// promoted is replayed after it, byte-identical, by the other replica; an
// order whose charge was at the upstream during the failover is committed
// by its replica on the new primary and replayed too; nothing is charged
// twice, and neither proxy is restarted.
func TestPostgresFailoverToSynchronousStandby(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t, "synchronous_standby_names="+pgtest.ApplicationName)
	standby := pgtest.StartStandby(t, primary)
	eventually(t, "the standby is synchronous", func() bool {
		return primary.MustExec("SELECT sync_state FROM pg_stat_replication") == "sync"
	})
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		pgtest.User, primary.Port(), standby.Port())
	up := startStub(t)
	dir := t.TempDir()
	cfg := writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, chargesRoute, "    synchronous_commit: \"on\"\n")
	a := startProxy(t, cfg, pgDSNEnv+"="+dsn)
	b := startProxy(t, cfg, pgDSNEnv+"="+dsn)

	charged := charge(a, "ORD-F1")
	if charged.status != 201 {
		t.Fatalf("ORD-F1 via A = %d %s %v, want 201", charged.status, charged.body, charged.err)
	}
	held := make(chan result, 1)
	go func() { held <- charge(b, "ORD-F2", "X-Stub-Fault", "delay", "X-Stub-Delay", "2s") }()
	eventually(t, "the stub charged ORD-F2", func() bool { return chargeCount(t, up.URL, "ORD-F2") == 1 })

	primary.Kill()
	standby.Promote()

	if r := <-held; r.status != 201 {
		t.Errorf("ORD-F2 via B across the failover = %d %s %v, want its charge, 201", r.status, r.body, r.err)
	}
	for _, p := range []*proc{a, b} {
		eventually(t, "readyz is 200 on the promoted standby", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	}
	var r result
	eventually(t, "ORD-F1 is answered after the failover", func() bool {
		r = charge(b, "ORD-F1")
		return r.status != 503
	})
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || r.body != charged.body {
		t.Errorf("ORD-F1 via B after the failover = %d %s (replayed %q), want A's answer %s replayed",
			r.status, r.body, r.header.Get("Idempotent-Replayed"), charged.body)
	}
	eventually(t, "ORD-F2's answer is committed on the new primary", func() bool {
		r = charge(a, "ORD-F2")
		return r.status == 201
	})
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("ORD-F2 via A after the failover = %d %s, want the charge replayed", r.status, r.body)
	}
	if got := charge(a, "ORD-F3"); got.status != 201 || got.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a new order after the failover = %d %s, want a forwarded 201", got.status, got.body)
	}
	for order, want := range map[string]int{"ORD-F1": 1, "ORD-F2": 1, "ORD-F3": 1} {
		if got := chargeCount(t, up.URL, order); got != want {
			t.Errorf("%s charges = %d, want %d", order, got, want)
		}
	}
}

// TestReadyzPostgresSynchronousStandbyMissing: a primary whose synchronous
// standby is gone answers pings, but no commit is acknowledged: /readyz
// turns 503 with the reason within a few seconds, answering at once, and
// ready again when the standby is no longer required.
func TestReadyzPostgresSynchronousStandbyMissing(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := startStub(t)
	dir := t.TempDir()
	p := startPostgresProxy(t, writePostgresConfig(t, filepath.Join(dir, "c.yaml"), up.URL, chargesRoute), pg)
	eventually(t, "ready", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })

	setStandbys := func(names string) {
		t.Helper()
		pg.MustExec("ALTER SYSTEM SET synchronous_standby_names = '" + names + "'")
		pg.MustExec("SELECT pg_reload_conf()")
	}
	setStandbys("standby_that_is_gone")
	t.Cleanup(func() { pg.Exec("ALTER SYSTEM RESET synchronous_standby_names"); pg.Exec("SELECT pg_reload_conf()") })
	waitNotWritable(t, p, "the synchronous standby is missing")
	if got := charge(p, "ORD-NOT-READY"); got.status != 503 {
		t.Errorf("a charge while not ready = %d %s, want 503 (the readiness was the truth)", got.status, got.body)
	}

	setStandbys("")
	eventually(t, "ready once no standby is required", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if got := charge(p, "ORD-READY"); got.status != 201 {
		t.Errorf("a charge once ready = %d %s, want 201", got.status, got.body)
	}
}
