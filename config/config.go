// Package config loads, defaults and validates idemproxy's YAML
// configuration.
//
// Load decodes strictly (unknown fields are errors), applies every default in
// one place (applyDefaults) and validates the result, reporting every problem
// at once with the name of the field it concerns.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Policies: what an upstream's 5xx answer does to the key.
// PolicyReserveThenCommit commits it, since the error may come after the
// side effect; PolicyReleaseOn5xx releases it, for an upstream whose every
// 5xx means that nothing was done (docs/concepts.md, the table "What the
// upstream's outcome does to the key").
const (
	PolicyReserveThenCommit = "reserve-then-commit"
	PolicyReleaseOn5xx      = "release-on-5xx"
)

// Answers to duplicates, concurrent duplicates, missing keys and store
// errors.
const (
	duplicateReplay   = "replay"
	DuplicateReject   = "reject"
	concurrentReject  = "reject"
	ConcurrentWait    = "wait"
	missingKeyReject  = "reject"
	MissingKeyForward = "forward"
	storeErrorReject  = "reject"
	StoreErrorForward = "forward"
)

// Preallocation of the Badger store's files (store.badger.preallocate):
// preallocateAuto uses the seccomp supervisor when the kernel allows it and
// runs without otherwise; PreallocateOff never installs it;
// PreallocateRequired refuses to start without it.
const (
	preallocateAuto     = "auto"
	PreallocateOff      = "off"
	PreallocateRequired = "required"
)

// Record layouts of the Redis store (store.redis.record_layout):
// recordLayoutPacked writes each record as one packed string (one write
// per change), which releases before it cannot read; recordLayoutHash
// writes the hashes those releases wrote, for a rolling upgrade from them
// or before a rollback to them. Both read either layout.
const (
	recordLayoutPacked = "packed"
	recordLayoutHash   = "hash"
)

// Route modes: enforce answers duplicates from the store; observe does the
// bookkeeping but forwards every request, counting what enforce would have
// done.
const (
	modeEnforce = "enforce"
	ModeObserve = "observe"
)

// Config is the whole configuration file.
type Config struct {
	// Listen is the address clients connect to (host:port). Required.
	Listen string `yaml:"listen"`
	// Upstream is the base URL of the protected service. Required.
	Upstream string `yaml:"upstream"`
	// UpstreamTLS configures TLS to an https upstream; its zero value
	// verifies the upstream against the system's roots.
	UpstreamTLS UpstreamTLS `yaml:"upstream_tls"`
	// Admin configures the admin listener; an empty Admin.Listen means none.
	Admin Admin `yaml:"admin"`
	// Store selects the key store; empty means Badger in ./data.
	Store Store `yaml:"store"`
	// Server holds the client-facing server's timeouts.
	Server Server `yaml:"server"`
	// Metrics configures the series of /metrics.
	Metrics Metrics `yaml:"metrics"`
	// Tracing turns OpenTelemetry traces on; its zero value is off.
	Tracing Tracing `yaml:"tracing"`
	// File is about the configuration file itself: whether a change of
	// its content is applied without being asked.
	File File `yaml:"config"`
	// Routes are the protected routes. Requests that match none are proxied
	// untouched.
	Routes []Route `yaml:"routes"`
	// MemoryLimit is the Go runtime's soft memory limit in bytes (see
	// runtime/debug.SetMemoryLimit). Zero (default) means: GOMEMLIMIT when
	// set, else 80% of the container's cgroup limit, else
	// DefaultMemoryLimit. -1 means no soft limit.
	MemoryLimit int64 `yaml:"memory_limit"`
}

// File is the configuration file's own section, "config".
type File struct {
	// Watch applies a change of the file's content as a reload does,
	// checked every WatchInterval: a file rewritten in place, renamed over,
	// or a Kubernetes ConfigMap's symlink swap. A file that fails to load
	// keeps the running configuration. Default false.
	Watch bool `yaml:"watch"`
}

// WatchInterval is how often config.watch reads the file for a change.
const WatchInterval = time.Second

