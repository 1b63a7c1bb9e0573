//go:build linux

// Command chaos drives the real idemproxy binaries through random faults and
// checks what happened with a checker that trusts only the upstream's
// statement and the recorded history (issue 18, docs/chaos.md).
//
// It builds idemproxy and the upstream stub, starts on loopback the stub, one
// idemproxy on Badger, three replicas sharing a Redis (a master with the
// append-only file, its replica and a Sentinel, which the replicas ask for
// the master) and two sharing a PostgreSQL (a primary and a synchronous
// standby, both in the replicas' connection string), with TCP fault proxies
// between the proxies and the stub and in front of every store node. A
// population of clients (go-retryablehttp, plus raw duplicate deliveries
// and storms of one key) charges new orders while faults drawn from the
// seed hit the stub, the network, the processes and the stores, failovers
// included. Then the faults stop, the keys settle, every key is probed once
// more, and the checker reads the history and the stub's statement.
//
// Usage:
//
//	go run ./chaos [-seed N] [-duration 60s] [-out DIR] [-stores badger,redis,postgres] [-clients 4]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/chaos/check"
)

// waitAuto is -redis-wait-replicas auto.
const waitAuto = -1

// The run's timing: short, so that keys settle quickly after the faults.
const (
	upstreamTimeout = time.Second
	lease           = 6 * time.Second
	grace           = 7 * time.Second
	shutdownTimeout = 2 * time.Second
	// discoveryInterval is how often a proxy scans for in-doubt keys that
	// have no reconcile schedule (those left by a crash).
	discoveryInterval = time.Minute
	// defaultInterval is the mean gap between two faults (-fault-interval).
	defaultInterval = 300 * time.Millisecond
)

