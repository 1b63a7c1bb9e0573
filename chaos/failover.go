//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/chaos/check"
)

// lossMargin widens the window around a failover in which a write the old
// primary acknowledged may be lost: before the fault that caused it
// (replication lags), after the old primary became a replica.
const lossMargin = time.Second

// markStoreFault notes that a process fault of s begins now: a failover it
// causes may lose what the primary acknowledged since shortly before.
func (r *run) markStoreFault(s *storeSrv) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.storeFault == nil {
		r.storeFault = map[string]int64{}
	}
	r.storeFault[s.name] = r.rec.now()
}

// addFailover records a failover of a store in the history.
func (r *run) addFailover(s *storeSrv, at, end int64, lossy bool) {
	f := check.Failover{Store: s.name, At: at, End: end, Lossy: lossy}
	for _, p := range r.proxies {
		if p.store == s.name {
			f.Proxies = append(f.Proxies, p.name)
		}
	}
	r.mu.Lock()
	r.failovers = append(r.failovers, f)
	r.mu.Unlock()
	if time.Duration(end-at) >= lease-2*lossMargin {
		// As long as a lease: a reservation whose reply was lost may
		// have outlived its release.
		r.addOutage(s, at, end)
	}
	fmt.Fprintf(r.log, "chaos: %s failed over (%.3fs to %.3fs of the run)\n", s.name, float64(at)/1e9, float64(end)/1e9)
}

// failover applies a S-failover fault. A PostgreSQL failover is recorded
// here; a Redis one by watchRedis, which sees every failover the Sentinel
// makes, those that a kill or a pause of the master caused included.
func (in *injector) failover(ctx context.Context, s *storeSrv, f fault) error {
	at := in.r.rec.now()
	err := s.failover(ctx, f)
	if s.name == "postgres" {
		in.r.addFailover(s, at, in.r.rec.now(), false)
	}
	return err
}

// watchRedis watches the Sentinel's master until ctx ends, and records
// every change as a failover: from the start of the fault that caused it
// until the old master is a replica of the new one (or down), the writes
// the old master acknowledged may be lost, unless wait_replicas made each
// wait for the replica. Windows may overlap: the Sentinel may fail over
// again before the old master of the last failover is a replica.
func (r *run) watchRedis(ctx context.Context, s *storeSrv) {
	type window struct {
		old *storeNode
		at  int64
	}
	var open []window
	closeWindow := func(w window) {
		r.addFailover(s, max(0, w.at-int64(lossMargin)), r.rec.now()+int64(lossMargin), r.opts.redisWait == 0)
	}
	last, _ := s.sentinelPrimary()
	for ctx.Err() == nil {
		sleep(ctx, 100*time.Millisecond)
		// A window closes once its old master takes no writes: a replica
		// of the new one, or down.
		kept := open[:0]
		for _, w := range open {
			if w.old != nil && w.old.proc.running() && redisRole(w.old.addr()) != "slave" {
				kept = append(kept, w)
				continue
			}
			closeWindow(w)
		}
		open = kept
		m, err := s.sentinelPrimary()
		if err != nil || m == nil || m == last {
			continue
		}
		at := r.rec.now()
		r.mu.Lock()
		if t, ok := r.storeFault[s.name]; ok && t < at && at-t < int64(time.Minute) {
			at = t
		}
		r.mu.Unlock()
		open = append(open, window{old: last, at: at})
		last = m
		s.setPrimary(m)
	}
	for _, w := range open {
		closeWindow(w)
	}
}

// restart starts node n of s again: a Redis node as the master if the
// Sentinel names it, else as a replica of the master; a PostgreSQL node
// as it was (its data directory says whether it is a standby).
func (s *storeSrv) restart(ctx context.Context, n *storeNode) error {
	if s.sentinel != nil {
		m, err := s.sentinelPrimary()
		if err != nil {
			m, _ = s.prim()
		}
		var master *storeNode
		if m != n {
			master = m
		}
		n.proc.args = redisArgs(n, master)
		if err := n.proc.start(); err != nil {
			return err
		}
		return waitRedis(ctx, n.addr(), 20*time.Second)
	}
	// A PostgreSQL node that exits at once (a backend of the killed one
	// still holding the shared memory) is started again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := n.proc.start(); err != nil {
			return err
		}
		if !n.proc.waitExit(time.Second) || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// addOutage records in the history that s took no writes from at to end
// (nanoseconds since the start of the run), about a lease or longer.
func (r *run) addOutage(s *storeSrv, at, end int64) {
	o := check.Outage{Store: s.name, At: at, End: end}
	for _, p := range r.proxies {
		if p.store == s.name {
			o.Proxies = append(o.Proxies, p.name)
		}
	}
	r.mu.Lock()
	r.outages = append(r.outages, o)
	r.mu.Unlock()
}