// UpstreamTLS configures TLS to an https upstream. Its files are checked
// whenever the configuration is loaded (at start, by -check, by a reload)
// but used as read at start: a reload refuses a change to this section,
// and a file rewritten in place takes effect at the next restart.
type UpstreamTLS struct {
	// CAFile is a PEM bundle of the CAs that sign the upstream's
	// certificate; set, they replace the system's roots (a private CA is
	// then the only one trusted). Empty means the system's roots.
	CAFile string `yaml:"ca_file"`
	// ServerName is the name sent in SNI and checked against the
	// upstream's certificate. Empty means the upstream URL's host.
	ServerName string `yaml:"server_name"`
	// CertFile and KeyFile are the PEM client certificate (with its
	// chain) and private key presented to an upstream that asks for one
	// (mutual TLS); both or neither. Empty means none.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// MinVersion is the oldest TLS version accepted: "1.2" or "1.3".
	// Empty means 1.2.
	MinVersion string `yaml:"min_version"`
}

// Admin configures the admin listener (metrics, health, key inspection).
type Admin struct {
	// Listen is the admin address; empty means no admin listener.
	Listen string `yaml:"listen"`
	// TokenEnv names the environment variable that holds the bearer token
	// for /v1/keys. Default IDEMPROXY_ADMIN_TOKEN.
	TokenEnv string `yaml:"token_env"`
	// Pprof serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on the admin listener, behind the admin token, for
	// profiling a proxy under its real load. Default false.
	Pprof bool `yaml:"pprof"`
	// MaxConnections bounds the admin listener's connections open at once,
	// apart from server.max_connections, so that nothing on the admin port
	// can take the descriptors the charge path needs. At the bound a
	// newcomer takes the place of a connection not serving a request from
	// the client address that holds the most, when its own address holds
	// fewer; otherwise it is closed at once. Default 64 (0 means the
	// default).
	MaxConnections int `yaml:"max_connections"`
}

// Tracing configures OpenTelemetry traces (docs/observability.md). Where
// spans go and which are kept is configured the standard way, by the
// OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME,
// OTEL_SDK_DISABLED, ...); a reload may turn tracing on or off.
type Tracing struct {
	// Enabled turns tracing on. Default false.
	Enabled bool `yaml:"enabled"`
}

// Metrics configures the series /metrics exports.
type Metrics struct {
	// RouteHistograms is how many routes, the first in the order of
	// routes, have latency histograms of their own
	// (idemproxy_request_duration_seconds and
	// idemproxy_upstream_request_duration_seconds with their route name);
	// the other routes' latencies are counted together under the route
	// label OtherRoutes. Every route keeps its own counters. Zero means
	// DefaultRouteHistograms; -1 means none: every latency is counted
	// under OtherRoutes.
	RouteHistograms int `yaml:"route_histograms"`
}

// OtherRoutes is the route label of the latency histograms of the routes
// past metrics.route_histograms. Route names cannot take this value.
const OtherRoutes = "(other)"

// Store selects exactly one backend.
type Store struct {
	Badger   *Badger   `yaml:"badger"`
	Redis    *Redis    `yaml:"redis"`
	Postgres *Postgres `yaml:"postgres"`
	// EpochCheckInterval is how often each replica checks the store's
	// epoch marker, which tells a store that forgot its keys (restarted
	// empty, flushed, truncated, evicted, a replaced directory). A shared
	// store's new marker waits three intervals for replicas that remember
	// an older one to object. Default 2s.
	EpochCheckInterval Duration `yaml:"epoch_check_interval"`
	// CanaryInterval is how often each replica writes a canary record to
	// the store and reads back one it wrote earlier (internal/canary): a
	// canary missing before its TTL means the store lost writes (an
	// eviction, a failover to a replica that missed them, a restore of an
	// older backup). Default 1s.
	CanaryInterval Duration `yaml:"canary_interval"`
	// WitnessWindow is how long each replica remembers the keys it
	// answered (internal/witness): a reservation that succeeds on one of
	// them within the window, released by no one on purpose, means the
	// store lost it. Default 5m.
	WitnessWindow Duration `yaml:"witness_window"`
	// WitnessMaxKeys bounds the keys the witness remembers (16 bytes
	// each, allocated at start); past it, the oldest are forgotten early.
	// Default 65536 (1 MiB): five minutes at 200 answers a second.
	WitnessMaxKeys int `yaml:"witness_max_keys"`
}

