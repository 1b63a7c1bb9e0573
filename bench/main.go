//go:build unix

// Command bench measures idemproxy against a bare reverse proxy, side by
// side, on loopback: the upstream stub, a tuned httputil.ReverseProxy (the
// baseline), and the real idemproxy binary with synced Badger, unsynced
// Badger, Redis and a Redis Cluster of three masters (when redis-server
// and redis-cli are on the PATH) and PostgreSQL with synchronous_commit on
// and off (when its server binaries are installed), each in its own
// process so that its CPU time and peak RSS can be read from /proc. Each
// Redis and PostgreSQL target gets its own servers, started here on
// loopback and stopped on every way out (Ctrl-C and SIGTERM included).
//
// Every target gets unique-key POST /charges at 1 connection and at -conns
// connections for -duration each, driven by wrk when it is on the PATH
// (or with -driver go, by an in-process Go client). The output is one
// table: requests per second, p50/p99 latency, CPU time per request, peak
// RSS (VmHWM) and the ratios to the baseline; for the Redis and PostgreSQL
// targets also the database server's CPU time per request (the Cluster's:
// the sum of its nodes').
//
// Two more targets, left out unless -targets names them, measure what
// OpenTelemetry tracing costs: badger-sync-trace and badger-sync-trace1 are
// badger-sync with tracing on, sampling every request (always_on) and 1 %
// of them (traceidratio 0.01), each exporting over OTLP/HTTP to a receiver
// of its own on loopback (otlp.go), in a process apart so that its CPU is
// not the proxy's. Under the table, a line per tracing target says how many
// requests it was sent and how many traces, spans and exports reached its
// receiver.
//
// Usage, from the repository root:
//
//	go run ./bench [-duration 5s] [-conns 32] [-rounds 1] [-driver auto|wrk|go] [-targets bare,badger-sync,badger-nosync,redis,redis-cluster,postgres-sync,postgres-nosync,badger-sync-trace,badger-sync-trace1] [-profile DIR] [-ttl D] [-sample D]
//	go run ./bench -rate 2500 -duration 30s -prefill 1000000 [-pin] [-targets ...]
//
// With -rate, each target instead gets an open-loop, constant-rate load
// (openloop.go): request i is sent at its intended time, whatever happened
// to the others, and timed from then, so a stall counts for every request
// that queued behind it. The table then shows p50, p90, p99, p99.9 and max
// latency, CPU per request and peak RSS. With -prefill N, every store
// target has a twin, target@N, that starts on a store already holding N
// completed keys (a day of keys), measured in turn with its fresh one.
// With -pin, the targets run on CPU 0 alone (taskset) and the load, the
// stub and the database servers on the other CPUs.
//
// With -ttl, the idemproxy targets' route remembers keys for that long
// instead of the default 24 h (its lease and upstream timeout shrink to
// fit), so that keys expire while new ones arrive. With -sample, the loaded
// run is driven in pieces of that length, and after each piece a line
// per target says the keys sent so far, the size of the data directory
// (the sum of its files' sizes, and the blocks allocated to them), RssAnon,
// RssFile and VmHWM; the latencies of the table are then the worst piece's.
//
// With -profile, each idemproxy target serves pprof on an admin listener
// and a CPU profile of its loaded run in the last round is written to
// DIR/<target>.pprof (go tool pprof DIR/badger-nosync.pprof).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

// defaultTargets are the targets measured without -targets: all of them
// but the tracing ones (badger-sync-trace, badger-sync-trace1: otlp.go),
// which measure what tracing costs, not a store, and the replicated Redis
// ones (redis-replica, redis-replica-nowait), which measure what waiting
// for a replica costs.
const defaultTargets = "bare,badger-sync,badger-nosync,redis,redis-cluster,postgres-sync,postgres-nosync"

// clkTck is the kernel's clock tick for /proc/<pid>/stat CPU times; 100 on
// every Linux platform Go supports.
const clkTck = 100

