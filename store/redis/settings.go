package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

// The settings that lose keys.
//
// Two Redis settings lose keys that the proxy answered: an eviction policy
// (maxmemory above 0 with a maxmemory-policy other than noeviction: every
// record has a TTL, so the volatile-* policies evict live records as the
// allkeys-* ones do) and no persistence (neither the append-only file nor
// RDB snapshots: a restart forgets every key). CONFIG SET changes either
// on a running Redis, so they are read continuously: by WatchSettings
// every interval, by Ping, and on every new connection (before it is
// used), on the node, the Sentinel master, or every Cluster master. While
// one that the operator did not opt in to (Options.AllowEviction,
// Options.AllowNoPersistence) is seen, Reserve refuses with a
// *store.SettingError (wrapping errEvictionPolicy or errNoPersistence,
// and store.ErrUnsafeSettings), writing nothing: the proxy answers 503
// and forwards nothing. Each change of what is seen is logged once.
//
// Evictions are a loss, whatever the options: INFO stats evicted_keys
// rising on a master means Redis dropped keys, which may be the records of
// answered requests, and Options.KeysEvicted is called to mark the store
// lost. A counter that starts again since the last check (a restart of
// the node: a new run_id and an uptime shorter than the time since; CONFIG
// RESETSTAT: the same run_id, a lower count) counts every eviction it
// shows, all made since; a new run_id that ran before the last check (a
// Sentinel failover to another node) is a new baseline. Redis does not say
// whose keys it evicted, so on a Redis shared with other data an eviction
// of any key counts: the policy samples every key (or every key with a
// TTL, which every record has) alike.
//
// The persistence check needs CONFIG GET save (INFO shows only whether the
// append-only file is on): where CONFIG is refused (a managed service, an
// ACL without it) and AOF is off, persistence is not judged.
//
// INFO replication's replicas online (slaveN lines with state=online),
// read by the same checks, are what Options.WaitAuto waits for: a replica
// connected but in its full sync (wait_bgsave, send_bulk) acknowledges
// no write and holds none a promotion would keep, and waiting for it
// would fail every write for as long as the sync takes.

// errNoPersistence is wrapped by the *store.SettingError of a Redis that
// keeps no copy of its keys on disk.
var errNoPersistence = fmt.Errorf("%w: redis keeps no copy of its keys on disk", store.ErrUnsafeSettings)

// The risks Risks reports, as idemproxy_store_config_risk labels them.
const (
	// riskEviction: maxmemory above 0 with a maxmemory-policy other than
	// noeviction.
	riskEviction = "eviction"
	// riskNoPersistence: neither the append-only file nor RDB snapshots
	// are on: a restart forgets every key.
	riskNoPersistence = "no_persistence"
)

// Risks lists every risk the checks report, for metrics.
var Risks = []string{riskEviction, riskNoPersistence}

// nodeReport is what one read of a node's INFO and CONFIG showed.
type nodeReport struct {
	node      string
	policy    string
	maxmemory int64
	aof       bool
	// save is CONFIG GET save; saveKnown is false where CONFIG is refused.
	save      string
	saveKnown bool
	evicted   int64
	runID     string
	uptime    time.Duration // INFO server uptime_in_seconds, truncated
	replicas  int
	master    bool
}