// MaxWitnessWindow bounds store.witness_window. An operator's release
// mark lasts that long (and a margin) whatever the window of the replica
// that writes it: the replicas sharing a store may remember their answers
// for different windows.
const MaxWitnessWindow = time.Hour

// The bounds of store.witness_max_keys: 16 KiB to 1 GiB of memory.
const (
	minWitnessMaxKeys = 1 << 10
	maxWitnessMaxKeys = 1 << 26
)

// Badger configures the embedded store.
type Badger struct {
	// Dir is the data directory, created if missing. Default ./data.
	Dir string `yaml:"dir"`
	// SyncWrites makes every write durable before it returns, so that a
	// reservation is on disk before the request is forwarded. Default true.
	SyncWrites *bool `yaml:"sync_writes"`
	// GCInterval is how often value-log garbage collection runs. Default 5m.
	GCInterval Duration `yaml:"gc_interval"`
	// MinFreeBytes is the free-space floor of the data directory's file
	// system: below it new reservations are refused (503), so that Badger
	// never writes into a full disk. Default 64 MiB.
	MinFreeBytes int64 `yaml:"min_free_bytes"`
	// Preallocate says whether the files Badger grows are preallocated
	// (a seccomp filter turns its ftruncate into fallocate, so that a full
	// disk is an error and not a SIGBUS): auto (the default) where the
	// kernel allows it, off never, required or the process refuses to
	// start. Empty means auto.
	Preallocate string `yaml:"preallocate"`
}

// Redis configures the shared store.
type Redis struct {
	// Addrs: one address is a single node, several a cluster; with
	// MasterName they are Sentinels.
	Addrs      []string `yaml:"addrs"`
	MasterName string   `yaml:"master_name"`
	// Cluster makes a single address a Redis Cluster configuration
	// endpoint (as managed services give one).
	Cluster bool `yaml:"cluster"`
	// UsernameEnv and PasswordEnv name environment variables; credentials
	// never come from the file. SentinelUsernameEnv and
	// SentinelPasswordEnv do the same for the Sentinels themselves.
	UsernameEnv         string `yaml:"username_env"`
	PasswordEnv         string `yaml:"password_env"`
	SentinelUsernameEnv string `yaml:"sentinel_username_env"`
	SentinelPasswordEnv string `yaml:"sentinel_password_env"`
	DB                  int    `yaml:"db"`
	// TLS turns TLS on; TLSCAFile, when set, is a PEM bundle of the CAs to
	// trust instead of the system's.
	TLS       bool   `yaml:"tls"`
	TLSCAFile string `yaml:"tls_ca_file"`
	// SkipEvictionCheck stops the checks of the settings that lose keys
	// (eviction policy, persistence, evictions, connected replicas), for a
	// Redis that hides INFO and is known to be configured safely.
	SkipEvictionCheck bool `yaml:"skip_eviction_check"`
	// AllowEviction accepts a maxmemory-policy other than noeviction (with
	// a maxmemory): protected requests are served instead of refused with
	// 503 store-unsafe-settings. An eviction seen still marks the store
	// lost.
	AllowEviction bool `yaml:"allow_eviction"`
	// AllowNoPersistence accepts a Redis with neither the append-only file
	// nor RDB snapshots: protected requests are served instead of refused.
	AllowNoPersistence bool `yaml:"allow_no_persistence"`
	// KeyPrefix prefixes every Redis key. Default "idemproxy:".
	KeyPrefix string `yaml:"key_prefix"`
	// DialTimeout default 1s; OpTimeout default 500ms.
	DialTimeout Duration `yaml:"dial_timeout"`
	OpTimeout   Duration `yaml:"op_timeout"`
	// WaitReplicas is auto (the default) or a number of replicas. A
	// number N above 0 makes every write of a record wait (Redis WAIT)
	// until N replicas acknowledged it; fewer within WaitTimeout fail the
	// write (a reservation answers 503). Auto waits for one replica
	// whenever the master reports one or more online, and for none
	// when it reports none (and on a Redis Cluster). 0: no waiting, and a
	// failover may lose the writes of the last replication lag. A number
	// above 0 is not supported on a Redis Cluster. See ReplicaWait.
	WaitReplicas string `yaml:"wait_replicas"`
	// WaitTimeout bounds each wait for the replicas. Default 500ms; it
	// must be shorter than every route's lease minus its
	// upstream_timeout.
	WaitTimeout Duration `yaml:"wait_timeout"`
	// RecordLayout is the layout records are written in: packed (the
	// default: one string, one write per change) or hash (the hashes of
	// releases before the packed layout, which cannot read packed
	// records). Either is read whatever it says. Empty means packed.
	RecordLayout string `yaml:"record_layout"`
}