func main() {
	bareListen := flag.String("bare-listen", "", "internal: serve the bare reverse proxy on this address")
	bareUpstream := flag.String("bare-upstream", "", "internal: the bare proxy's upstream")
	otlpListen := flag.String("otlp-listen", "", "internal: serve an OTLP/HTTP trace receiver on this address")
	bareMetrics := flag.String("bare-metrics", "", "internal: serve the bare proxy's allocation counters on this address")
	duration := flag.Duration("duration", 5*time.Second, "length of each measurement")
	conns := flag.Int("conns", 32, "connections of the loaded measurement")
	rounds := flag.Int("rounds", 1, "rounds over all targets (the median round is shown)")
	driver := flag.String("driver", "auto", "load driver: auto (wrk when on the PATH), wrk or go")
	targets := flag.String("targets", defaultTargets, "targets to measure, comma-separated")
	keep := flag.Bool("keep", false, "keep the temporary directory (binaries, data, logs)")
	logLevel := flag.String("log-level", "info", "idemproxy's -log-level (info writes the access log)")
	single := flag.Bool("single", true, "also measure at 1 connection (false: a soak at -conns only)")
	profile := flag.String("profile", "", "write a CPU profile of each idemproxy target's loaded run of the last round to this directory")
	ttl := flag.Duration("ttl", 0, "the idemproxy targets' route ttl (0: the default, 24h)")
	sample := flag.Duration("sample", 0, "print keys sent, data-directory size and RSS of each target this often during the loaded run (0: never)")
	prefill := flag.Int("prefill", 0, "also measure each store target on a store already holding this many completed keys (target@N)")
	pin := flag.Bool("pin", false, "run each measured target on CPU 0 alone and everything else (the load, the stub, the database servers) on the other CPUs")
	rate := flag.Int("rate", 0, "open-loop: send this many requests per second for -duration instead of the closed-loop runs (0: closed-loop)")
	flag.Parse()
	if *bareListen != "" {
		if *bareMetrics != "" {
			go serveMemstats(*bareMetrics)
		}
		serveBare(*bareListen, *bareUpstream)
		return
	}
	if *otlpListen != "" {
		serveOTLP(*otlpListen)
		return
	}
	if *pin && os.Getenv(pinnedEnv) == "" {
		os.Exit(repin())
	}
	o := options{d: *duration, conns: *conns, rounds: *rounds, driver: *driver, names: strings.Split(*targets, ","),
		keep: *keep, logLevel: *logLevel, single: *single, profile: *profile, ttl: *ttl, sample: *sample, prefill: *prefill, rate: *rate, pin: *pin}
	// Ctrl-C or SIGTERM stops the servers, the proxies and the stub and
	// removes the temporary directories before the bench exits.
	ps := &procSet{}
	var interrupted atomic.Bool
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "bench: %v: stopping what it started\n", s)
		ps.stop()
		os.Exit(130)
	}()
	err := run(o, ps)
	if interrupted.Load() {
		time.Sleep(time.Minute) // the handler exits once everything is stopped
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// serveBare is the baseline: a tuned httputil.ReverseProxy, as a sidecar
// without idempotency would be (idle pool of 1024, a buffer pool).
func serveBare(listen, upstream string) {
	up, err := url.Parse(upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(up); pr.SetXForwarded() },
		Transport:  tr,
		BufferPool: &bufPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}},
	}
	srv := &http.Server{Addr: listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

type bufPool struct{ p sync.Pool }

func (b *bufPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufPool) Put(v []byte) { b.p.Put(&v) }

// target is one process under measurement.
type target struct {
	name  string
	cmd   *exec.Cmd
	addr  string
	admin string // idemproxy's admin listener, else empty
	// metrics serves the target's go_memstats_mallocs_total and
	// go_memstats_alloc_bytes_total on /metrics (budget.go).
	metrics string
	pid     int
	dir     string // Badger's or PostgreSQL's data directory, if any
	// storeCPU is the CPU time so far of the target's database server
	// (Redis, PostgreSQL), nil for the others.
	storeCPU func() time.Duration
	otlp     string // a tracing target's OTLP receiver, else empty
	sent     int64  // requests answered, warm-ups included
}

// result is one target's measurement.
type result struct {
	name         string
	rps1, rpsN   float64
	p50_1, p99_1 time.Duration
	p50N, p99N   time.Duration
	cpuPerReq    time.Duration // at -conns connections
	storeCPU     time.Duration // the database server's, per request at -conns; -1: no server
	peakRSS      int64         // VmHWM, bytes
	errors       int64
	keys         int64
	anon, file   int64 // RSS at the end: anonymous (heap, stacks) and mapped files
	// The budget (budget.go), per request at -conns; -1: not measured.
	allocs, allocBytes, syscalls float64
}

// options are the command's flags.
type options struct {
	d             time.Duration
	conns, rounds int
	driver        string
	names         []string
	keep          bool
	logLevel      string
	single        bool
	profile       string
	ttl           time.Duration // route ttl of the idemproxy targets; 0: the default
	sample        time.Duration // sampling period of the loaded run; 0: none
	prefill       int           // keys stored in each store target's twin before it starts
	rate          int           // open-loop requests per second; 0: closed-loop
	pin           bool          // targets on CPU 0, the rest on the others
}

// run measures the targets of o. What it starts, it starts through ps, and
// stops (ps.stop) before it returns.
func run(o options, ps *procSet) error {
	defer ps.stop()
	d, conns, rounds, driver, names := o.d, o.conns, o.rounds, o.driver, o.names
	keep, logLevel, single, profile := o.keep, o.logLevel, o.single, o.profile
	if o.ttl != 0 && o.ttl < 2*time.Second {
		return errors.New("-ttl must be at least 2s (the lease and upstream timeout fit below it)")
	}
	if o.rate < 0 || o.prefill < 0 {
		return errors.New("-rate and -prefill must not be negative")
	}
	if o.rate > 0 && o.sample > 0 {
		return errors.New("-sample is for the closed-loop runs: not with -rate")
	}
	if o.sample != 0 && o.sample < time.Second {
		return errors.New("-sample must be at least 1s")
	}
	if profile != "" {
		if err := os.MkdirAll(profile, 0o755); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp("", "idemproxy-bench")
	if err != nil {
		return err
	}
	ps.logDir = tmp
	if !keep {
		ps.cleanup(func() { os.RemoveAll(tmp) })
	} else {
		fmt.Println("temporary directory:", tmp)
	}
	useWrk := false
	switch driver {
	case "auto":
		_, err := exec.LookPath("wrk")
		useWrk = err == nil
	case "wrk":
		useWrk = true
	case "go":
	default:
		return fmt.Errorf("unknown driver %q", driver)
	}
	names = redisAvailable(names, os.Stdout)
	pgBin := ""
	if slices.ContainsFunc(names, isPostgres) {
		if pgBin = pgBinDir(); pgBin == "" {
			fmt.Println("no PostgreSQL server binaries (initdb on the PATH or /usr/lib/postgresql/*/bin): the postgres targets are left out")
			names = slices.DeleteFunc(names, isPostgres)
		}
	}
	bin := filepath.Join(tmp, "idemproxy")
	stubBin := filepath.Join(tmp, "upstream-stub")
	for _, b := range [][2]string{{bin, "."}, {stubBin, "./upstream-stub"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b[1], err, out)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	startCmd := ps.start
	start := func(name string, args ...string) (*exec.Cmd, error) {
		c := exec.Command(name, args...)
		return c, startCmd(c)
	}

	stubAddr := freeAddr()
	if _, err := start(stubBin, "-listen", stubAddr, "-log-level", "ERROR"); err != nil {
		return err
	}
	if err := waitListening(stubAddr); err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	stubURL := "http://" + stubAddr
	// With -prefill, each store target has a twin that starts on a store
	// already holding that many keys: name@1M beside name.
	type spec struct {
		name, kind string // kind: the name without the @ suffix
		prefill    int
	}
	var specs []spec
	for _, n := range names {
		specs = append(specs, spec{name: n, kind: n})
		if o.prefill > 0 && n != "bare" {
			specs = append(specs, spec{name: n + "@" + count(o.prefill), kind: n, prefill: o.prefill})
		}
	}
	var ts []*target
	badgerFilled := "" // a prefilled Badger directory, once made
	for _, sp := range specs {
		n := sp.kind
		addr, adminAddr, metricsAddr, dataDir, otlpAddr := freeAddr(), "", "", "", ""
		var (
			c        *exec.Cmd
			storeCPU func() time.Duration
			env      []string
		)
		ttl := cmp.Or(o.ttl, 24*time.Hour)
		prefilled := func(what string, t0 time.Time) {
			size, alloc := dirSize(dataDir)
			fmt.Printf("prefill %s: %d keys in %s%s, data dir %.1f MiB (%.1f MiB allocated)\n",
				sp.name, sp.prefill, time.Since(t0).Round(time.Second), what, mib(size), mib(alloc))
		}
		switch n {
		case "bare":
			metricsAddr = freeAddr()
			c = pinned(exec.Command(self, "-bare-listen", addr, "-bare-upstream", stubURL, "-bare-metrics", metricsAddr), o.pin)
			err = startCmd(c)
		case "badger-sync", "badger-nosync", "badger-sync-trace", "badger-sync-trace1", "redis", "redis-replica", "redis-replica-nowait", "redis-cluster", "postgres-sync", "postgres-nosync":
			dataDir = filepath.Join(tmp, "data-"+sp.name)
			if sp.prefill > 0 && strings.HasPrefix(n, "badger") {
				// Filled once, copied for the other Badger twin.
				t0 := time.Now()
				if badgerFilled == "" {
					badgerFilled = filepath.Join(tmp, "prefilled-badger")
					if err := prefillStore(badgerFilled, sp.prefill, ttl); err != nil {
						return fmt.Errorf("%s: prefill: %w", sp.name, err)
					}
				}
				if out, err := exec.Command("cp", "-a", badgerFilled, dataDir).CombinedOutput(); err != nil {
					return fmt.Errorf("%s: copy the prefilled store: %w: %s", sp.name, err, out)
				}
				prefilled("", t0)
			}
			store := fmt.Sprintf("  badger:\n    dir: %s\n    sync_writes: %v\n", dataDir, n == "badger-sync" || isTraced(n))
			switch {
			case n == "redis" || isReplicated(n):
				// Its own server, so that the fresh target's stays fresh.
				raddr, rpid, err := startRedis(filepath.Join(tmp, "redis-"+sp.name), start)
				if err != nil {
					return fmt.Errorf("%s: %w", sp.name, err)
				}
				replicaPID := 0
				if isReplicated(n) {
					if replicaPID, err = startRedisReplica(filepath.Join(tmp, "redis-replica-"+sp.name), start, raddr); err != nil {
						return fmt.Errorf("%s: %w", sp.name, err)
					}
				}
				dataDir = filepath.Join(tmp, "redis-"+sp.name)
				if sp.prefill > 0 {
					t0 := time.Now()
					if err := prefillRedis([]string{raddr}, false, sp.prefill, ttl); err != nil {
						return fmt.Errorf("%s: prefill: %w", sp.name, err)
					}
					fmt.Printf("prefill %s: %d keys in %s, server RSS %.1f MiB\n", sp.name, sp.prefill,
						time.Since(t0).Round(time.Second), mib(procStatus(rpid, "VmRSS")))
				}
				store = fmt.Sprintf("  redis:\n    addrs: [%s]\n", raddr)
				if n == "redis-replica-nowait" {
					store += "    wait_replicas: 0\n"
				}
				storeCPU = func() time.Duration { return cpuTime(rpid) }
				if replicaPID != 0 {
					// The database's CPU is the master's and the replica's.
					storeCPU = func() time.Duration { return cpuTime(rpid) + cpuTime(replicaPID) }
				}
			case n == "redis-cluster":
				// Its own nodes, as the redis target has its own server.
				dataDir = filepath.Join(tmp, "redis-"+sp.name)
				rc, err := startRedisCluster(ps, dataDir, clusterNodes)
				if err != nil {
					return fmt.Errorf("%s: %w", sp.name, err)
				}
				if sp.prefill > 0 {
					t0 := time.Now()
					if err := prefillRedis(rc.addrs, true, sp.prefill, ttl); err != nil {
						return fmt.Errorf("%s: prefill: %w", sp.name, err)
					}
					var rss int64
					for _, pid := range rc.pids {
						rss += procStatus(pid, "VmRSS")
					}
					fmt.Printf("prefill %s: %d keys in %s, servers' RSS %.1f MiB\n", sp.name, sp.prefill,
						time.Since(t0).Round(time.Second), mib(rss))
				}
				store = fmt.Sprintf("  redis:\n    addrs: [%s]\n    cluster: true\n", strings.Join(rc.addrs, ", "))
				// The database's CPU is every node's.
				storeCPU = rc.cpu
			case isPostgres(n):
				// Its own server, so that its CPU time is this target's alone.
				pg, err := startPostgres(pgBin, func(c *exec.Cmd) error { return startCmd(c) })
				if pg != nil {
					// After the processes stopped.
					ps.cleanup(func() {
						if keep {
							fmt.Println("PostgreSQL directory:", pg.dir)
						} else {
							pg.cleanup()
						}
					})
				}
				if err != nil {
					return fmt.Errorf("%s: %w", sp.name, err)
				}
				dataDir = filepath.Join(pg.dir, "data")
				if sp.prefill > 0 {
					t0 := time.Now()
					if err := prefillPostgres(pg.dsn(), sp.prefill, ttl); err != nil {
						return fmt.Errorf("%s: prefill: %w", sp.name, err)
					}
					prefilled(" (the server's whole data directory)", t0)
				}
				sc := map[string]string{"postgres-sync": "on", "postgres-nosync": "off"}[n]
				store = fmt.Sprintf("  postgres:\n    dsn_env: IDEMPROXY_POSTGRES_DSN\n    synchronous_commit: %q\n", sc)
				env = append(env, "IDEMPROXY_POSTGRES_DSN="+pg.dsn())
				postmaster := pg.cmd.Process.Pid
				storeCPU = func() time.Duration { return pgCPUTime(postmaster) }
			}
			if storeCPU == nil && sharedStore(n) {
				return fmt.Errorf("%s: no database CPU to read", sp.name) // a new shared store must say how
			}
			cfg := fmt.Sprintf("listen: %s\nupstream: %s\nstore:\n%sroutes:\n  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n",
				addr, stubURL, store)
			if o.ttl > 0 {
				// ttl > lease > upstream_timeout, as the configuration requires.
				cfg += fmt.Sprintf("    ttl: %s\n    lease: %s\n    upstream_timeout: %s\n", o.ttl, o.ttl/2, o.ttl/4)
			}
			// An admin listener for the allocation counters (/metrics), and
			// with -profile for pprof.
			adminAddr = freeAddr()
			metricsAddr = adminAddr
			cfg += fmt.Sprintf("admin:\n  listen: %s\n  pprof: %v\n", adminAddr, profile != "")
			if isTraced(n) {
				// Its own receiver (otlp.go), a process apart, started first so
				// that it stops after the proxy has flushed its spans into it.
				otlpAddr = freeAddr()
				if err := startCmd(exec.Command(self, "-otlp-listen", otlpAddr)); err != nil {
					return err
				}
				if err := waitListening(otlpAddr); err != nil {
					return fmt.Errorf("%s: OTLP receiver: %w", sp.name, err)
				}
				cfg += "tracing:\n  enabled: true\n"
				env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+otlpAddr, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
				env = append(env, traceSamplers[n]...)
			}
			path := filepath.Join(tmp, sp.name+".yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				return err
			}
			c = pinned(exec.Command(bin, "-config", path, "-log-level", logLevel), o.pin)
			err = startCmd(c, env...)
		default:
			return fmt.Errorf("unknown target %q", n)
		}
		if err != nil {
			return err
		}
		if err := waitListening(addr); err != nil {
			return fmt.Errorf("%s: %w", sp.name, err)
		}
		if err := waitListening(metricsAddr); err != nil {
			return fmt.Errorf("%s: %w", sp.name, err)
		}
		ts = append(ts, &target{name: sp.name, cmd: c, addr: addr, admin: adminAddr, metrics: metricsAddr, pid: c.Process.Pid, dir: dataDir, storeCPU: storeCPU, otlp: otlpAddr})
	}
	if o.prefill > 0 {
		// A prefill leaves hundreds of MB dirty in the page cache (PostgreSQL's
		// 1 GB): written back during the first measurements, it would slow
		// their syncs and take their CPU. Write it all back first.
		settle()
	}
	if o.rate > 0 {
		if err := runOpen(o, ts, stubURL); err != nil {
			return err
		}
		return reportTraces(os.Stdout, ps, ts)
	}

	how := "an in-process Go client"
	if useWrk {
		how = "wrk (" + strconv.Itoa(min(conns, 2)) + " threads)"
	}
	fmt.Printf("load: unique-key POST /charges, %s per measurement, 1 and %d connections, driven by %s; %d round(s), %d CPUs\n",
		d, conns, how, rounds, runtime.NumCPU())
	all := map[string][]result{}
	keys := map[string]int64{} // unique keys sent to each target, warm-ups aside
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	for r := range rounds {
		for _, t := range ts {
			res := result{name: t.name, storeCPU: -1, allocs: -1, allocBytes: -1, syscalls: -1}
			prefix := fmt.Sprintf("%s-%d-%s", nonce, r, t.name)
			// Warm up: connections, the store's first tables.
			warm, err := load(useWrk, t.addr, conns, time.Second, prefix+"-w", tmp)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			t.sent += warm.requests
			var one stats
			if single {
				if one, err = load(useWrk, t.addr, 1, d, prefix+"-1", tmp); err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
			}
			var prof chan error
			if profile != "" && t.admin != "" && r == rounds-1 {
				prof = make(chan error, 1)
				go func() {
					prof <- cpuProfile(t.admin, max(d-time.Second, time.Second), filepath.Join(profile, t.name+".pprof"))
				}()
			}
			alloc0, allocErr := scrapeAllocs(t.metrics)
			sys0 := syscalls(t.pid)
			cpu0 := cpuTime(t.pid)
			var store0 time.Duration
			if t.storeCPU != nil {
				store0 = t.storeCPU()
			}
			var many stats
			if o.sample > 0 {
				many, err = loadSampled(useWrk, t, conns, d, o.sample, prefix+"-n", tmp, keys[t.name]+one.requests)
			} else {
				many, err = load(useWrk, t.addr, conns, d, prefix+"-n", tmp)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			cpu := cpuTime(t.pid) - cpu0
			sys1 := syscalls(t.pid)
			alloc1, err := scrapeAllocs(t.metrics)
			allocErr = errors.Join(allocErr, err)
			var storeCPU time.Duration
			if t.storeCPU != nil {
				storeCPU = t.storeCPU() - store0
			}
			if prof != nil {
				if err := <-prof; err != nil {
					return fmt.Errorf("%s: profile: %w", t.name, err)
				}
			}
			res.rps1, res.p50_1, res.p99_1 = one.rps(), one.p50, one.p99
			res.rpsN, res.p50N, res.p99N = many.rps(), many.p50, many.p99
			res.errors = one.errors + many.errors
			keys[t.name] += one.requests + many.requests
			t.sent += one.requests + many.requests
			if many.requests > 0 {
				res.cpuPerReq = cpu / time.Duration(many.requests)
				if t.storeCPU != nil {
					res.storeCPU = storeCPU / time.Duration(many.requests)
				}
				n := float64(many.requests)
				if allocErr == nil {
					d := alloc1.sub(alloc0)
					res.allocs, res.allocBytes = d.mallocs/n, d.bytes/n
				} else {
					fmt.Fprintf(os.Stderr, "bench: %s: allocations: %v\n", t.name, allocErr)
				}
				if sys0 >= 0 && sys1 >= 0 {
					res.syscalls = float64(sys1-sys0) / n
				}
			}
			res.peakRSS = vmHWM(t.pid)
			all[t.name] = append(all[t.name], res)
			// The stub keeps every charge: forget them between targets.
			forgetCharges(stubURL)
		}
	}
	var out []result
	for _, t := range ts {
		rs := all[t.name]
		sort.Slice(rs, func(i, j int) bool { return rs[i].rpsN < rs[j].rpsN })
		m := rs[len(rs)/2]
		m.peakRSS = vmHWM(t.pid)
		m.anon, m.file = procStatus(t.pid, "RssAnon"), procStatus(t.pid, "RssFile")
		m.keys = keys[t.name]
		out = append(out, m)
	}
	printTable(os.Stdout, out, conns)
	if profile != "" {
		if err := printStages(os.Stdout, profile, out); err != nil {
			return err
		}
	}
	return reportTraces(os.Stdout, ps, ts)
}

func printTable(w io.Writer, rs []result, conns int) {
	var base *result
	for i := range rs {
		if rs[i].name == "bare" {
			base = &rs[i]
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\trps@%d\tvs bare\tp50@1\tp99@1\tp50@%d\tp99@%d\tCPU/req\tvs bare\tallocs/req\tB/req\tsyscalls/req\tDB CPU/req\tpeak RSS\tRSS anon+file at end\tkeys\terrors\t\n", conns, conns, conns)
	for _, r := range rs {
		ratio := func(a, b float64) string {
			if base == nil || b == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", a/b)
		}
		rr, cr := "-", "-"
		if base != nil {
			rr = ratio(r.rpsN, base.rpsN)
			cr = ratio(float64(r.cpuPerReq), float64(base.cpuPerReq))
		}
		db := "-"
		if r.storeCPU >= 0 {
			db = us(r.storeCPU)
		}
		perReq := func(v float64, format string) string {
			if v < 0 {
				return "-"
			}
			return fmt.Sprintf(format, v)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%.0f+%.0f MiB\t%d\t%d\t\n", r.name, r.rpsN, rr,
			ms(r.p50_1), ms(r.p99_1), ms(r.p50N), ms(r.p99N), us(r.cpuPerReq), cr,
			perReq(r.allocs, "%.0f"), perReq(r.allocBytes, "%.0f"), perReq(r.syscalls, "%.1f"), db, float64(r.peakRSS)/(1<<20),
			float64(r.anon)/(1<<20), float64(r.file)/(1<<20), r.keys, r.errors)
	}
	tw.Flush()
	fmt.Fprintln(w, "CPU/req is the measured process's user+system time over the loaded run, divided by its requests;")
	fmt.Fprintln(w, "allocs/req and B/req are the measured process's heap allocations and bytes allocated over the loaded run")
	fmt.Fprintln(w, "(go_memstats_mallocs_total, go_memstats_alloc_bytes_total), syscalls/req its read- and write-family")
	fmt.Fprintln(w, "system calls (syscr+syscw of /proc/<pid>/io: socket and file reads and writes), each divided by its requests;")
	fmt.Fprintln(w, "DB CPU/req is the same for its Redis server, its Redis Cluster (every node's) or its PostgreSQL server")
	fmt.Fprintln(w, "(the postmaster and all its children);")
	fmt.Fprintln(w, "peak RSS is the measured process's VmHWM at the end of all rounds. The stub, the database servers")
	fmt.Fprintln(w, "(except in DB CPU/req) and the load driver are not included.")
}

// sharedStore says whether a target's store is a database server, whose
// CPU per request its row shows (DB CPU/req).
func sharedStore(name string) bool { return isRedis(name) || isPostgres(name) }

// isPostgres says whether a target name is one of the PostgreSQL targets.
func isPostgres(name string) bool { return name == "postgres-sync" || name == "postgres-nosync" }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

// stats is one load run's result.
type stats struct {
	requests int64
	errors   int64 // transport errors and statuses other than 201
	elapsed  time.Duration
	p50, p99 time.Duration
}

func (s stats) rps() float64 { return float64(s.requests) / s.elapsed.Seconds() }

func load(useWrk bool, addr string, conns int, d time.Duration, prefix, tmp string) (stats, error) {
	if useWrk {
		return loadWrk(addr, conns, d, prefix, tmp)
	}
	return loadGo(addr, conns, d, prefix)
}

// wrkScript sends unique-key charges (one key space per thread) and prints
// its summary as one line that loadWrk parses.
const wrkScript = `
local threads = {}
local counter = 0
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  prefix = args[1]
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  counter = counter + 1
  return wrk.format(nil, "/charges", nil,
    '{"orderId": "' .. prefix .. '-' .. tid .. '-' .. counter .. '", "amount": 10, "sentAt": "2026-12-01T10:00:00Z"}')
end
local bad = 0
function response(status, headers, body)
  if status ~= 201 then bad = bad + 1 end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH %d %d %d %d %d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout + e.status, latency:percentile(50), latency:percentile(99)))
end
`

func loadWrk(addr string, conns int, d time.Duration, prefix, tmp string) (stats, error) {
	script := filepath.Join(tmp, "charges.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o600); err != nil {
		return stats{}, err
	}
	threads := min(conns, 2)
	out, err := exec.Command("wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%ds", int(d.Seconds())), "--timeout", "10s", "-s", script,
		"http://"+addr, "--", prefix).CombinedOutput()
	if err != nil {
		return stats{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 6 && f[0] == "BENCH" {
			n := make([]int64, 5)
			for i := range n {
				n[i], _ = strconv.ParseInt(f[i+1], 10, 64)
			}
			return stats{requests: n[0], elapsed: time.Duration(n[1]) * time.Microsecond, errors: n[2],
				p50: time.Duration(n[3]) * time.Microsecond, p99: time.Duration(n[4]) * time.Microsecond}, nil
		}
	}
	return stats{}, fmt.Errorf("wrk printed no summary:\n%s", out)
}

func loadGo(addr string, conns int, d time.Duration, prefix string) (stats, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs atomic.Int64
		wg   sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	begin := time.Now()
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; ctx.Err() == nil; i++ {
				body := fmt.Sprintf(`{"orderId": "%s-%d-%d", "amount": 10, "sentAt": "2026-12-01T10:00:00Z"}`, prefix, w, i)
				t0 := time.Now()
				resp, err := c.Post("http://"+addr+"/charges", "application/json", strings.NewReader(body))
				if err != nil {
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					errs.Add(1)
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(begin)
	if len(lats) == 0 {
		return stats{}, errors.New("no request completed")
	}
	slices.Sort(lats)
	return stats{requests: int64(len(lats)), errors: errs.Load(), elapsed: el,
		p50: lats[len(lats)/2], p99: lats[len(lats)*99/100]}, nil
}

// loadSampled is load in pieces of at most every, printing a sample of t
// after each; sent is the number of keys sent to t before. The latencies
// are the worst piece's.
func loadSampled(useWrk bool, t *target, conns int, d, every time.Duration, prefix, tmp string, sent int64) (stats, error) {
	var all stats
	for i := 0; d-all.elapsed >= time.Second; i++ {
		s, err := load(useWrk, t.addr, conns, min(every, d-all.elapsed), fmt.Sprintf("%s%d", prefix, i), tmp)
		if err != nil {
			return all, err
		}
		all.requests += s.requests
		all.errors += s.errors
		all.elapsed += s.elapsed
		all.p50, all.p99 = max(all.p50, s.p50), max(all.p99, s.p99)
		size, alloc := dirSize(t.dir)
		fmt.Printf("sample %s: %s, %d keys sent, data dir %.1f MiB (%.1f MiB allocated), RssAnon %.1f MiB, RssFile %.1f MiB, VmHWM %.1f MiB\n",
			t.name, all.elapsed.Round(time.Second), sent+all.requests, mib(size), mib(alloc),
			mib(procStatus(t.pid, "RssAnon")), mib(procStatus(t.pid, "RssFile")), mib(vmHWM(t.pid)))
	}
	return all, nil
}

// dirSize is the sum of the sizes of the files under dir, and of the
// blocks allocated to them (files may be sparse); zero when there is no dir.
func dirSize(dir string) (size, alloc int64) {
	if dir == "" {
		return 0, 0
	}
	filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil // files come and go under compaction
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		size += fi.Size()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			alloc += st.Blocks * 512
		}
		return nil
	})
	return size, alloc
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// cpuTime is a process's user+system CPU time so far.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	// The command name may contain spaces: fields count from after ')'.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clkTck
}

// vmHWM is a process's peak resident set size, in bytes.
func vmHWM(pid int) int64 { return procStatus(pid, "VmHWM") }

// procStatus reads one kB field of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) int64 {
	return kBField(fmt.Sprintf("/proc/%d/status", pid), field)
}

// kBField reads the field "name: N kB" of a /proc file such as
// /proc/meminfo, in bytes; 0 when there is none.
func kBField(path, field string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitListening waits until something accepts connections on addr. Its
// deadline is generous: a target starts in well under a second on an idle
// machine, but on a busy one (CI's test run, other packages' tests on both
// cores) a Redis Cluster target took more than 20 s (CI on fe1591b).
func waitListening(addr string) error {
	const within = 90 * time.Second
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening within %s", addr, within)
}

// benchToken is the admin token of the profiled targets.
const benchToken = "bench"

// cpuProfile fetches a CPU profile of d from an idemproxy admin listener
// into path.
func cpuProfile(admin string, d time.Duration, path string) error {
	req, err := http.NewRequest("GET", fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
