package config

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/keyextract"
)

// validationError lists every problem found in a configuration, each
// prefixed with the field it concerns ("routes[1].key.json: ...").
type validationError struct {
	Problems []string
}

func (e *validationError) Error() string {
	return "invalid config:\n  " + strings.Join(e.Problems, "\n  ")
}

type problems []string

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, field+": "+fmt.Sprintf(format, args...))
}

var routeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// headerToken matches an HTTP field name (RFC 9110 token).
var headerToken = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$")

// Validate checks a defaulted configuration and returns a *validationError
// naming every problem, or nil.
func (c *Config) Validate() error {
	var p problems
	checkAddr(&p, "listen", c.Listen, true)
	if c.Upstream == "" {
		p.add("upstream", "required (the protected service's base URL, e.g. http://127.0.0.1:9000)")
	} else if !strings.Contains(c.Upstream, "://") {
		p.add("upstream", "%q is not an absolute http or https URL (add http:// or https://)", redactedURL(c.Upstream))
	} else if u, err := url.Parse(c.Upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		p.add("upstream", "%q is not an absolute http or https URL", redactedURL(c.Upstream))
	} else if u.Host == "" {
		p.add("upstream", "%q is not an absolute http or https URL: it names no host", redactedURL(c.Upstream))
	} else if u.RawQuery != "" || u.Fragment != "" {
		p.add("upstream", "%q must not carry a query or fragment", redactedURL(c.Upstream))
	} else if port := u.Port(); port != "" && !validPort(port) {
		p.add("upstream", "%q: port %s is not 0 to 65535 or a service name", redactedURL(c.Upstream), port)
	}
	if !c.UpstreamTLS.IsZero() {
		c.UpstreamTLS.load(&p)
		if u, err := url.Parse(c.Upstream); err == nil && u.Scheme == "http" {
			p.add("upstream_tls", "set, but upstream %q is plain http: use an https URL", redactedURL(c.Upstream))
		}
	}
	if c.Admin.Listen != "" {
		checkAddr(&p, "admin.listen", c.Admin.Listen, false)
		if samePort(c.Admin.Listen, c.Listen) {
			p.add("admin.listen", "%q and listen %q would bind the same port", c.Admin.Listen, c.Listen)
		}
	}
	if c.Admin.MaxConnections < 0 {
		p.add("admin.max_connections", "must be positive")
	}
	if !headerToken.MatchString(c.Admin.TokenEnv) {
		p.add("admin.token_env", "%q is not an environment variable name", c.Admin.TokenEnv)
	}
	c.validateStore(&p)
	if m := c.MemoryLimit; m != 0 && m != -1 && m < MinMemoryLimit {
		p.add("memory_limit", "%d bytes is below the minimum of %d (16 MiB); 0 chooses it, -1 disables it", m, MinMemoryLimit)
	}
	s := c.Server
	for _, d := range []struct {
		name string
		v    Duration
	}{
		{"read_header_timeout", s.ReadHeaderTimeout}, {"read_timeout", s.ReadTimeout},
		{"idle_timeout", s.IdleTimeout}, {"passthrough_timeout", s.PassthroughTimeout},
		{"shutdown_timeout", s.ShutdownTimeout}, {"body_timeout", s.BodyTimeout},
	} {
		if d.v <= 0 {
			p.add("server."+d.name, "must be positive")
		}
	}
	if s.DrainDelay < 0 {
		p.add("server.drain_delay", "must not be negative")
	}
	if s.MaxBufferedBytes < 0 {
		p.add("server.max_buffered_bytes", "must be positive")
	}
	if s.MaxBufferedBytesPerClient < 0 {
		p.add("server.max_buffered_bytes_per_client", "must be positive")
	} else if s.MaxBufferedBytes > 0 && s.MaxBufferedBytesPerClient > s.MaxBufferedBytes {
		p.add("server.max_buffered_bytes_per_client", "%d exceeds server.max_buffered_bytes (%d)", s.MaxBufferedBytesPerClient, s.MaxBufferedBytes)
	}
	if s.MaxConnections < 0 {
		p.add("server.max_connections", "must be positive")
	}
	if s.MaxRequestsPerClient < 0 {
		p.add("server.max_requests_per_client", "must be positive")
	} else if s.MaxConnections > 0 && s.MaxRequestsPerClient > s.MaxConnections {
		p.add("server.max_requests_per_client", "%d exceeds server.max_connections (%d)", s.MaxRequestsPerClient, s.MaxConnections)
	}
	if s.MaxClientResetsPerSecond < 0 {
		p.add("server.max_client_resets_per_second", "must be positive")
	}
	if s.MaxResetsPerSecond < 0 {
		p.add("server.max_resets_per_second", "must be positive")
	}
	if c.Metrics.RouteHistograms < -1 {
		p.add("metrics.route_histograms", "%d: want a number of routes, 0 for the default (%d) or -1 for none", c.Metrics.RouteHistograms, DefaultRouteHistograms)
	}
	if len(c.Routes) == 0 {
		p.add("routes", "at least one route is required (requests matching no route are proxied unprotected)")
	}
	names := map[string]int{}
	keyspaces := map[string]int{}
	patterns := &patternSet{mux: http.NewServeMux()}
	for i := range c.Routes {
		r := &c.Routes[i]
		f := fmt.Sprintf("routes[%d]", i)
		j, dupName := names[r.Name]
		if dupName && r.Name != "" {
			p.add(f+".name", "%q is already used by routes[%d]", r.Name, j)
		}
		names[r.Name] = i
		r.validate(&p, f, patterns)
		if j, shared := keyspaces[r.Keyspace]; shared && r.Keyspace != "" && !(dupName && r.Keyspace == r.Name) {
			if o := c.Routes[j]; o.KeyRecipe() != r.KeyRecipe() {
				p.add(f+".keyspace", "%q is also routes[%d]'s keyspace, whose keys are made otherwise (%s; here %s): "+
					"routes share a keyspace only with the same key, scope and normalize", r.Keyspace, j, o.KeyRecipe(), r.KeyRecipe())
			}
		} else {
			keyspaces[r.Keyspace] = i
		}
		c.validateRedisWait(&p, f, r)
		if s.MaxBufferedBytes > 0 && r.MaxBodyBytes > s.MaxBufferedBytes {
			p.add(f+".max_body_bytes", "%d exceeds server.max_buffered_bytes (%d): such a body could never be buffered", r.MaxBodyBytes, s.MaxBufferedBytes)
		}
	}
	if len(p) > 0 {
		return &validationError{Problems: p}
	}
	return nil
}