// redisWaitAuto is store.redis.wait_replicas' auto.
const redisWaitAuto = "auto"

// ReplicaWait returns store.redis.wait_replicas (validated): auto, or the
// number of replicas every write waits for.
func (r *Redis) ReplicaWait() (n int, auto bool) {
	if r.WaitReplicas == redisWaitAuto {
		return 0, true
	}
	n, _ = strconv.Atoi(r.WaitReplicas)
	return n, false
}

// Postgres configures the PostgreSQL store.
type Postgres struct {
	// DSNEnv names the environment variable holding the connection string
	// (libpq keyword/value or URL form); credentials never come from the
	// file. Required.
	DSNEnv string `yaml:"dsn_env"`
	// MaxConns is the connection pool's size. Default 16.
	MaxConns int `yaml:"max_conns"`
	// ConnectTimeout bounds getting a connection, pooled or new, per host
	// the DSN lists (they are tried in turn). Default 1s.
	ConnectTimeout Duration `yaml:"connect_timeout"`
	// StatementTimeout is set as statement_timeout on every connection and
	// bounds every store statement. Default 500ms.
	StatementTimeout Duration `yaml:"statement_timeout"`
	// Schema and Table name the table of key records, created when missing.
	// Default "public" and "idemproxy_keys".
	Schema string `yaml:"schema"`
	Table  string `yaml:"table"`
	// SynchronousCommit, when set, is set as synchronous_commit on every
	// connection: on, remote_apply, remote_write, local or off. Empty: the
	// server's setting.
	SynchronousCommit string `yaml:"synchronous_commit"`
}