func main() {
	os.Exit(mainExit(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	seed     int64
	duration time.Duration
	out      string
	stores   []string
	clients  int
	keep     bool
	kinds    []string      // the fault kinds to draw from; nil: every kind the run can inject
	interval time.Duration // the mean time between two faults; zero: 2s
	// writeback is the share of the pages not synced that a power cut
	// keeps anyway (powerloss.Options.Writeback); zero drops them all.
	writeback float64
	harsh     bool // power-loss: only a directory's own fsync makes its names durable
	// detectWithin is how long after a partial loss the proxies may take
	// to refuse (-detect-within).
	detectWithin time.Duration
	// redisWait is store.redis.wait_replicas of the Redis replicas: how
	// many replicas acknowledge a write before it counts; zero writes to
	// the master alone, and a failover may lose what it acknowledged;
	// waitAuto (auto) waits whenever the master reports a replica
	// connected.
	redisWait int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var stores string
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Int64Var(&o.seed, "seed", 0, "the seed of the fault schedule and the clients (0: a random one, printed)")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long clients run and faults are injected")
	fs.StringVar(&o.out, "out", "", "the folder for the history, logs and visualisation (default: a folder named after the seed in the temporary directory, removed when the run passes)")
	fs.StringVar(&stores, "stores", "badger,redis,postgres", "the stores to run proxies on: badger (one proxy), redis (three replicas), postgres (two replicas)")
	fs.IntVar(&o.clients, "clients", 4, "client goroutines (each a retrying client, duplicate deliveries, storms)")
	fs.BoolVar(&o.keep, "keep", false, "keep the folder when the run passes")
	fs.DurationVar(&o.interval, "fault-interval", defaultInterval, "the mean time between the end of a fault and the start of the next (longer lets a Badger proxy reach its 30 s checkpoint between power cuts)")
	o.redisWait = 1
	fs.Func("redis-wait-replicas", "store.redis.wait_replicas of the Redis replicas (default 1): every write waits for the replica, and a Redis failover is held to every property; 0: a write is acknowledged by the master alone, and a key a Redis failover loses is counted, not a violation; auto: writes wait while the master reports its replica connected (a replica cut off, redis-failover-lagging, loses what the master acknowledged alone, which the canaries must catch)", func(v string) error {
		if v == "auto" {
			o.redisWait = waitAuto
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1 {
			return fmt.Errorf("must be 0, 1 (the run's Redis has one replica) or auto, got %q", v)
		}
		o.redisWait = n
		return nil
	})
	fs.Float64Var(&o.writeback, "writeback", 0, "power-loss: the share, 0 to 1, of the pages written and not synced that survive a power cut anyway, drawn at random (the kernel's writeback); 0 drops them all")
	fs.DurationVar(&o.detectWithin, "detect-within", defaultDetectWithin, "partial losses: how long after the loss every proxy of the store must refuse; a retry before, on a replica that cannot know the key, may be charged again (counted, not a violation)")
	fs.BoolVar(&o.harsh, "harsh", false, "power-loss: only a directory's own fsync makes the names in it durable (not any fsync, as ext4's journal does)")
	var kinds string
	fs.StringVar(&kinds, "faults", "", "only these fault kinds, comma-separated, e.g. redis-lost-keys,postgres-lost-keys; \"default\" stands for the default kinds, \"slow\" for the failovers and the pauses past the lease, \"partial\" for the stores that lose some keys (redis-evict, redis-failover-lagging, postgres-restore-old) and proxy-reload-rename (default: every kind the stores allow, but the slow ones, the partial ones and power-loss, which puts Badger's data directory on a FUSE mount and runs only when named)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for s := range strings.SplitSeq(stores, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "badger", "redis", "postgres":
			if !slices.Contains(o.stores, s) {
				o.stores = append(o.stores, s)
			}
		case "":
		default:
			return o, fmt.Errorf("-stores: unknown store %q (badger, redis, postgres)", s)
		}
	}
	if len(o.stores) == 0 {
		return o, errors.New("-stores: name at least one store")
	}
	if o.duration < 5*time.Second {
		return o, fmt.Errorf("-duration must be at least 5s, got %v", o.duration)
	}
	if o.detectWithin <= 0 {
		return o, fmt.Errorf("-detect-within must be positive, got %v", o.detectWithin)
	}
	if o.interval <= 0 {
		return o, fmt.Errorf("-fault-interval must be positive, got %v", o.interval)
	}
	if o.writeback < 0 || o.writeback > 1 {
		return o, fmt.Errorf("-writeback must be between 0 and 1, got %v", o.writeback)
	}
	if o.clients < 1 || o.clients > 64 {
		return o, fmt.Errorf("-clients must be between 1 and 64, got %d", o.clients)
	}
	for k := range strings.SplitSeq(kinds, ",") {
		if k = strings.TrimSpace(k); k != "" {
			o.kinds = append(o.kinds, k)
		}
	}
	if o.seed == 0 {
		o.seed = rand.Int64N(1<<53) + 1
	}
	return o, nil
}

func mainExit(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	explicit := o.out != ""
	if !explicit {
		o.out = filepath.Join(os.TempDir(), fmt.Sprintf("idemproxy-chaos-%d", o.seed))
	}
	fmt.Fprintf(stdout, "chaos: seed %d, duration %v, stores %s, folder %s\n", o.seed, o.duration, strings.Join(o.stores, ","), o.out)
	r := &run{opts: o, out: o.out, log: stdout}
	defer r.stopAll() // also on a panic; stopping twice does nothing
	violations, err := r.execute(ctx)
	r.stopAll()
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v\n", err)
		fmt.Fprintf(stdout, "chaos: history and logs in %s\n", o.out)
		return 1
	}
	faults, kinds, byKind := r.inj.summary()
	fmt.Fprintf(stdout, "faults by kind:\n%s", byKind)
	if violations > 0 {
		fmt.Fprintf(stdout, "chaos: history, logs and visualisation in %s\n", o.out)
	} else if !explicit && !o.keep {
		os.RemoveAll(o.out)
	}
	fmt.Fprintf(stdout, "chaos: seed %d, %d operations, %d faults of %d kinds, %d violations\n", o.seed, r.nops, faults, kinds, violations)
	if violations > 0 {
		return 1
	}
	return 0
}

// proxyProc is one idemproxy process of the run.
type proxyProc struct {
	*proc
	store  string // badger or redis
	starts int    // the processes startProxy started, the failed included
	addr   string
	admin  string
	config string
}

// run is one chaos run: its processes, fault layers and history.
type run struct {
	opts options
	out  string
	log  io.Writer

	bin       string // the folder of the built binaries
	stub      *proc
	stubURL   string
	upFault   *faultProxy
	stores    []*storeSrv // the shared store servers: redis, postgres
	proxies   []*proxyProc
	badgerDir string
	tmpfs     bool
	diskDir   string     // where the tmpfs is mounted: badgerDir, or with power-loss the disk under the mount
	power     *powerDisk // power-loss: badgerDir is its mount
	reloads   int

	inj       *injector
	rec       *recorder
	losses    []check.Loss     // guarded by mu
	cuts      []check.Cut      // guarded by mu
	starts    []check.Start    // guarded by mu
	failovers []check.Failover // guarded by mu
	outages   []check.Outage   // guarded by mu
	// storeFault is when the last process fault of each store began,
	// from which a failover it caused may have lost writes (mu).
	storeFault map[string]int64
	res        check.Result // the checker's verdict, once the run is over
	nops       int
	errs       []string // process faults that did not recover
	mu         sync.Mutex
}

var routes = []routeSpec{
	{name: "charges", short: "c", check: check.Route{Policy: check.ReserveThenCommit, Reconcile: true}, request: jsonCharge("")},
	{name: "charges-wait", short: "w", check: check.Route{Policy: check.ReserveThenCommit}, request: jsonCharge("wait.chaos")},
	{name: "order-charges", short: "o", check: check.Route{Policy: check.ReleaseOn5xx}, request: pathCharge},
}

func (r *run) execute(ctx context.Context) (int, error) {
	r.inj = &injector{r: r, applied: map[string]int{}}
	if err := os.RemoveAll(r.out); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Join(r.out, "bin"), 0o755); err != nil {
		return 0, err
	}
	if err := r.build(ctx); err != nil {
		return 0, err
	}
	if err := r.setup(ctx); err != nil {
		return 0, err
	}
	rec := &recorder{start: time.Now()}
	r.rec = rec
	h := check.History{Seed: r.opts.seed, Routes: map[string]check.Route{}, StartUnixNano: rec.start.UnixNano()}
	for _, rt := range routes {
		h.Routes[rt.name] = rt.check
	}
	h.Baseline = r.samples(ctx)

	// The schedule and the clients' choices come from the seed.
	rng := rand.New(rand.NewPCG(uint64(r.opts.seed), 0x1d3))
	kinds, err := r.chosenKinds()
	if err != nil {
		return 0, err
	}
	interval := r.opts.interval
	if interval <= 0 {
		interval = defaultInterval
	}
	sched := schedule(rng, r.opts.duration, interval, kinds, len(r.proxies))
	var sb strings.Builder
	for _, f := range sched {
		fmt.Fprintln(&sb, f)
	}
	if err := os.WriteFile(filepath.Join(r.out, "schedule.txt"), []byte(sb.String()), 0o644); err != nil {
		return 0, err
	}
	fmt.Fprintf(r.log, "chaos: %d faults scheduled over %v among %d kinds (schedule.txt)\n", len(sched), r.opts.duration, len(kinds))

	var clusters []cluster
	for _, s := range r.opts.stores {
		c := cluster{short: s[:1]}
		for _, p := range r.proxies {
			if p.store == s {
				c.proxies = append(c.proxies, target{name: p.name, addr: p.addr})
			}
		}
		clusters = append(clusters, c)
	}
	w := newWorkload(rec, clusters, routes)
	wctx, stopWatch := context.WithCancel(ctx)
	var watchers sync.WaitGroup
	if s := r.store("redis"); s != nil {
		watchers.Add(1)
		go func() { defer watchers.Done(); r.watchRedis(wctx, s) }()
	}
	defer stopWatch()
	load, endLoad := context.WithTimeout(ctx, r.opts.duration)
	defer endLoad()
	var wg sync.WaitGroup
	for i := range r.opts.clients {
		crng := rand.New(rand.NewPCG(uint64(r.opts.seed), uint64(i+1)))
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx, load, crng) }()
	}
	start := time.Now()
	for _, f := range sched {
		sleep(load, time.Until(start.Add(f.At)))
		if load.Err() != nil {
			break
		}
		if err := r.inj.apply(load, f); err != nil {
			r.recordErr(fmt.Sprintf("fault %s: %v", f, err))
		}
	}
	<-load.Done()
	wg.Wait()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	fmt.Fprintf(r.log, "chaos: load and faults stopped after %v; healing and settling\n", time.Since(start).Round(time.Second))
	if err := r.inj.heal(ctx); err != nil {
		r.recordErr(fmt.Sprintf("heal: %v", err))
	}

	r.probe(ctx, w)
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	w.base.CloseIdleConnections()
	time.Sleep(time.Second)
	stopWatch()
	watchers.Wait()
	h.Final = r.samples(ctx)
	h.Ops = rec.snapshot()
	r.nops = len(h.Ops)
	r.mu.Lock()
	h.Losses = r.losses
	h.Cuts = r.cuts
	h.Starts = r.starts
	h.Failovers = r.failovers
	h.Outages = r.outages
	r.mu.Unlock()

	stmt, raw, err := r.statement(ctx)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(r.out, "statement.json"), raw, 0o644); err != nil {
		return 0, err
	}
	if err := check.WriteJSON(filepath.Join(r.out, "history.json"), h); err != nil {
		return 0, err
	}
	res := check.Check(h, stmt, check.Options{Dir: r.out})
	r.res = res
	vs := res.Violations
	for _, e := range r.errs {
		vs = append(vs, check.Violation{Property: check.PropLiveness, Msg: e})
	}
	var vb strings.Builder
	for _, v := range vs {
		fmt.Fprintln(&vb, v)
	}
	if err := os.WriteFile(filepath.Join(r.out, "violations.txt"), []byte(vb.String()), 0o644); err != nil {
		return 0, err
	}
	for i, v := range vs {
		if i == 20 {
			fmt.Fprintf(r.log, "... and %d more (violations.txt)\n", len(vs)-20)
			break
		}
		fmt.Fprintf(r.log, "violation: %s\n", v)
	}
	if res.Visualisation != "" {
		fmt.Fprintf(r.log, "chaos: linearizability visualisation in %s\n", res.Visualisation)
	}
	fmt.Fprintf(r.log, "chaos: %d keys, %d charges in the statement; %d keys answered in doubt, %d resolved by the reconciler\n", res.Keys, len(stmt), res.InDoubt, res.Reconciled)
	if len(h.Losses) > 0 {
		fmt.Fprintf(r.log, "chaos: %d store losses: %d keys sent before a loss, %d of them charged again after it was accepted\n",
			len(h.Losses), res.Exposed, res.Recharged)
	}
	if n, seen := partialLosses(h.Losses); n > 0 {
		fmt.Fprintf(r.log, "chaos: %d partial losses (%d marked lost by a proxy): %d keys retried between a loss and the end of its detection window (%v), %d of them charged again by such a retry\n",
			n, seen, res.WindowRetried, r.opts.detectWithin, res.WindowRecharged)
	}
	if len(h.Cuts) > 0 {
		fmt.Fprintf(r.log, "chaos: %v\n", res.Cuts)
	}
	for _, name := range []string{"redis", "postgres"} {
		n, lossy := 0, 0
		for _, f := range h.Failovers {
			if f.Store == name {
				n++
				if f.Lossy {
					lossy++
				}
			}
		}
		if n > 0 {
			fmt.Fprintf(r.log, "chaos: %d %s failovers (%d of them without wait_replicas)\n", n, name, lossy)
		}
	}
	if res.FailoverExposed > 0 {
		fmt.Fprintf(r.log, "chaos: %d keys written around a Redis failover without wait_replicas; %d keys charged again after a Redis failover without wait_replicas\n",
			res.FailoverExposed, res.FailoverRecharged)
	}
	return len(vs), nil
}

