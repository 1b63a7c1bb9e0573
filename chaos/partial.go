//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/chaos/check"
)

// The fault kinds of a store that loses some keys and keeps its epoch
// marker, and of a reload that would orphan a route's keys (issue 35).
const (
	kEvict        = "redis-evict"
	kLagging      = "redis-failover-lagging"
	kRestoreOld   = "postgres-restore-old"
	kReloadRename = "proxy-reload-rename"
)

// partialSet names the kinds above in -faults. They are not default kinds:
// each one charges its lost keys again until the proxies detect partial
// losses and refuse renames.
const partialSet = "partial"

// partial reports whether k is one of the kinds of partialSet.
func partial(k string) bool {
	switch k {
	case kEvict, kLagging, kRestoreOld, kReloadRename:
		return true
	}
	return false
}

// defaultDetectWithin is the default of -detect-within, the bound the run
// holds the proxies to for a partial loss: from the loss until every
// proxy of the store refuses (the setting checks within a few seconds,
// the canaries within about their interval and a read, the witness at the
// first retry on the replica that answered the key). A retry in that
// window on a replica that cannot know the key may be charged again; the
// checker counts it (check.Loss.Detect).
const defaultDetectWithin = 5 * time.Second

// renamed is the name proxy-reload-rename gives the route charges, without
// keyspace: the reload must be refused, its keys left unclaimed.
const renamed = "charges-v2"

// acceptLoss accepts the loss of s as an operator would (idemproxy store
// accept-loss, through one of its proxies' configuration) and waits until
// its proxies are ready again; it returns when the acceptance returned
// (run time).
func (in *injector) acceptLoss(ctx context.Context, s *storeSrv, f fault) (int64, error) {
	r := in.r
	var op *proxyProc
	for _, p := range r.proxies {
		if p.store == s.name {
			op = p
		}
	}
	// The operator accepts the loss even when the load ends meanwhile
	// (ctx is the load's): the proxies must serve again before the heal.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(actx, filepath.Join(r.bin, "idemproxy"), "store", "accept-loss", "-config", op.config,
		"-operator", "chaos", "-reason", fmt.Sprintf("chaos fault %s at %.3fs", f.Kind, f.At.Seconds()))
	cmd.Env = append(os.Environ(), op.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("idemproxy store accept-loss: %v: %s", err, out)
	}
	accepted := r.rec.now()
	fmt.Fprintf(r.log, "chaos: %s lost keys (%s); loss accepted: %s", s.name, f.Kind, out)
	for _, p := range r.proxies {
		if p.store == s.name {
			if err := waitHTTP(actx, "http://"+p.admin+"/readyz", 30*time.Second); err != nil {
				return accepted, fmt.Errorf("%s after the accepted loss: %w", p.name, err)
			}
		}
	}
	return accepted, nil
}