// Server holds the client-facing server's limits.
type Server struct {
	// ReadHeaderTimeout default 10s; ReadTimeout (whole request) default
	// 60s; IdleTimeout default 120s.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	ReadTimeout       Duration `yaml:"read_timeout"`
	IdleTimeout       Duration `yaml:"idle_timeout"`
	// PassthroughTimeout bounds requests that match no route. Default 60s.
	PassthroughTimeout Duration `yaml:"passthrough_timeout"`
	// DrainDelay is how long the proxy keeps accepting requests after a
	// SIGTERM while /readyz already answers 503. Default 0s.
	DrainDelay Duration `yaml:"drain_delay"`
	// ShutdownTimeout is how long in-flight requests get to finish on
	// shutdown; those cut by it leave their keys in doubt. Default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// MaxBufferedBytes bounds the request bytes buffered at once over all
	// protected routes; a request that does not fit is answered 503
	// overloaded before anything is stored or forwarded. Default 64 MiB.
	MaxBufferedBytes int64 `yaml:"max_buffered_bytes"`
	// MaxBufferedBytesPerClient bounds the part of max_buffered_bytes that
	// the request bodies of one client (one IPv4 address, one IPv6 /64)
	// hold at once; a client holding nothing else may always start one
	// body. Default (0) max_buffered_bytes / 8.
	MaxBufferedBytesPerClient int64 `yaml:"max_buffered_bytes_per_client"`
	// BodyTimeout bounds the time a protected route's request body takes
	// to arrive, from the end of its headers; a body cut by it is answered
	// 408 body-timeout. Default (0) 10s; read_timeout still applies when
	// shorter.
	BodyTimeout Duration `yaml:"body_timeout"`
	// MaxConnections bounds the client connections open at once and the
	// requests in flight over them; at the bound the oldest idle
	// connection is closed to admit a new one, and with none idle further
	// connections wait in the listen backlog. Default 1024.
	MaxConnections int `yaml:"max_connections"`
	// MaxRequestsPerClient bounds the requests in flight from one client
	// (one IPv4 address, one IPv6 /64) over all its connections and
	// protocols; one more is answered 503 overloaded before it is read.
	// Default (0) max_connections / 4; max_connections turns it off.
	MaxRequestsPerClient int `yaml:"max_requests_per_client"`
	// MaxClientResetsPerSecond is the rate of HTTP/2 streams a client may
	// reset (RST_STREAM frames it sends), kept up, with ten seconds of it
	// at once; past it the client's connections are closed and new ones
	// refused until its resets drain (at most 10 s). Default (0) 100.
	MaxClientResetsPerSecond int `yaml:"max_client_resets_per_second"`
	// MaxResetsPerSecond is the rate of HTTP/2 streams all clients
	// together may reset, one second of it at once; past it the proxy
	// sheds: a connection that resets more than half the streams it
	// opened is closed as it reads its next reset, whatever its address.
	// Default (0) 1000.
	MaxResetsPerSecond int `yaml:"max_resets_per_second"`
}

// Route is one protected route.
type Route struct {
	// Name is used in metrics, logs and the admin API, and is the default
	// Keyspace. Required; letters, digits, '.', '_' and '-'.
	Name string `yaml:"name"`
	// Keyspace is the prefix the route's keys are stored under. Default:
	// the route's name; the same characters as a name. A route renamed
	// with its keyspace kept finds every key stored before; two routes
	// share a keyspace only when their keys are made alike (KeyRecipe).
	Keyspace string `yaml:"keyspace"`
	// Match is a Go 1.22 ServeMux pattern ("POST /charges",
	// "PUT /orders/{id}").
	Match string `yaml:"match"`
	// Key says where the idempotency key comes from. Required.
	Key Key `yaml:"key"`
	// Policy is reserve-then-commit (default) or release-on-5xx.
	Policy string `yaml:"policy"`
	// ReleaseStatuses, when set, replaces the policy's release set.
	ReleaseStatuses []int `yaml:"release_statuses"`
	// Duplicate is replay (default) or reject.
	Duplicate string `yaml:"duplicate"`
	// Concurrent is reject (default) or wait.
	Concurrent string `yaml:"concurrent"`
	// WaitTimeout bounds concurrent: wait. Default 5s.
	WaitTimeout Duration `yaml:"wait_timeout"`
	// OnMissingKey is reject (default, 400) or forward (unprotected).
	OnMissingKey string `yaml:"on_missing_key"`
	// OnStoreError is reject (default, 503) or forward (fail open).
	OnStoreError string `yaml:"on_store_error"`
	// TTL is how long a completed or in-doubt key is remembered. Default 24h.
	TTL Duration `yaml:"ttl"`
	// Lease is how long a reservation stays in flight. Default
	// upstream_timeout + 5s; must exceed upstream_timeout.
	Lease Duration `yaml:"lease"`
	// UpstreamTimeout bounds the forwarded request. Default 30s.
	UpstreamTimeout Duration `yaml:"upstream_timeout"`
	// MaxBodyBytes caps the request body (413 beyond). Default 1 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxStoredBodyBytes caps a stored answer's body. A larger answer is
	// passed to the client and committed without its body; duplicates then
	// get 409. Default 1 MiB.
	MaxStoredBodyBytes int64 `yaml:"max_stored_body_bytes"`
	// ReplayHeaders is the allow-list of response headers stored and
	// replayed. Default defaultReplayHeaders.
	ReplayHeaders []string `yaml:"replay_headers"`
	// Fingerprint configures the request fingerprint.
	Fingerprint Fingerprint `yaml:"fingerprint"`
	// Scope gives each client its own key space.
	Scope Scope `yaml:"scope"`
	// Mode is enforce (default) or observe: keys are reserved and
	// committed, but every request is forwarded and what enforce would
	// have answered is only counted.
	Mode string `yaml:"mode"`
	// Reconcile, when set, resolves in-doubt keys by asking the upstream.
	Reconcile *Reconcile `yaml:"reconcile"`
}

