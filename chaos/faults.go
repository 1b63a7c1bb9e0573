//go:build linux

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/chaos/check"
)

// The fault kinds.
const (
	kFailBefore  = "stub-fail-before-charge"
	kFailAfter   = "stub-fail-after-charge"
	kDelay       = "stub-delay-past-timeout"
	kDrop        = "stub-drop-after-charge"
	k429         = "stub-reject-429"
	kUpLatency   = "net-upstream-latency"
	kUpReset     = "net-upstream-reset"
	kUpBlackhole = "net-upstream-blackhole"
	kUpSlowClose = "net-upstream-slow-close"
	kUpStall     = "net-upstream-stall"
	kKill        = "proxy-kill-9"
	kTerm        = "proxy-sigterm"
	kHup         = "proxy-sighup-reload"
	kDiskFull    = "badger-disk-full"
	kPowerLoss   = "power-loss" // the Badger proxy's disk loses what was not synced
	// kStallPastLease holds the upstream's answer (the charge recorded)
	// past the lease: the key goes in doubt and the reconciler resolves it.
	kStallPastLease = "stub-stall-past-lease"
	// The faults of a shared store server S (redis, postgres) are
	// net-S-latency, net-S-reset, net-S-blackhole, net-S-stall, S-kill-restart,
	// S-sigstop, S-sigstop-past-lease, S-lost-keys and S-failover.
)

// The suffixes of the store faults that outlast the lease, and of the
// failovers.
const (
	pastLease = "-sigstop-past-lease"
	failover  = "-failover"
)

// instant reports whether a fault of kind k is over as soon as it is
// applied (queued in the stub, a reset, a signal): the next one may follow
// at once.
func instant(k string) bool {
	switch k {
	case kFailBefore, kFailAfter, kDelay, kDrop, k429, kStallPastLease, kUpReset, kHup, kReloadRename,
		"net-redis-reset", "net-postgres-reset":
		return true
	}
	return false
}

// outlastsLease reports whether a fault of kind k lasts longer than the
// lease.
func outlastsLease(k string) bool { return strings.HasSuffix(k, pastLease) }

// lostKeys is the suffix of the fault kind that makes a shared store forget
// every key (redis-lost-keys: restarted empty; postgres-lost-keys: its table
// truncated). The operator accepts the loss when the fault's duration is
// over.
const lostKeys = "-lost-keys"

// fault is one entry of the schedule: what to do, when, for how long, to
// whom. The schedule is drawn from the seed before the run starts.
type fault struct {
	At     time.Duration
	Kind   string
	For    time.Duration // how long the fault lasts, for those that last
	Count  int           // stub faults: how many charge requests it hits
	Target int           // process faults: the index of the proxy
	Lat    time.Duration // latency faults
}

func (f fault) String() string {
	return fmt.Sprintf("%8.3fs %-24s for=%v count=%d target=%d latency=%v", f.At.Seconds(), f.Kind, f.For, f.Count, f.Target, f.Lat)
}

// Fault durations: a fault that lasts is drawn between minFault and
// maxFault (shorter than the lease), one that outlasts the lease between
// lease + 1 s and lease + 3 s.
const (
	minFault = 300 * time.Millisecond
	maxFault = 2500 * time.Millisecond
)