func checkAddr(p *problems, field, addr string, required bool) {
	if addr == "" {
		if required {
			p.add(field, "required (host:port, e.g. 127.0.0.1:8080)")
		}
		return
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		p.add(field, "%q is not a host:port address", addr)
	} else if !validPort(port) {
		p.add(field, "%q: port %s is not 0 to 65535 or a service name", addr, port)
	}
}

// validPort reports whether port is one that the network functions
// accept: a number from 0 to 65535, or a known service name ("http").
func validPort(port string) bool {
	_, err := net.LookupPort("tcp", port)
	return err == nil
}

// samePort reports whether two listen addresses would bind one port: the
// same non-zero port on the same host, or on any host when either is a
// wildcard (empty, 0.0.0.0 or ::).
func samePort(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

func (c *Config) validateStore(p *problems) {
	st := &c.Store
	if len(st.kindsSet()) > 1 {
		p.add("store", "set exactly one of %s", sayList(StoreKinds()))
	}
	if st.EpochCheckInterval < 0 || st.EpochCheckInterval.D() > time.Minute {
		p.add("store.epoch_check_interval", "must be positive and at most 1m: a store that forgot its keys is found within it")
	}
	if st.CanaryInterval < 0 || st.CanaryInterval.D() > time.Minute {
		p.add("store.canary_interval", "must be positive and at most 1m: a store that lost writes is found within it")
	}
	if st.WitnessWindow < 0 || st.WitnessWindow.D() > MaxWitnessWindow {
		p.add("store.witness_window", "must be positive and at most 1h")
	}
	if st.WitnessMaxKeys < minWitnessMaxKeys || st.WitnessMaxKeys > maxWitnessMaxKeys {
		p.add("store.witness_max_keys", "must be %d to %d (16 bytes a key)", minWitnessMaxKeys, maxWitnessMaxKeys)
	}
	for _, k := range st.kindsSet() {
		k.section(st).validate(p)
	}
}

func (b *Badger) validate(p *problems) {
	if b.GCInterval <= 0 {
		p.add("store.badger.gc_interval", "must be positive")
	}
	if b.MinFreeBytes < 0 {
		p.add("store.badger.min_free_bytes", "must be positive")
	}
	oneOf(p, "store.badger.preallocate", b.Preallocate, preallocateAuto, PreallocateOff, PreallocateRequired)
}

func (r *Redis) validate(p *problems) {
	if len(r.Addrs) == 0 {
		p.add("store.redis.addrs", "at least one host:port is required")
	}
	for i, a := range r.Addrs {
		checkAddr(p, fmt.Sprintf("store.redis.addrs[%d]", i), a, true)
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		p.add("store.redis.master_name", "needs the Sentinel addresses in addrs")
	}
	for _, e := range []struct{ field, name string }{
		{"username_env", r.UsernameEnv}, {"password_env", r.PasswordEnv},
		{"sentinel_username_env", r.SentinelUsernameEnv}, {"sentinel_password_env", r.SentinelPasswordEnv},
	} {
		if e.name == "" {
			continue
		}
		if !headerToken.MatchString(e.name) {
			p.add("store.redis."+e.field, "%q is not an environment variable name", e.name)
		} else if _, ok := os.LookupEnv(e.name); !ok {
			p.add("store.redis."+e.field, "environment variable %s is not set", e.name)
		}
	}
	if r.DB < 0 {
		p.add("store.redis.db", "must not be negative")
	}
	if (r.SentinelUsernameEnv != "" || r.SentinelPasswordEnv != "") && r.MasterName == "" {
		p.add("store.redis.sentinel_password_env", "Sentinel credentials need master_name")
	}
	if r.Cluster && r.MasterName != "" {
		p.add("store.redis.cluster", "a Redis Cluster has no master_name (that is Sentinel)")
	}
	// Read as the store reads it when it opens: a file without a
	// certificate would otherwise pass -check and stop the start.
	r.loadTLS(p)
	if r.DB != 0 && (len(r.Addrs) > 1 || r.Cluster) && r.MasterName == "" {
		p.add("store.redis.db", "a Redis Cluster has only database 0")
	}
	if r.DialTimeout <= 0 {
		p.add("store.redis.dial_timeout", "must be positive")
	}
	if r.OpTimeout <= 0 {
		p.add("store.redis.op_timeout", "must be positive")
	}
	oneOf(p, "store.redis.record_layout", r.RecordLayout, recordLayoutPacked, recordLayoutHash)
	n, err := strconv.Atoi(r.WaitReplicas)
	switch {
	case r.WaitReplicas == redisWaitAuto:
	case err != nil:
		p.add("store.redis.wait_replicas", "%q is neither auto nor a number of replicas (0: do not wait for replicas)", r.WaitReplicas)
	case n < 0:
		p.add("store.redis.wait_replicas", "must not be negative (0: do not wait for replicas)")
	}
	if n, auto := r.ReplicaWait(); n > 0 || auto {
		if r.WaitTimeout <= 0 {
			p.add("store.redis.wait_timeout", "must be positive when wait_replicas is set")
		}
		if n > 0 && (len(r.Addrs) > 1 || r.Cluster) && r.MasterName == "" {
			p.add("store.redis.wait_replicas", "is not supported on a Redis Cluster: WAIT covers one node's connection, and a pipeline spans nodes; use a single node with replicas, or Sentinel")
		}
	}
}

// validateRedisWait checks store.redis.wait_timeout against the route r
// (field f): a reservation that waited for the replicas is forwarded with
// its lease shortened by up to wait_timeout, and the lease must still
// outlast upstream_timeout.
func (c *Config) validateRedisWait(p *problems, f string, r *Route) {
	rd := c.Store.Redis
	if rd == nil || rd.WaitTimeout <= 0 || r.Lease <= r.UpstreamTimeout {
		return
	}
	if n, auto := rd.ReplicaWait(); n <= 0 && !auto {
		return
	}
	if margin := r.Lease - r.UpstreamTimeout; rd.WaitTimeout >= margin {
		p.add("store.redis.wait_timeout", "%s must be shorter than %s's lease minus its upstream_timeout (%s): a reservation is forwarded with its lease shortened by the wait",
			rd.WaitTimeout.D(), f, margin.D())
	}
}

// pgIdentifier is a schema or table name the store accepts: an unquoted
// PostgreSQL identifier, short enough that the table's index names
// (<table>_unscheduled, the longest) stay within PostgreSQL's 63 bytes.
var pgIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,50}$`)

func (pg *Postgres) validate(p *problems) {
	switch {
	case pg.DSNEnv == "":
		p.add("store.postgres.dsn_env", "is required: the name of the environment variable holding the connection string")
	case !headerToken.MatchString(pg.DSNEnv):
		p.add("store.postgres.dsn_env", "%q is not an environment variable name", pg.DSNEnv)
	default:
		if v, ok := os.LookupEnv(pg.DSNEnv); !ok {
			p.add("store.postgres.dsn_env", "environment variable %s is not set", pg.DSNEnv)
		} else if strings.TrimSpace(v) == "" {
			p.add("store.postgres.dsn_env", "environment variable %s is empty", pg.DSNEnv)
		}
	}
	if pg.MaxConns <= 0 {
		p.add("store.postgres.max_conns", "must be positive")
	}
	if pg.ConnectTimeout <= 0 {
		p.add("store.postgres.connect_timeout", "must be positive")
	}
	if pg.StatementTimeout < Duration(time.Millisecond) {
		p.add("store.postgres.statement_timeout", "must be at least 1ms")
	}
	if !pgIdentifier.MatchString(pg.Schema) {
		p.add("store.postgres.schema", "%q must be 1 to 51 lower-case letters, digits or '_', not starting with a digit", pg.Schema)
	}
	if !pgIdentifier.MatchString(pg.Table) {
		p.add("store.postgres.table", "%q must be 1 to 51 lower-case letters, digits or '_', not starting with a digit", pg.Table)
	}
	if pg.SynchronousCommit != "" {
		oneOf(p, "store.postgres.synchronous_commit", pg.SynchronousCommit, "on", "remote_apply", "remote_write", "local", "off")
	}
}

func (r *Route) validate(p *problems, f string, patterns *patternSet) {
	if !routeName.MatchString(r.Name) {
		p.add(f+".name", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", r.Name)
	}
	if r.Keyspace != r.Name && !routeName.MatchString(r.Keyspace) {
		p.add(f+".keyspace", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", r.Keyspace)
	}
	wildcards, ok := checkPattern(p, f+".match", r.Match, patterns)
	r.Key.validate(p, f+".key", wildcards, ok)
	oneOf(p, f+".policy", r.Policy, PolicyReserveThenCommit, PolicyReleaseOn5xx)
	oneOf(p, f+".duplicate", r.Duplicate, duplicateReplay, DuplicateReject)
	oneOf(p, f+".concurrent", r.Concurrent, concurrentReject, ConcurrentWait)
	oneOf(p, f+".on_missing_key", r.OnMissingKey, missingKeyReject, MissingKeyForward)
	oneOf(p, f+".on_store_error", r.OnStoreError, storeErrorReject, StoreErrorForward)
	for i, s := range r.ReleaseStatuses {
		if s < 400 || s > 599 {
			p.add(fmt.Sprintf("%s.release_statuses[%d]", f, i), "%d is not an error status (400-599)", s)
		}
	}
	if r.UpstreamTimeout <= 0 {
		p.add(f+".upstream_timeout", "must be positive")
	}
	if r.Lease <= r.UpstreamTimeout {
		p.add(f+".lease", "%s must exceed upstream_timeout (%s), or a slow answer could find its key taken",
			r.Lease.D(), r.UpstreamTimeout.D())
	}
	if r.TTL <= r.Lease {
		p.add(f+".ttl", "%s must exceed lease (%s)", r.TTL.D(), r.Lease.D())
	}
	if r.WaitTimeout <= 0 {
		p.add(f+".wait_timeout", "must be positive")
	}
	if r.MaxBodyBytes < 0 {
		p.add(f+".max_body_bytes", "must be positive")
	}
	if r.MaxStoredBodyBytes < 0 {
		p.add(f+".max_stored_body_bytes", "must be positive")
	}
	for i, h := range r.ReplayHeaders {
		hf := fmt.Sprintf("%s.replay_headers[%d]", f, i)
		switch {
		case !headerToken.MatchString(h):
			p.add(hf, "%q is not a header name", h)
		default:
			if why := ReplayRefusal(h, r.Scope.Header); why != "" {
				p.add(hf, "%s is never replayed: %s", h, why)
			}
		}
	}
	for i, path := range r.Fingerprint.Ignore {
		if err := keyextract.ValidatePath(path); err != nil {
			p.add(fmt.Sprintf("%s.fingerprint.ignore[%d]", f, i), "%v", err)
		}
	}
	if r.Scope.Header != "" && !headerToken.MatchString(r.Scope.Header) {
		p.add(f+".scope.header", "%q is not a header name", r.Scope.Header)
	}
	oneOf(p, f+".mode", r.Mode, modeEnforce, ModeObserve)
	if r.Reconcile != nil {
		r.validateReconcile(p, f+".reconcile")
	}
}

// validateReconcile checks a route's reconcile section. The grace must
// exceed the lease: until the lease ends the original request may still be
// waiting for its answer, and a lookup that runs while the upstream is
// still processing it answers 404, releases the key and lets the retry
// charge twice.
func (r *Route) validateReconcile(p *problems, f string) {
	rc := r.Reconcile
	method, path := rc.lookupMethod(), rc.LookupPath()
	switch {
	case rc.Lookup == "":
		p.add(f+".lookup", `required (e.g. "GET /orders/{key}/charge")`)
	case method != http.MethodGet:
		p.add(f+".lookup", "%q must be a GET: a lookup must not change anything upstream", rc.Lookup)
	case !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t#"):
		p.add(f+".lookup", "%q needs a path starting with '/' after the method", rc.Lookup)
	case strings.Count(path, LookupKeyPlaceholder) != 1 || strings.Count(path, "{") != 1 || strings.Count(path, "}") != 1:
		p.add(f+".lookup", "%q must hold {key} exactly once and no other placeholder", rc.Lookup)
	default:
		if _, err := url.Parse(strings.Replace(path, LookupKeyPlaceholder, "k", 1)); err != nil {
			p.add(f+".lookup", "%q: %v", rc.Lookup, err)
		}
	}
	if len(r.Key.Parts) > 0 {
		p.add(f+".lookup", "a composite key (key.parts) has no single value to look up; reconcile needs a single-source key")
	}
	if r.Scope.Header != "" {
		p.add(f, "not allowed with scope.header: the lookup cannot tell one client's key from another's, "+
			"and one client's charge would be replayed to another")
	}
	if rc.Grace <= r.Lease {
		p.add(f+".grace", "%s must exceed lease (%s): until then the original request may still be processed upstream, "+
			"and a lookup answering 404 would let the retry charge twice", rc.Grace.D(), r.Lease.D())
	}
	if rc.Grace >= r.TTL {
		p.add(f+".grace", "%s must be shorter than ttl (%s), or no lookup would run before the key expires", rc.Grace.D(), r.TTL.D())
	}
	if rc.Interval <= 0 {
		p.add(f+".interval", "must be positive")
	}
	if rc.AppliedStatus < 200 || rc.AppliedStatus > 299 {
		p.add(f+".applied_status", "%d is not a 2xx status: a key found applied replays a success", rc.AppliedStatus)
	}
}

func oneOf(p *problems, field, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	p.add(field, "%q is not one of %s", v, strings.Join(allowed, ", "))
}

// patternSet registers the routes' patterns in one ServeMux, which rejects
// (panics on) an invalid pattern or one that conflicts with another.
type patternSet struct {
	mux            *http.ServeMux
	fields, values []string // the patterns registered so far, and their fields
}

// add registers pattern, the value of field.
func (s *patternSet) add(field, pattern string) (err error) {
	defer func() {
		if e := recover(); e != nil {
			err = s.explain(pattern, fmt.Sprint(e))
		}
	}()
	s.mux.Handle(CanonicalPattern(pattern), http.NotFoundHandler())
	s.fields = append(s.fields, field)
	s.values = append(s.values, pattern)
	return nil
}

// explain turns ServeMux's panic message into a problem that names the
// conflicting route, not the source line that registered it.
func (s *patternSet) explain(pattern, msg string) error {
	if strings.Contains(msg, " conflicts with pattern ") {
		_, why, _ := strings.Cut(msg, ":\n")
		for i, other := range s.values {
			if conflicts(other, pattern) {
				return fmt.Errorf("%q conflicts with %s %q: %s", pattern, s.fields[i], other, why)
			}
		}
	}
	return errors.New(strings.ReplaceAll(strings.TrimPrefix(msg, "http: "), "\n", " "))
}

func conflicts(a, b string) (conflict bool) {
	defer func() { conflict = recover() != nil }()
	mux := http.NewServeMux()
	mux.Handle(CanonicalPattern(a), http.NotFoundHandler())
	mux.Handle(CanonicalPattern(b), http.NotFoundHandler())
	return false
}

// checkPattern validates a ServeMux pattern by registering it, and returns
// the names of its wildcards.
func checkPattern(p *problems, field, pattern string, patterns *patternSet) (wildcards map[string]bool, ok bool) {
	if pattern == "" {
		p.add(field, `required (a ServeMux pattern such as "POST /charges")`)
		return nil, false
	}
	if err := patterns.add(field, pattern); err != nil {
		p.add(field, "%v", err)
		return nil, false
	}
	// ServeMux accepts these, but the route would never match: its requests
	// would silently be proxied unprotected.
	if method, host := patternParts(pattern); method != strings.ToUpper(method) {
		p.add(field, "method %q never matches: HTTP methods are case-sensitive (%s)", method, strings.ToUpper(method))
	} else if strings.ContainsAny(host, " \t") {
		p.add(field, "%q never matches: its host part %q holds white space", pattern, host)
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		// A request's host is matched without its port, so a pattern's
		// host with one never matches.
		p.add(field, "%q never matches: hosts are matched on any port, so the port %q must be left out", pattern, host[i:])
	}
	wildcards = map[string]bool{}
	rest := pattern
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			break
		}
		name := strings.TrimSuffix(rest[i+1:i+j], "...")
		if name != "$" {
			wildcards[name] = true
		}
		rest = rest[i+j+1:]
	}
	return wildcards, true
}

// patternParts splits a ServeMux pattern as ServeMux does:
// [METHOD<space>][HOST]/[PATH].
func patternParts(pattern string) (method, host string) {
	rest := pattern
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		method, rest = pattern[:i], strings.TrimLeft(pattern[i+1:], " \t")
	}
	host, _, _ = strings.Cut(rest, "/")
	return method, host
}

func (k *Key) validate(p *problems, f string, wildcards map[string]bool, patternOK bool) {
	set := k.sources()
	if len(set) == 0 && len(k.Parts) == 0 {
		p.add(f, "set exactly one of json, header, query, path or parts")
		return
	}
	if len(set)+min(len(k.Parts), 1) > 1 {
		p.add(f, "set exactly one of json, header, query, path or parts")
		return
	}
	if k.Normalize != "" {
		oneOf(p, f+".normalize", k.Normalize, NormalizeNone, NormalizeNFC)
	}
	if len(k.Parts) > 0 {
		if len(k.Parts) < 2 {
			p.add(f+".parts", "a composite key needs at least two parts")
		}
		for i := range k.Parts {
			pf := fmt.Sprintf("%s.parts[%d]", f, i)
			part := &k.Parts[i]
			if len(part.Parts) > 0 {
				p.add(pf, "parts cannot be nested")
				continue
			}
			if part.Normalize != "" {
				p.add(pf+".normalize", "applies to the whole key: set it on %s.normalize", f)
				part.Normalize = ""
			}
			part.validate(p, pf, wildcards, patternOK)
		}
		return
	}
	switch {
	case k.JSON != "":
		if err := keyextract.ValidatePath(k.JSON); err != nil {
			p.add(f+".json", "%v", err)
		}
	case k.Header != "":
		if !headerToken.MatchString(k.Header) {
			p.add(f+".header", "%q is not a header name", k.Header)
		} else if strings.EqualFold(k.Header, "Host") {
			p.add(f+".header", "Host is not among a request's headers in Go; key by a path, query or body value instead")
		}
	case k.Query != "":
	case k.Path != "":
		if patternOK && !wildcards[k.Path] {
			p.add(f+".path", "the match pattern has no wildcard {%s}", k.Path)
		}
	}
}

func (k *Key) sources() []string {
	var s []string
	for _, v := range []string{k.JSON, k.Header, k.Query, k.Path} {
		if v != "" {
			s = append(s, v)
		}
	}
	return s
}

// KeyRecipe says, in one canonical line, how the route's store keys are
// made from a request: the key's sources, the scope and the
// normalisation ("header Idempotency-Key; scope header Authorization;
// normalize none"). Header names are in canonical case. Two routes (or two
// configurations) with the same recipe make the same store key of the same
// request in one keyspace; the store's keyspace registry records it.
func (r Route) KeyRecipe() string {
	scope := "none"
	if r.Scope.Header != "" {
		scope = "header " + http.CanonicalHeaderKey(r.Scope.Header)
	}
	normalize := r.Key.Normalize
	if normalize == "" {
		normalize = NormalizeNone
	}
	return r.Key.recipe() + "; scope " + scope + "; normalize " + normalize
}

// recipe is the sources part of Route.KeyRecipe.
func (k Key) recipe() string {
	if len(k.Parts) > 0 {
		parts := make([]string, len(k.Parts))
		for i, part := range k.Parts {
			parts[i] = part.recipe()
		}
		return "parts(" + strings.Join(parts, ", ") + ")"
	}
	switch {
	case k.JSON != "":
		return "json " + k.JSON
	case k.Header != "":
		return "header " + http.CanonicalHeaderKey(k.Header)
	case k.Query != "":
		return "query " + k.Query
	case k.Path != "":
		return "path " + k.Path
	}
	return "none"
}

// Spec converts the key configuration to a key extraction spec.
func (k Key) Spec() keyextract.Spec {
	if len(k.Parts) > 0 {
		s := keyextract.Spec{NFC: k.Normalize == NormalizeNFC}
		for _, part := range k.Parts {
			s.Parts = append(s.Parts, part.Spec().Parts...)
		}
		return s
	}
	var src keyextract.Source
	switch {
	case k.JSON != "":
		src = keyextract.Source{Kind: keyextract.JSON, Name: k.JSON}
	case k.Header != "":
		src = keyextract.Source{Kind: keyextract.Header, Name: k.Header}
	case k.Query != "":
		src = keyextract.Source{Kind: keyextract.Query, Name: k.Query}
	case k.Path != "":
		src = keyextract.Source{Kind: keyextract.Path, Name: k.Path}
	}
	return keyextract.Spec{Parts: []keyextract.Source{src}, NFC: k.Normalize == NormalizeNFC}
}

// CanonicalPattern lower-cases the host of a ServeMux pattern
// ("POST API.example.com./charges") and drops its final dot, so that it
// matches the canonical host of a request. The proxy registers patterns
// in this form, and validation checks them for conflicts in it.
func CanonicalPattern(pattern string) string {
	method, rest := "", pattern
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		method, rest = pattern[:i+1], strings.TrimLeft(pattern[i+1:], " \t")
	}
	slash := strings.IndexByte(rest, '/')
	if slash <= 0 {
		return pattern // no host
	}
	host := strings.ToLower(strings.TrimRight(rest[:slash], "."))
	return method + host + rest[slash:]
}

// redactedURL is u for a problem: without the password it may carry
// ("http://user:secret@host"), which would go to the logs with it, and
// otherwise as written ("http://", which a URL's String would turn into
// "http:").
func redactedURL(u string) string {
	if p, err := url.Parse(u); err == nil {
		if _, ok := p.User.Password(); ok {
			return p.Redacted()
		}
		return u
	}
	if scheme, rest, ok := strings.Cut(u, "://"); ok {
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			return scheme + "://xxxxx" + rest[i:]
		}
	}
	return u
}