// Reconcile configures the lookup that resolves a route's in-doubt keys.
type Reconcile struct {
	// Lookup is "GET /path/{key}/...": the request sent to the upstream;
	// {key} is replaced by the idempotency key, path-escaped. A 404 or 410
	// answer releases the key, a 2xx completes it with the answer, anything
	// else leaves it in doubt until the next try.
	Lookup string `yaml:"lookup"`
	// Grace is how long after a key turned in doubt the first lookup is
	// sent: the upstream must have finished (or dropped) the original
	// request by then. Default the larger of defaultReconcileGrace and
	// twice the lease; it must exceed the lease (and so upstream_timeout).
	Grace Duration `yaml:"grace"`
	// Interval is the time between lookups of a key that stays in doubt.
	// Default defaultReconcileInterval.
	Interval Duration `yaml:"interval"`
	// AppliedStatus is the status a key the lookup found applied replays:
	// the answer the route's request gives when it succeeds, not the
	// lookup's (a GET's 200). Default defaultReconcileAppliedStatus (201,
	// what a client of a POST that creates expects); 200 to 299.
	AppliedStatus int `yaml:"applied_status"`
}

// lookupMethod and LookupPath split Lookup ("GET /orders/{key}/charge").
func (r *Reconcile) lookupMethod() string {
	m, _, _ := strings.Cut(r.Lookup, " ")
	return m
}

// LookupPath returns the path of Lookup, with its {key} placeholder.
func (r *Reconcile) LookupPath() string {
	_, p, _ := strings.Cut(r.Lookup, " ")
	return strings.TrimLeft(p, " ")
}

// LookupKeyPlaceholder is what Reconcile.Lookup's path holds where the
// idempotency key goes.
const LookupKeyPlaceholder = "{key}"

// Key is exactly one key source, or Parts for a composite key.
type Key struct {
	JSON   string `yaml:"json"`
	Header string `yaml:"header"`
	Query  string `yaml:"query"`
	Path   string `yaml:"path"`
	Parts  []Key  `yaml:"parts"`
	// Normalize is "none" (the default: keys are compared byte for byte)
	// or "nfc": the key, every part of a composite one, is put in Unicode
	// Normalization Form C before it is checked and stored, so that two
	// spellings of one text ("CAFÉ-1" with U+00C9, and with E and U+0301)
	// are one key. It applies to the key only, not to the fingerprint.
	// Set on the key, not on its parts.
	Normalize string `yaml:"normalize"`
}

// The key normalizations (key.normalize).
const (
	NormalizeNone = "none"
	NormalizeNFC  = "nfc"
)

// Fingerprint configures how requests under one key are compared.
type Fingerprint struct {
	// Ignore lists JSON paths left out of the fingerprint (a send timestamp).
	Ignore []string `yaml:"ignore"`
	// Disabled turns the comparison off: a different request under a known
	// key is treated as a duplicate, as Mule's validator does.
	Disabled bool `yaml:"disabled"`
}

// Scope configures per-client key spaces.
type Scope struct {
	// Header is hashed into the store key; a request without it is a 400.
	Header string `yaml:"header"`
}

// defaultReplayHeaders are the response headers stored and replayed when a
// route does not list its own.
var defaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
	"Location", "ETag", "Last-Modified", "Link", "Cache-Control",
}