// readNode reads INFO (its default sections: server, memory,
// persistence, stats, replication) and CONFIG GET save from c.
func readNode(ctx context.Context, c goredis.Cmdable, node string) (nodeReport, error) {
	info, err := c.Info(ctx).Result()
	if err != nil {
		return nodeReport{}, fmt.Errorf("INFO, to check the eviction policy and persistence (see Options.SkipEvictionCheck): %w", err)
	}
	r := nodeReport{node: node, policy: infoField(info, "maxmemory_policy"), aof: infoField(info, "aof_enabled") == "1",
		runID: infoField(info, "run_id"), master: infoField(info, "role") != "slave"}
	if r.policy == "" {
		return r, errors.New("INFO memory shows no maxmemory_policy, so the eviction policy cannot be checked (see Options.SkipEvictionCheck)")
	}
	limit := infoField(info, "maxmemory")
	if r.maxmemory, err = strconv.ParseInt(limit, 10, 64); err != nil {
		return r, fmt.Errorf("INFO memory: maxmemory %q is not a number", limit)
	}
	r.evicted, _ = strconv.ParseInt(infoField(info, "evicted_keys"), 10, 64)
	r.replicas = onlineReplicas(info)
	up, _ := strconv.ParseInt(infoField(info, "uptime_in_seconds"), 10, 64)
	r.uptime = time.Duration(up) * time.Second
	if !r.aof {
		v, err := c.ConfigGet(ctx, "save").Result()
		var refused goredis.Error
		switch {
		case errors.As(err, &refused): // CONFIG refused: persistence not judged
		case err != nil:
			return r, fmt.Errorf("CONFIG GET save: %w", err)
		default:
			r.save, r.saveKnown = strings.TrimSpace(v["save"]), true
		}
	}
	return r, nil
}

// onlineReplicas counts the replicas INFO replication text info lists
// (slave0:ip=…,port=…,state=online,…) whose state is online.
func onlineReplicas(info string) int {
	n := 0
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(line, ":")
		if ok && strings.HasPrefix(name, "slave") && slices.Contains(strings.Split(strings.TrimSpace(fields), ","), "state=online") {
			n++
		}
	}
	return n
}

// judge returns the risks r shows, each as the error that refuses it.
func judge(r nodeReport) map[string]*store.SettingError {
	risks := map[string]*store.SettingError{}
	if r.policy != "noeviction" && r.maxmemory > 0 {
		risks[riskEviction] = &store.SettingError{Err: errEvictionPolicy, Setting: "maxmemory-policy", Node: r.node,
			Seen: fmt.Sprintf("%s with maxmemory %d bytes", r.policy, r.maxmemory),
			Why:  "every record has a TTL, so Redis may evict live records and a retried request would reach the upstream twice",
			Fix:  "set maxmemory-policy noeviction (or maxmemory 0), or opt in with store.redis.allow_eviction: true"}
	}
	if !r.aof && r.saveKnown && r.save == "" {
		risks[riskNoPersistence] = &store.SettingError{Err: errNoPersistence, Setting: "appendonly", Node: r.node,
			Seen: `no, with save ""`,
			Why:  "a restart of Redis forgets every key",
			Fix:  "set appendonly yes (or an RDB save schedule), or opt in with store.redis.allow_no_persistence: true"}
	}
	return risks
}

// nodeSeen is what the checks remember of a master, to see its evictions.
type nodeSeen struct {
	runID   string
	evicted int64
	at      time.Time // when the check that read it began
}

// newEvictions returns the evictions r shows that prev, the same node's
// previous report (ok false: none), did not, and how evicted_keys went
// for the log line.
func newEvictions(prev nodeSeen, ok bool, r nodeReport, now time.Time) (int64, string) {
	switch {
	case !ok:
		return 0, "" // the first look: a baseline
	case prev.runID == r.runID && r.evicted >= prev.evicted:
		return r.evicted - prev.evicted, fmt.Sprintf("%d → %d", prev.evicted, r.evicted)
	case prev.runID == r.runID:
		// Reset (CONFIG RESETSTAT) since the last check: every eviction
		// counted since is new.
		return r.evicted, fmt.Sprintf("%d → reset → %d", prev.evicted, r.evicted)
	case now.Sub(prev.at)+time.Second > r.uptime:
		// Restarted since the last check: every eviction of this run is
		// new. INFO gives the uptime in whole seconds, which a restart a
		// few hundred milliseconds after the last check can already
		// show as 1: a second of slack.
		return r.evicted, fmt.Sprintf("%d in the run started %v ago", r.evicted, r.uptime)
	}
	return 0, "" // another node that ran before (a failover): a baseline
}