func (r *run) recordErr(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, s)
	fmt.Fprintf(r.log, "chaos: %s\n", s)
}

// store returns the store server named name.
func (r *run) store(name string) *storeSrv {
	for _, s := range r.stores {
		if s.name == name {
			return s
		}
	}
	return nil
}

// chosenKinds returns the kinds of -faults, each one this run can inject,
// or the default kinds (every kind it can but the slow and the partial
// ones) when -faults is empty. In -faults, "default" stands for the
// default kinds, "slow" for the slow ones (the failovers, the pauses past
// the lease), "partial" for the partial losses and the rename by reload.
func (r *run) chosenKinds() ([]string, error) {
	all := r.kinds()
	var fast, slowKinds, partialKinds []string
	for _, k := range all {
		switch {
		case partial(k):
			partialKinds = append(partialKinds, k)
		case slow(k):
			slowKinds = append(slowKinds, k)
		default:
			fast = append(fast, k)
		}
	}
	if len(r.opts.kinds) == 0 {
		return fast, nil
	}
	var out []string
	for _, k := range r.opts.kinds {
		var add []string
		switch {
		case k == "default":
			add = fast
		case k == "slow":
			add = slowKinds
		case k == partialSet:
			add = partialKinds
		case slices.Contains(all, k):
			add = []string{k}
		default:
			return nil, fmt.Errorf("-faults: this run cannot inject %q; it can: %s (default: every one but %s)", k, strings.Join(all, ", "), strings.Join(append(slowKinds, partialKinds...), ", "))
		}
		for _, a := range add {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// slow reports whether a fault of kind k takes many seconds (a failover and
// the rebuild of a standby, a pause past the lease): the default run, which
// aims at many faults a minute, leaves them out.
func slow(k string) bool { return strings.HasSuffix(k, failover) || outlastsLease(k) }

// kinds returns the fault kinds this run can inject.
func (r *run) kinds() []string {
	k := []string{kFailBefore, kFailAfter, kDelay, kDrop, k429, kStallPastLease, kUpLatency, kUpReset, kUpBlackhole, kUpSlowClose, kUpStall, kKill, kTerm, kHup}
	for _, s := range r.stores {
		k = append(k, "net-"+s.name+"-latency", "net-"+s.name+"-reset", "net-"+s.name+"-blackhole",
			"net-"+s.name+"-stall", s.name+"-kill-restart", s.name+"-sigstop", s.name+pastLease, s.name+lostKeys, s.name+failover)
	}
	k = append(k, kReloadRename)
	if r.store("redis") != nil {
		k = append(k, kEvict, kLagging)
	}
	if r.store("postgres") != nil {
		k = append(k, kRestoreOld)
	}
	if r.tmpfs {
		k = append(k, kDiskFull)
	}
	if r.power != nil {
		k = append(k, kPowerLoss)
	}
	return k
}

// build builds idemproxy and the upstream stub from the module the command
// runs in.
func (r *run) build(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return fmt.Errorf("find the module (run it from the repository): %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	r.bin = filepath.Join(r.out, "bin")
	for _, b := range [][2]string{{"idemproxy", "."}, {"upstream-stub", "./upstream-stub"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(r.bin, b[0]), b[1])
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return nil
}

func (r *run) setup(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	stubAddr := "127.0.0.1:" + strconv.Itoa(port)
	r.stubURL = "http://" + stubAddr
	r.stub = &proc{name: "stub", bin: filepath.Join(r.bin, "upstream-stub"), args: []string{"-listen", stubAddr}, log: filepath.Join(r.out, "stub.log")}
	if err := r.stub.start(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, r.stubURL+"/healthz", 10*time.Second); err != nil {
		return err
	}
	if r.upFault, err = newFaultProxy(stubAddr); err != nil {
		return err
	}

	for _, name := range []string{"redis", "postgres"} {
		if !slices.Contains(r.opts.stores, name) {
			continue
		}
		start := r.startRedis
		if name == "postgres" {
			start = r.startPostgres
		}
		srv, err := start(ctx)
		if srv != nil {
			r.stores = append(r.stores, srv)
		}
		if err != nil {
			return err
		}
	}

	if slices.Contains(r.opts.stores, "badger") {
		r.badgerDir = filepath.Join(r.out, "badger")
		r.diskDir = r.badgerDir
		size := "128m"
		power := slices.Contains(r.opts.kinds, kPowerLoss)
		if power {
			// The tmpfs is the disk under the power-loss mount, which
			// keeps beside the live files the copies last synced.
			r.diskDir, size = filepath.Join(r.out, "badger-disk"), "320m"
		}
		if err := os.MkdirAll(r.diskDir, 0o755); err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", r.diskDir).CombinedOutput()
			if err == nil {
				r.tmpfs = true
			} else {
				fmt.Fprintf(r.log, "chaos: no tmpfs for Badger (%v: %s): no disk-full faults\n", err, strings.TrimSpace(string(out)))
			}
		} else {
			fmt.Fprintln(r.log, "chaos: not root: no tmpfs for Badger, no disk-full faults")
		}
		if power {
			data := filepath.Join(r.diskDir, "data")
			if err := os.MkdirAll(data, 0o755); err != nil {
				return err
			}
			if r.power, err = newPowerDisk(data, r.badgerDir, powerOptions(r.opts)); err != nil {
				return fmt.Errorf("-faults %s: %w", kPowerLoss, err)
			}
		}
		if err := r.addProxy("b0", "badger"); err != nil {
			return err
		}
	}
	for _, srv := range r.stores {
		n := 3 // Redis replicas
		if srv.name == "postgres" {
			n = 2
		}
		for i := range n {
			if err := r.addProxy(fmt.Sprintf("%c%d", srv.name[0], i), srv.name); err != nil {
				return err
			}
		}
	}
	for _, p := range r.proxies {
		if err := r.startProxy(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) addProxy(name, store string) error {
	a, err := freePort()
	if err != nil {
		return err
	}
	b, err := freePort()
	if err != nil {
		return err
	}
	p := &proxyProc{
		proc:   &proc{name: name, bin: filepath.Join(r.bin, "idemproxy"), log: filepath.Join(r.out, name+".log")},
		store:  store,
		addr:   "127.0.0.1:" + strconv.Itoa(a),
		admin:  "127.0.0.1:" + strconv.Itoa(b),
		config: filepath.Join(r.out, name+".yaml"),
	}
	p.args = []string{"-config", p.config}
	if store == "postgres" {
		p.env = []string{"IDEMPROXY_POSTGRES_DSN=" + r.store("postgres").pgDSN()}
	}
	r.proxies = append(r.proxies, p)
	return r.writeConfig(p)
}

// startProxy starts p and waits until it is ready. A proxy that exits while
// starting (its store unreachable at that moment) is started again, as a
// supervisor would, for up to a minute.
func (r *run) startProxy(ctx context.Context, p *proxyProc) error {
	deadline := time.Now().Add(time.Minute)
	if err := r.start(p); err != nil {
		return err
	}
	for {
		err := waitHTTP(ctx, "http://"+p.admin+"/readyz", 2*time.Second)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		if !p.running() {
			if err := r.start(p); err != nil {
				return err
			}
		}
	}
}

// start starts p's process and records the start in the history: the
// process's memory of the keys it answered begins empty.
func (r *run) start(p *proxyProc) error {
	p.starts++
	if r.rec != nil {
		r.mu.Lock()
		r.starts = append(r.starts, check.Start{Proxy: p.name, At: r.rec.now()})
		r.mu.Unlock()
	}
	return p.start()
}

// writeConfig writes p's configuration. Each reload alternates the wait
// routes' wait_timeout, so that a SIGHUP has something to apply.
func (r *run) writeConfig(p *proxyProc) error { return r.writeRoutes(p, "charges") }

// writeRoutes writes p's configuration with the route charges named
// charges (proxy-reload-rename renames it).
func (r *run) writeRoutes(p *proxyProc, charges string) error {
	var store string
	switch p.store {
	case "badger":
		store = fmt.Sprintf("  badger:\n    dir: %s\n    sync_writes: true\n    min_free_bytes: 8388608\n", r.badgerDir)
	case "redis":
		store = fmt.Sprintf("  redis:\n    addrs: [%s]\n    master_name: %s\n    key_prefix: \"chaos:\"\n    op_timeout: 500ms\n",
			r.store("redis").sentinelAddr(), sentinelMaster)
		// Written even when 0: the default is auto once the proxies have it.
		if r.opts.redisWait == waitAuto {
			store += "    wait_replicas: auto\n"
		} else {
			store += fmt.Sprintf("    wait_replicas: %d\n", r.opts.redisWait)
		}
	case "postgres":
		store = "  postgres:\n    dsn_env: IDEMPROXY_POSTGRES_DSN\n    max_conns: 8\n    statement_timeout: 500ms\n"
	}
	wait := 2 + r.reloads%2
	y := fmt.Sprintf(`listen: %s
upstream: http://%s
admin:
  listen: %s
store:
%sserver:
  shutdown_timeout: %v
routes:
  - name: %s
    match: POST /charges
    key: {json: orderId}
    policy: reserve-then-commit
    concurrent: reject
    ttl: 1h
    lease: %v
    upstream_timeout: %v
    reconcile:
      lookup: GET /orders/{key}/charge
      grace: %v
      interval: 1s
  - name: charges-wait
    match: POST wait.chaos/charges
    key: {json: orderId}
    policy: reserve-then-commit
    concurrent: wait
    wait_timeout: %ds
    ttl: 1h
    lease: %v
    upstream_timeout: %v
  - name: order-charges
    match: POST /orders/{orderId}/charges
    key: {path: orderId}
    policy: release-on-5xx
    concurrent: wait
    wait_timeout: %ds
    ttl: 1h
    lease: %v
    upstream_timeout: %v
`, p.addr, r.upFault.addr(), p.admin, store, shutdownTimeout, charges, lease, upstreamTimeout, grace, wait, lease, upstreamTimeout, wait, lease, upstreamTimeout)
	return os.WriteFile(p.config, []byte(y), 0o644)
}

// probe waits for the keys to settle, then sends every key once more; a key
// that is not settled yet (in flight, 503, in doubt on the route that
// reconciles) is probed again until the bound: lease and grace, plus the
// scan that finds keys a crash left in doubt. The checker reads the last
// probe of each key.
func (r *run) probe(ctx context.Context, w *workload) {
	sleep(ctx, lease+grace+time.Second)
	deadline := time.Now().Add(lease + grace + discoveryInterval + 10*time.Second)
	keys := w.keys
	rng := rand.New(rand.NewPCG(uint64(r.opts.seed), 0xb0b))
	for round := 0; len(keys) > 0 && ctx.Err() == nil; round++ {
		var mu sync.Mutex
		var again []keyRef
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for _, k := range keys {
			t := pick(rng, k.cluster)
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if !w.probe(ctx, k, t) {
					mu.Lock()
					again = append(again, k)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if round == 0 {
			fmt.Fprintf(r.log, "chaos: probed %d keys, %d not settled yet\n", len(keys), len(again))
		}
		keys = again
		if len(keys) == 0 || time.Now().After(deadline) {
			return
		}
		sleep(ctx, 2*time.Second)
	}
}

// samples reads every proxy's readiness, goroutines and heap.
func (r *run) samples(ctx context.Context) []check.Sample {
	var out []check.Sample
	for _, p := range r.proxies {
		s := check.Sample{Proxy: p.name}
		if resp, err := metricsClient.Get("http://" + p.admin + "/readyz"); err == nil {
			s.Ready = resp.StatusCode == 200
			resp.Body.Close()
		}
		m := metrics(p.admin)
		s.Goroutines, s.HeapBytes = m["go_goroutines"], m["go_memstats_heap_inuse_bytes"]
		out = append(out, s)
	}
	return out
}

var metricsClient = &http.Client{Timeout: 2 * time.Second}

// metrics reads the metrics without labels of the admin listener at
// admin; an empty map when it does not answer.
func metrics(admin string) map[string]float64 {
	out := map[string]float64{}
	resp, err := metricsClient.Get("http://" + admin + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// statement reads the stub's statement.
func (r *run) statement(ctx context.Context) (check.Statement, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", r.stubURL+"/charges", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("read the statement: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("read the statement: %w", err)
	}
	st, err := check.ParseStatement(raw)
	return st, raw, err
}

// stopAll stops every process the run started, and the fault layers.
func (r *run) stopAll() {
	var wg sync.WaitGroup
	for _, p := range r.proxies {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(shutdownTimeout + 3*time.Second) }()
	}
	wg.Wait()
	for _, srv := range r.stores {
		for _, p := range srv.procs() {
			p.kill()
		}
	}
	if r.stub != nil {
		r.stub.stop(5 * time.Second)
	}
	if r.upFault != nil {
		r.upFault.close()
	}
	for _, srv := range r.stores {
		srv.eachFault((*faultProxy).close)
	}
	if r.power != nil {
		if err := r.power.close(); err != nil {
			fmt.Fprintf(r.log, "chaos: unmount the power-loss file system: %v\n", err)
		}
	}
	if r.tmpfs {
		args := []string{r.diskDir}
		if r.power != nil {
			// The FUSE server of a mount whose power was cut may still hold
			// files of its working copy open: detach, the memory goes when
			// they close.
			args = []string{"-l", r.diskDir}
		}
		if out, err := exec.Command("umount", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(r.log, "chaos: umount %s: %v: %s\n", r.diskDir, err, out)
		} else {
			r.tmpfs = false
		}
	}
}