// acceptPartial plays the operator after a partial loss of s that began at
// at (run time): it waits until a proxy of s marks the store lost
// (idemproxy_store_keys_lost 1), for -detect-within and a margin, then
// accepts the loss. The loss goes into the history, accepted or not (not:
// no proxy saw it, and the keys it took and charged again are property
// 1's).
func (in *injector) acceptPartial(ctx context.Context, s *storeSrv, f fault, at int64) error {
	r := in.r
	loss := check.Loss{Store: s.name, Kind: f.Kind, At: at, Partial: true, Detect: at + int64(r.opts.detectWithin)}
	var ps []*proxyProc
	for _, p := range r.proxies {
		if p.store == s.name {
			loss.Proxies = append(loss.Proxies, p.name)
			ps = append(ps, p)
		}
	}
	defer func() {
		r.mu.Lock()
		r.losses = append(r.losses, loss)
		r.mu.Unlock()
	}()
	deadline := time.Now().Add(r.opts.detectWithin + 5*time.Second)
	for {
		for _, p := range ps {
			if metrics(p.admin)["idemproxy_store_keys_lost"] == 1 {
				fmt.Fprintf(r.log, "chaos: %s: %s marked %s lost %.3fs after the loss\n", f.Kind, p.name, s.name, seconds(r.rec.now()-at))
				accepted, err := in.acceptLoss(ctx, s, f)
				loss.Accepted = accepted
				return err
			}
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(r.log, "chaos: %s: no proxy of %s marked the store lost within %.0fs of the loss\n", f.Kind, s.name, seconds(r.rec.now()-at))
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// evict sets a small maxmemory with an LRU policy on the Redis master at
// run time (CONFIG SET), as an operator or a managed Redis's default
// would: allkeys-lru, or volatile-lru (every key has a TTL, the epoch
// marker none) for an even Count. The limit is the memory in use less half
// the data set, so that about half the keys go. After the fault's duration
// the settings are restored, and if Redis evicted any key the run waits
// for the proxies to mark the store lost, and accepts the loss.
func (in *injector) evict(ctx context.Context, s *storeSrv, f fault) error {
	r := in.r
	m, _ := s.prim()
	used, dataset := redisInfoInt(m.addr(), "memory", "used_memory"), redisInfoInt(m.addr(), "memory", "used_memory_dataset")
	before := redisInfoInt(m.addr(), "stats", "evicted_keys")
	if used < 0 || dataset < 0 || before < 0 {
		return fmt.Errorf("%s: INFO of %s unreadable", f.Kind, m.name)
	}
	policy := "allkeys-lru"
	if f.Count%2 == 0 {
		policy = "volatile-lru"
	}
	limit := used - dataset/2
	at := r.rec.now()
	for _, kv := range [][2]string{{"maxmemory-policy", policy}, {"maxmemory", strconv.FormatInt(limit, 10)}} {
		if _, err := redisDo(m.addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			return fmt.Errorf("%s: CONFIG SET %s %s: %w", f.Kind, kv[0], kv[1], err)
		}
	}
	sleep(ctx, f.For)
	var errs []string
	for _, kv := range [][2]string{{"maxmemory", "0"}, {"maxmemory-policy", "noeviction"}} {
		if _, err := redisDo(m.addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: restore the settings of %s: %s", f.Kind, m.name, strings.Join(errs, "; "))
	}
	evicted := redisInfoInt(m.addr(), "stats", "evicted_keys") - before
	fmt.Fprintf(r.log, "chaos: %s: %d keys evicted by %s under %s with maxmemory %d (used %d, data set %d) for %v\n",
		f.Kind, evicted, m.name, policy, limit, used, dataset, f.For.Round(time.Millisecond))
	if evicted <= 0 {
		return nil
	}
	return in.acceptPartial(ctx, s, f, at)
}

// redisInfoInt returns the integer field of INFO section on addr, -1 if it
// cannot be read.
func redisInfoInt(addr, section, field string) int64 {
	reply, err := redisDo(addr, "INFO", section)
	if err != nil || len(reply) != 1 {
		return -1
	}
	for line := range strings.SplitSeq(reply[0], "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// laggingFailover cuts the replica off its master (its replication
// connection reset and refused at the master's fault layer: the master
// sees it gone at once), lets the master take writes for the fault's
// duration (with wait_replicas 1 they fail, with auto or 0 the master
// acknowledges them alone), writes one key of its own there, then kills
// the master; once the Sentinel has promoted the replica, the key is
// looked up on it: missing, the promoted replica lacks the master's last
// writes. Then the old master follows the new one, and the run waits for
// the proxies to mark the store lost and accepts the loss.
func (in *injector) laggingFailover(ctx context.Context, s *storeSrv, f fault) error {
	r := in.r
	r.markStoreFault(s)
	key := fmt.Sprintf("chaos-run:lagging:%d", f.At.Milliseconds())
	var promotedAt int64
	var missing bool
	lag := func(old, next *storeNode) func() {
		old.fault.cutSource(replSource)
		sleep(ctx, f.For)
		_, _ = redisDo(old.addr(), "SET", key, "acknowledged by the master alone")
		return func() {
			promotedAt = r.rec.now()
			reply, err := redisDo(next.addr(), "EXISTS", key)
			missing = err == nil && len(reply) == 1 && reply[0] == "0"
			old.fault.cutSource("")
		}
	}
	err := r.redisFailover(ctx, s, f, lag)
	s.eachFault(func(p *faultProxy) { p.cutSource("") })
	if err != nil {
		return err
	}
	if !missing {
		return fmt.Errorf("%s: the promoted replica holds the write the master took after the cut: it was not cut off", f.Kind)
	}
	fmt.Fprintf(r.log, "chaos: %s: the replica, cut off for %v, was promoted without the master's last writes\n", f.Kind, f.For.Round(time.Millisecond))
	if r.opts.redisWait > 0 {
		// Every write of the proxies waited for the replica: those made
		// while it was cut off failed, and nothing they acknowledged is
		// missing from it. No loss: were it recorded, a key lost later
		// (an eviction the run accepted) would be put down to it, a loss
		// no proxy could see and nobody accepted.
		fmt.Fprintf(r.log, "chaos: %s: no write the proxies acknowledged was lost (wait_replicas %d)\n", f.Kind, r.opts.redisWait)
		return nil
	}
	return in.acceptPartial(ctx, s, f, promotedAt)
}

// restoreOld takes a dump of the proxies' tables on the PostgreSQL primary
// (a copy of each idemproxy table), lets the proxies write for the fault's
// duration, then restores the dump in one transaction, as an operator
// restoring last night's backup would: the keys written since are gone,
// those completed since are back in flight, and the epoch marker is the
// same. Then the run waits for the proxies to mark the store lost and
// accepts the loss.
func (in *injector) restoreOld(ctx context.Context, s *storeSrv, f fault) error {
	r := in.r
	bctx := context.WithoutCancel(ctx)
	p, _ := s.prim()
	list, err := s.psql(bctx, p, "SELECT string_agg(tablename, ' ') FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'idemproxy%'")
	if err != nil {
		return err
	}
	tables := strings.Fields(list)
	if len(tables) == 0 {
		return fmt.Errorf("%s: no idemproxy table on %s", f.Kind, p.name)
	}
	dump := func(t string) string { return "chaos_dump_" + t }
	var take, restore strings.Builder
	restore.WriteString("BEGIN;")
	for _, t := range tables {
		fmt.Fprintf(&take, "DROP TABLE IF EXISTS %s; CREATE TABLE %[1]s AS TABLE %s;", dump(t), t)
		fmt.Fprintf(&restore, "DELETE FROM %s; INSERT INTO %[1]s SELECT * FROM %s; DROP TABLE %[2]s;", t, dump(t))
	}
	restore.WriteString("COMMIT;")
	if _, err := s.psql(bctx, p, take.String()); err != nil {
		return err
	}
	taken := time.Now()
	sleep(ctx, f.For)
	changed, err := s.psql(bctx, p, fmt.Sprintf("SELECT (SELECT count(*) FROM %s k WHERE NOT EXISTS (SELECT 1 FROM %s d WHERE d.key = k.key)) || ' new, ' || "+
		"(SELECT count(*) FROM %[1]s k JOIN %[2]s d ON d.key = k.key WHERE k::text <> d::text) || ' changed'", pgTable, dump(pgTable)))
	if err != nil {
		return err
	}
	if _, err := s.psql(bctx, p, restore.String()); err != nil {
		return err
	}
	at := r.rec.now()
	fmt.Fprintf(r.log, "chaos: %s: a dump of %s taken %v earlier restored on %s in one transaction; keys since the dump: %s\n",
		f.Kind, strings.Join(tables, ", "), time.Since(taken).Round(time.Millisecond), p.name, changed)
	if strings.HasPrefix(changed, "0 new, 0 changed") {
		return nil
	}
	return in.acceptPartial(ctx, s, f, at)
}

// reloadRename rewrites one proxy's configuration with the route charges
// renamed (renamed, without keyspace) and sends SIGHUP: the reload must be
// refused (idemproxy_config_last_reload_successful 0), the running
// configuration kept. Then the operator puts the file back and reloads
// it. A reload that is accepted, or no verdict, is recorded as a fault the
// run did not survive.
func (in *injector) reloadRename(ctx context.Context, f fault) error {
	r := in.r
	p := r.proxies[f.Target]
	const ok, at = "idemproxy_config_last_reload_successful", "idemproxy_config_last_reload_success_timestamp_seconds"
	// verdict sends SIGHUP and waits for the reload's outcome: applied (a
	// newer success timestamp) or, if refusable, refused (ok 0; a reload
	// after a refusal can only wait to be applied).
	verdict := func(refusable bool) (applied bool, err error) {
		since := metrics(p.admin)[at]
		p.signal(syscall.SIGHUP)
		deadline := time.Now().Add(15 * time.Second)
		for {
			m := metrics(p.admin)
			if m[at] > since {
				return true, nil
			}
			if v, seen := m[ok]; refusable && seen && v == 0 {
				return false, nil
			}
			if time.Now().After(deadline) {
				return false, fmt.Errorf("%s: no verdict on the reload of %s within 15s", f.Kind, p.name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := r.writeRoutes(p, renamed); err != nil {
		return err
	}
	applied, err := verdict(true)
	// The operator puts the configuration back, whatever happened.
	if werr := r.writeConfig(p); werr != nil {
		return werr
	}
	if _, rerr := verdict(false); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	if applied {
		return fmt.Errorf("%s: %s applied a reload that renamed the route charges to %s without keyspace, leaving the keys of charges unclaimed; it must refuse it", f.Kind, p.name, renamed)
	}
	fmt.Fprintf(r.log, "chaos: %s: %s refused the reload that renamed charges to %s; its configuration stays\n", f.Kind, p.name, renamed)
	return nil
}

// seconds is a run time in nanoseconds, in seconds.
func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// partialLosses counts the partial losses of losses, and those of them a
// proxy marked lost (the run accepted them).
func partialLosses(losses []check.Loss) (n, seen int) {
	for _, l := range losses {
		if l.Partial {
			n++
			if l.Accepted > 0 {
				seen++
			}
		}
	}
	return n, seen
}