// settings is the Store's view of the settings of its nodes.
type settings struct {
	allow    map[string]bool // the risks the operator opted in to
	log      *slog.Logger
	evicted  func(reason string)
	kick     chan struct{}
	checking sync.Mutex // one check at a time

	mu sync.Mutex
	// risks are the risks seen by the last check (and new connections
	// since), allowed or not.
	risks map[string]*store.SettingError
	// refusal is the first risk of risks not allowed, nil for none.
	refusal *store.SettingError
	nodes   map[string]nodeSeen
	// rebase makes the next check take every node's evicted_keys as a
	// new baseline, reporting nothing: AcceptEvictions.
	rebase bool
}

func newSettings(opts Options) *settings {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &settings{
		allow:   map[string]bool{riskEviction: opts.AllowEviction, riskNoPersistence: opts.AllowNoPersistence},
		log:     log,
		evicted: opts.KeysEvicted,
		kick:    make(chan struct{}, 1),
		risks:   map[string]*store.SettingError{},
		nodes:   map[string]nodeSeen{},
	}
}

// set makes risks what is seen, logging each risk that appears or goes
// (s.mu held). A risk the operator did not opt in to is an ERROR line,
// one allowed a WARN line.
func (s *settings) setLocked(risks map[string]*store.SettingError) {
	for _, r := range Risks {
		old, cur := s.risks[r], risks[r]
		switch {
		case cur != nil && (old == nil || old.Setting+old.Seen != cur.Setting+cur.Seen):
			if s.allow[r] {
				s.log.Warn("redis runs with a setting that may lose idempotency keys, allowed by the configuration: protected requests are served",
					"risk", r, "setting", cur.Setting, "seen", cur.Seen, "node", cur.Node, "why", cur.Why)
			} else {
				s.log.Error("redis runs with a setting that may lose idempotency keys: protected routes answer 503 store-unsafe-settings until it is fixed",
					"risk", r, "setting", cur.Setting, "seen", cur.Seen, "node", cur.Node, "why", cur.Why, "fix", cur.Fix)
			}
		case cur == nil && old != nil:
			level := slog.LevelInfo
			if !s.allow[r] {
				level = slog.LevelWarn
			}
			s.log.Log(context.Background(), level, "redis no longer runs with a setting that may lose idempotency keys: protected requests are served again",
				"risk", r, "setting", old.Setting, "node", old.Node)
		}
	}
	s.risks, s.refusal = risks, nil
	for _, r := range Risks {
		if risks[r] != nil && !s.allow[r] {
			s.refusal = risks[r]
			break
		}
	}
}

// add adds the risks of one node, seen on a new connection, to what is
// seen.
func (s *settings) add(risks map[string]*store.SettingError) {
	if len(risks) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make(map[string]*store.SettingError, len(s.risks)+len(risks))
	for r, e := range s.risks {
		all[r] = e
	}
	for r, e := range risks {
		if all[r] == nil {
			all[r] = e
		}
	}
	s.setLocked(all)
}

// err returns the refusal, nil for none.
func (s *settings) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusal == nil {
		return nil
	}
	return s.refusal
}

// SettingsErr returns the *store.SettingError that refuses reservations
// (see "The settings that lose keys"), or nil.
func (s *Store) SettingsErr() error {
	if s.settings == nil {
		return nil
	}
	return s.settings.err()
}

// Risks returns the risks the last checks saw, allowed or not, each with
// what was seen.
func (s *Store) Risks() map[string]string {
	out := map[string]string{}
	if s.settings == nil {
		return out
	}
	s.settings.mu.Lock()
	defer s.settings.mu.Unlock()
	for r, e := range s.settings.risks {
		out[r] = e.Setting + " " + e.Seen + " on " + e.Node
	}
	return out
}