// Duration is a time.Duration written in YAML as a string with a unit
// ("500ms", "35s", "24h", "7d"). A bare number is rejected, so that "30"
// never silently means 30 nanoseconds.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML implements yaml.Unmarshaler. Its errors are *yaml.TypeError,
// so that the decoder goes on and reports them with every other type error
// and unknown field in the file.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode || n.Kind == yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{
			fmt.Sprintf("line %d: a duration such as \"30s\" expected, not %s", n.Line, describe(n))}}
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return &yaml.TypeError{Errors: []string{
			fmt.Sprintf("line %d: duration %q needs a unit, e.g. \"30s\" or \"24h\"", n.Line, n.Value)}}
	}
	v, err := parseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*d = Duration(v)
	return nil
}

// LogValue implements slog.LogValuer: a Duration is logged as a duration,
// not as its number of nanoseconds.
func (d Duration) LogValue() slog.Value { return slog.DurationValue(time.Duration(d)) }

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// parseDuration is time.ParseDuration plus a whole number of days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	return v, nil
}

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(b)
}

// Parse decodes, defaults and validates a configuration. A file that is
// not YAML is a plain error; every other problem (an unknown or repeated
// field, a value of the wrong type, a validation failure) is reported in
// one *validationError, each problem with its field path and, when the
// file writes the field (or a section around it), its line.
func Parse(b []byte) (*Config, error) { return parse(b, Overrides{}) }

// ParseWith is Parse with the overrides in place of the file's values.
func ParseWith(b []byte, o Overrides) (*Config, error) { return parse(b, o) }

func parse(b []byte, o Overrides) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("parse config: the file is empty")
		}
		return nil, syntaxError(b, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse config: the file holds more than one YAML document")
	}
	if len(root.Content) == 0 {
		return nil, errors.New("parse config: the file is empty")
	}
	empty := emptyStores(&root)

	// Decoding problems are found on the tree, with their paths; the
	// offending values are dropped so that the rest is still validated.
	var dc decodeChecker
	var c Config
	fileOK := dc.walk(root.Content[0], reflect.TypeFor[Config](), "")
	if len(dc.problems) == 0 {
		// Strictly, from the file itself: what the walk leaves to the
		// decoder (aliases, merge keys) is checked too.
		strict := yaml.NewDecoder(bytes.NewReader(b))
		strict.KnownFields(true)
		if err := strict.Decode(&c); err != nil {
			return nil, fmt.Errorf("parse config: %w", err)
		}
	} else if !fileOK {
		return nil, &validationError{Problems: dc.problems}
	} else if err := root.Decode(&c); err != nil {
		dc.problems = append(dc.problems, lineRE.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n  "), ""))
	}
	o.apply(&c)
	c.applyDefaults()
	problems := dc.problems // each with its line already
	for _, p := range empty {
		problems = append(problems, withLine(root.Content[0], p))
	}
	var ve *validationError
	if err := c.Validate(); errors.As(err, &ve) {
		for _, p := range ve.Problems {
			if named, ok := o.name(p); ok {
				problems = append(problems, named)
			} else if !dc.covers(p) {
				problems = append(problems, withLine(root.Content[0], p))
			}
		}
	} else if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, &validationError{Problems: problems}
	}
	return &c, nil
}

// emptyStores reports store sections written with nothing under them
// ("redis:" with every field commented out). YAML reads them as absent, and
// an absent store is the per-replica Badger default: replicas meant to share
// Redis would each accept every key once.
func emptyStores(root *yaml.Node) []string {
	if len(root.Content) == 0 {
		return nil
	}
	store := mappingValue(root.Content[0], "store")
	if store != nil && store.Tag == "!!null" {
		return []string{"store: the section is empty; give badger, redis or postgres, or remove it"}
	}
	var problems []string
	for _, name := range []string{"badger", "redis", "postgres"} {
		if v := mappingValue(store, name); v != nil && v.Tag == "!!null" {
			problems = append(problems, "store."+name+": the section is empty; give its fields or remove it")
		}
	}
	return problems
}

// mappingValue returns the value under key in a mapping node, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