// schedule draws the faults of a run of length d from rng among kinds, one
// at a time: each fault starts a gap after the end of the one before,
// drawn from an exponential distribution of mean mean (an instant fault
// ends when it starts). The kinds are drawn from a shuffled bag: every
// kind once, in a random order, then again, so that a short run meets as
// many kinds as it has faults, up to all of them.
func schedule(rng *rand.Rand, d, mean time.Duration, kinds []string, nproxies int) []fault {
	var out []fault
	var bag []string
	t := time.Second
	for {
		t += time.Duration(rng.ExpFloat64() * float64(mean))
		if t > d-time.Second {
			return out
		}
		if len(bag) == 0 {
			bag = slices.Clone(kinds)
			rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		f := fault{
			At:     t,
			Kind:   bag[0],
			For:    minFault + time.Duration(rng.Int64N(int64(maxFault-minFault))),
			Count:  1 + rng.IntN(3),
			Target: rng.IntN(nproxies),
			Lat:    time.Duration(20+rng.IntN(230)) * time.Millisecond,
		}
		bag = bag[1:]
		if outlastsLease(f.Kind) {
			f.For = lease + time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		}
		out = append(out, f)
		if !instant(f.Kind) {
			t += f.For // faults do not overlap
		}
	}
}

// injector applies the schedule to the run's processes.
type injector struct {
	r       *run
	applied map[string]int
}

func (in *injector) apply(ctx context.Context, f fault) error {
	r := in.r
	in.applied[f.Kind]++
	stub := func(name string, extra string) error {
		body := fmt.Sprintf(`{"fault": %q, "count": %d%s}`, name, f.Count, extra)
		resp, err := http.Post(r.stubURL+"/faults", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 201 {
			return fmt.Errorf("queue %s: %s", name, resp.Status)
		}
		return nil
	}
	switch f.Kind {
	case kFailBefore:
		return stub("fail-before-charge", "")
	case kFailAfter:
		return stub("fail-after-charge", "")
	case kDelay:
		return stub("delay", fmt.Sprintf(`, "delay": %q`, (upstreamTimeout+500*time.Millisecond).String()))
	case kStallPastLease:
		return stub("delay", fmt.Sprintf(`, "delay": %q`, (lease+time.Second).String()))
	case kDrop:
		return stub("drop-after-charge", "")
	case k429:
		return stub("reject-429", "")
	case kUpLatency, kUpBlackhole, kUpSlowClose:
		switch f.Kind {
		case kUpLatency:
			r.upFault.set(f.Lat, false, 0)
		case kUpBlackhole:
			r.upFault.set(0, true, 0)
		case kUpSlowClose:
			r.upFault.set(0, false, f.For)
		}
		sleep(ctx, f.For)
		r.upFault.set(0, false, 0)
	case kUpReset:
		r.upFault.resetAll()
	case kUpStall:
		r.upFault.setStall(true)
		sleep(ctx, f.For)
		r.upFault.setStall(false)
	case kKill:
		p := r.proxies[f.Target]
		p.kill()
		sleep(ctx, f.For/2)
		// The proxy comes back even when the load ends meanwhile (a fault
		// the slow ones before it pushed to the load's end): its start is
		// bounded by startProxy's own minute.
		return r.startProxy(context.WithoutCancel(ctx), p)
	case kTerm:
		p := r.proxies[f.Target]
		p.signal(syscall.SIGTERM)
		if !p.waitExit(shutdownTimeout + 5*time.Second) {
			p.kill()
			return fmt.Errorf("%s did not stop within %v of SIGTERM", p.name, shutdownTimeout+5*time.Second)
		}
		return r.startProxy(context.WithoutCancel(ctx), p) // as for a kill
	case kHup:
		p := r.proxies[f.Target]
		r.reloads++
		if err := r.writeConfig(p); err != nil {
			return err
		}
		p.signal(syscall.SIGHUP)
	case kPowerLoss:
		return in.cutPower(ctx, f)
	case kReloadRename:
		return in.reloadRename(ctx, f)
	case kEvict:
		return in.evict(ctx, r.store("redis"), f)
	case kLagging:
		return in.laggingFailover(ctx, r.store("redis"), f)
	case kRestoreOld:
		return in.restoreOld(ctx, r.store("postgres"), f)
	case kDiskFull:
		path := filepath.Join(r.badgerDir, "ballast")
		fillDisk(path)
		sleep(ctx, f.For)
		os.Remove(path)
	default:
		return in.applyStore(ctx, f)
	}
	return nil
}

// applyStore applies a fault of a shared store server. Its process faults
// hit the primary; the network faults every node's fault layer.
func (in *injector) applyStore(ctx context.Context, f fault) error {
	for _, s := range in.r.stores {
		switch f.Kind {
		case "net-" + s.name + "-latency":
			s.eachFault(func(p *faultProxy) { p.set(f.Lat, false, 0) })
			sleep(ctx, f.For)
			s.eachFault(func(p *faultProxy) { p.set(0, false, 0) })
		case "net-" + s.name + "-blackhole":
			s.eachFault(func(p *faultProxy) { p.set(0, true, 0) })
			sleep(ctx, f.For)
			s.eachFault(func(p *faultProxy) { p.set(0, false, 0) })
		case "net-" + s.name + "-reset":
			s.eachFault(func(p *faultProxy) { p.resetAll() })
		case "net-" + s.name + "-stall":
			s.eachFault(func(p *faultProxy) { p.setStall(true) })
			sleep(ctx, f.For)
			s.eachFault(func(p *faultProxy) { p.setStall(false) })
		case s.name + "-kill-restart":
			in.r.markStoreFault(s)
			p, _ := s.prim()
			p.proc.kill()
			sleep(ctx, f.For/2)
			// The store comes back even when the load ends meanwhile.
			bctx := context.WithoutCancel(ctx)
			if err := s.restart(bctx, p); err != nil {
				return err
			}
			return s.ready(bctx)
		case s.name + "-sigstop":
			in.r.markStoreFault(s)
			p, _ := s.prim()
			p.proc.signal(syscall.SIGSTOP)
			sleep(ctx, f.For)
			p.proc.signal(syscall.SIGCONT)
		case s.name + pastLease:
			// The whole store paused (every node, the Sentinel too),
			// as a virtual machine is: longer than the lease, so that
			// reservations made before it have run out when it
			// resumes.
			in.r.markStoreFault(s)
			at := in.r.rec.now()
			for _, p := range s.procs() {
				p.signal(syscall.SIGSTOP)
			}
			sleep(ctx, f.For)
			for _, p := range s.procs() {
				p.signal(syscall.SIGCONT)
			}
			in.r.addOutage(s, at, in.r.rec.now()+int64(lossMargin))
		case s.name + lostKeys:
			in.r.markStoreFault(s)
			return in.loseKeys(ctx, s, f)
		case s.name + failover:
			in.r.markStoreFault(s)
			return in.failover(ctx, s, f)
		default:
			continue
		}
		return nil
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// loseKeys makes s forget its keys, lets the clients meet the forgetful
// store for the fault's duration (its proxies must refuse every protected
// request: the checker's property 6), then accepts the loss as an operator
// would (idemproxy store accept-loss) and waits until the proxies serve
// again. The loss goes into the history.
func (in *injector) loseKeys(ctx context.Context, s *storeSrv, f fault) error {
	r := in.r
	loss := check.Loss{Store: s.name, Kind: f.Kind}
	for _, p := range r.proxies {
		if p.store == s.name {
			loss.Proxies = append(loss.Proxies, p.name)
		}
	}
	err := s.forget(ctx)
	loss.At = r.rec.now()
	defer func() {
		r.mu.Lock()
		r.losses = append(r.losses, loss)
		r.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	sleep(ctx, f.For)
	loss.Accepted, err = in.acceptLoss(ctx, s, f)
	return err
}

// cutPower cuts the power of the Badger proxy's disk: the proxy is frozen
// (SIGSTOP: it answers nothing more, as a machine without power), the
// mount's connection is aborted and the disk keeps only what was synced,
// the proxy is killed (a frozen process does not die of the abort), and,
// after half the fault's duration, the disk is mounted again and the proxy
// started on what survived. The cut goes into the history.
func (in *injector) cutPower(ctx context.Context, f fault) error {
	r := in.r
	var p *proxyProc
	for _, q := range r.proxies {
		if q.store == "badger" {
			p = q
		}
	}
	if p == nil || r.power == nil {
		return fmt.Errorf("%s: no Badger proxy on a power-loss mount", kPowerLoss)
	}
	cut := check.Cut{Proxy: p.name, At: r.rec.now()}
	p.signal(syscall.SIGSTOP)
	// A thread in a FUSE request stops only once it is answered: wait
	// until every thread has stopped, so that nothing the proxy does
	// after the cut (answering 201 with a commit the dead disk refused)
	// reaches a client.
	if pid := p.pid(); pid > 0 && !waitStopped(pid, 5*time.Second) {
		r.recordErr(fmt.Sprintf("%s: not every thread stopped within 5s of SIGSTOP; the power is cut anyway", p.name))
	}
	err := r.power.cut()
	p.kill()
	cut.Off = r.rec.now()
	defer func() {
		r.mu.Lock()
		r.cuts = append(r.cuts, cut)
		r.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	p.note(fmt.Sprintf("power cut at %.3fs of the run", float64(cut.At)/1e9))
	sleep(ctx, f.For/2)
	// The machine comes back even when the load ends meanwhile.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	if err := r.power.mount(); err != nil {
		return err
	}
	starts := p.starts
	defer func() { cut.Starts = p.starts - starts }()
	if err := r.startProxy(uctx, p); err != nil {
		return err
	}
	cut.Up = r.rec.now()
	return nil
}

// fillDisk writes zeros to path until the file system is full.
func fillDisk(path string) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			return
		}
	}
}

// heal undoes every fault that may still hold: the schedule has stopped.
func (in *injector) heal(ctx context.Context) error {
	r := in.r
	r.upFault.set(0, false, 0)
	r.upFault.setStall(false)
	if r.power != nil {
		if err := r.power.mount(); err != nil {
			return err
		}
	}
	if r.badgerDir != "" {
		os.Remove(filepath.Join(r.badgerDir, "ballast"))
	}
	for _, s := range r.stores {
		s.eachFault(func(p *faultProxy) { p.set(0, false, 0); p.setStall(false); p.cutSource("") })
		for _, p := range s.procs() {
			p.signal(syscall.SIGCONT)
		}
		if s.sentinel != nil && !s.sentinel.running() {
			if err := s.sentinel.start(); err != nil {
				return err
			}
		}
		for _, n := range s.nodes {
			if !n.proc.running() {
				if err := s.restart(ctx, n); err != nil {
					return err
				}
			}
		}
		if err := s.ready(ctx); err != nil {
			return err
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "DELETE", r.stubURL+"/faults", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	for _, p := range r.proxies {
		if !p.running() {
			if err := r.startProxy(ctx, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// summary is "F faults of K kinds" and the count per kind.
func (in *injector) summary() (faults, kinds int, byKind string) {
	var names []string
	for k, n := range in.applied {
		faults += n
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "  %-26s %d\n", k, in.applied[k])
	}
	return faults, len(names), b.String()
}