// CheckSettings reads the settings of every master (see "The settings
// that lose keys"), and applies them: the refusal, the evictions, the
// replicas WaitAuto waits for. An error leaves what was seen as it was.
func (s *Store) CheckSettings(ctx context.Context) error {
	if s.settings == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	s.settings.checking.Lock()
	defer s.settings.checking.Unlock()
	var (
		mu      sync.Mutex
		reports []nodeReport
	)
	// A node's run started after the last check when it did before the
	// reads of that check (at) and is younger than the time since, read
	// after the reads of this one (now).
	at := time.Now()
	err := s.forEachNode(ctx, func(ctx context.Context, c *goredis.Client) error {
		addr := c.Options().Addr
		if s.masterName != "" {
			addr = "the Sentinel master " + s.masterName
		}
		r, err := readNode(ctx, c, addr)
		if err != nil {
			return fmt.Errorf("node %s: %w", addr, err)
		}
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis store: check settings: %w", err)
	}
	now := time.Now()
	slices.SortFunc(reports, func(a, b nodeReport) int { return strings.Compare(a.node, b.node) })
	risks := map[string]*store.SettingError{}
	var losses []string
	st := s.settings
	st.mu.Lock()
	for _, r := range reports {
		for k, e := range judge(r) {
			if risks[k] == nil {
				risks[k] = e
			}
		}
		prev, ok := st.nodes[r.node]
		if n, how := newEvictions(prev, ok && !st.rebase, r, now); n > 0 {
			losses = append(losses, fmt.Sprintf("redis %s evicted %d keys (INFO stats evicted_keys %s, maxmemory-policy %s): records of answered requests may be among them",
				r.node, n, how, r.policy))
		}
		st.nodes[r.node] = nodeSeen{runID: r.runID, evicted: r.evicted, at: at}
	}
	st.setLocked(risks)
	st.rebase = false
	st.mu.Unlock()
	if _, cluster := s.client.(*goredis.ClusterClient); !cluster && len(reports) == 1 && reports[0].master {
		s.pipe.setReplicas(reports[0].replicas)
	}
	for _, l := range losses {
		if st.evicted == nil {
			st.log.Error("redis evicted keys", "seen", l)
			continue
		}
		st.evicted(l) // which logs the loss
	}
	return nil
}

// WatchSettings runs CheckSettings at once, then every interval and when
// a new connection asks for it, until ctx ends.
func (s *Store) WatchSettings(ctx context.Context, interval time.Duration) {
	if s.settings == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.CheckSettings(ctx); err != nil && ctx.Err() == nil {
			s.settings.log.Debug("redis settings check failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.settings.kick:
		}
	}
}

// connSettings checks the settings a new connection cn shows, before it
// is used: a risk seen there refuses reservations at once, and a full
// check (of every master) is asked for. A failed read is passed over:
// the checks see the store as it is.
func (s *Store) connSettings(ctx context.Context, cn *goredis.Conn) {
	r, err := readNode(ctx, cn, "a new connection")
	if err != nil {
		return
	}
	s.settings.add(judge(r))
	select {
	case s.settings.kick <- struct{}{}:
	default:
	}
}

// AcceptEvictions takes the evictions made so far as part of a loss an
// operator accepted: the check it asks for at once takes every node's
// evicted_keys as a new baseline, so that evictions made before the
// acceptance, and not yet seen by a check, are not a new loss; those
// made after it are. The program calls it when the replica trusts the
// store again after a loss.
func (s *Store) AcceptEvictions() {
	if s.settings == nil {
		return
	}
	s.settings.mu.Lock()
	s.settings.rebase = true
	s.settings.mu.Unlock()
	select {
	case s.settings.kick <- struct{}{}:
	default:
	}
}

// Allowed reports whether the operator opted in to risk
// (Options.AllowEviction, Options.AllowNoPersistence).
func (s *Store) Allowed(risk string) bool { return s.settings != nil && s.settings.allow[risk] }
