package config

import (
	"net/http"
	"time"
)

// Defaults, in one place.
const (
	DefaultTTL                      = 24 * time.Hour
	DefaultUpstreamTimeout          = 30 * time.Second
	DefaultLeaseMargin              = 5 * time.Second
	DefaultWaitTimeout              = 5 * time.Second
	DefaultMaxBodyBytes             = 1 << 20
	DefaultMaxStoredBodyBytes       = 1 << 20
	DefaultBadgerDir                = "./data"
	DefaultGCInterval               = 5 * time.Minute
	DefaultBadgerMinFreeBytes       = 64 << 20
	DefaultBadgerPreallocate        = PreallocateAuto
	DefaultRedisKeyPrefix           = "idemproxy:"
	DefaultRedisDialTimeout         = time.Second
	DefaultRedisOpTimeout           = 500 * time.Millisecond
	DefaultRedisRecordLayout        = RecordLayoutPacked
	DefaultRedisWaitReplicas        = RedisWaitAuto          // wait for one replica whenever the master reports one: a promotion loses no acknowledged write
	DefaultRedisWaitTimeout         = 500 * time.Millisecond // a replica nearby acks in ~1ms: 500ms means down or far behind; 503 within op_timeout + wait_timeout (1s), well inside the 5s lease margin
	DefaultEpochCheckInterval       = 2 * time.Second
	DefaultCanaryInterval           = time.Second
	DefaultWitnessWindow            = 5 * time.Minute
	DefaultWitnessMaxKeys           = 1 << 16
	DefaultPostgresMaxConns         = 16
	DefaultPostgresConnectTimeout   = time.Second
	DefaultPostgresStatementTimeout = 500 * time.Millisecond
	DefaultPostgresSchema           = "public"
	DefaultPostgresTable            = "idemproxy_keys"
	DefaultAdminTokenEnv            = "IDEMPROXY_ADMIN_TOKEN"
	DefaultAdminMaxConnections      = 64
	DefaultReadHeaderTimeout        = 10 * time.Second
	DefaultReadTimeout              = 60 * time.Second
	DefaultIdleTimeout              = 120 * time.Second
	DefaultPassthroughTimeout       = 60 * time.Second
	DefaultShutdownTimeout          = 30 * time.Second
	DefaultMaxBufferedBytes         = 64 << 20
	DefaultMaxConnections           = 1024
	DefaultBodyTimeout              = 10 * time.Second
	DefaultReconcileGrace           = 5 * time.Minute
	DefaultReconcileInterval        = time.Minute
	// DefaultReconcileAppliedStatus is reconcile.applied_status's default:
	// the status of a POST that created what it was asked to (201
	// Created), which a client retrying a charge expects.
	DefaultReconcileAppliedStatus = http.StatusCreated
	// DefaultRouteHistograms is metrics.route_histograms' default: each
	// route with its own histograms adds about 200 series (19 KiB of
	// text) at start and 17 more per upstream status, so 50 keep them
	// near 1 MiB, and 10,000 routes under 10 MB whatever their clients do.
	DefaultRouteHistograms = 50
	// DefaultMemoryLimit is the soft memory limit when neither the
	// configuration, GOMEMLIMIT nor a cgroup limit gives one.
	DefaultMemoryLimit = 48 << 20
	// MinMemoryLimit is the smallest memory_limit accepted: below it the
	// store's own buffers do not fit and the garbage collector would run
	// without pause.
	MinMemoryLimit = 16 << 20
	// DefaultClientShare: one client holds at most max_buffered_bytes /
	// DefaultClientShare, unless max_buffered_bytes_per_client says
	// otherwise.
	DefaultClientShare = 8
	// DefaultClientRequestShare: one client has at most max_connections /
	// DefaultClientRequestShare requests in flight, unless
	// max_requests_per_client says otherwise.
	DefaultClientRequestShare = 4
	// DefaultMaxClientResetsPerSecond is the rate of HTTP/2 stream resets
	// a client may keep up (and ten seconds of it at once) before its
	// connections are closed and refused.
	DefaultMaxClientResetsPerSecond = 100
	// DefaultMaxResetsPerSecond is the rate of HTTP/2 stream resets all
	// clients together may keep up (one second of it at once) before the
	// connections that reset more than they are served are shed.
	DefaultMaxResetsPerSecond = 1000
)

// applyDefaults fills every unset field. It is the only place defaults are
// applied.
func (c *Config) applyDefaults() {
	if c.Admin.TokenEnv == "" {
		c.Admin.TokenEnv = DefaultAdminTokenEnv
	}
	if c.Admin.MaxConnections == 0 {
		c.Admin.MaxConnections = DefaultAdminMaxConnections
	}
	c.Store.applyDefaults()
	s := &c.Server
	setDuration(&s.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	setDuration(&s.ReadTimeout, DefaultReadTimeout)
	setDuration(&s.IdleTimeout, DefaultIdleTimeout)
	setDuration(&s.PassthroughTimeout, DefaultPassthroughTimeout)
	setDuration(&s.ShutdownTimeout, DefaultShutdownTimeout)
	if s.MaxBufferedBytes == 0 {
		s.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if s.MaxBufferedBytesPerClient == 0 && s.MaxBufferedBytes > 0 {
		s.MaxBufferedBytesPerClient = s.MaxBufferedBytes / DefaultClientShare
	}
	setDuration(&s.BodyTimeout, DefaultBodyTimeout)
	if s.MaxConnections == 0 {
		s.MaxConnections = DefaultMaxConnections
	}
	if s.MaxRequestsPerClient == 0 && s.MaxConnections > 0 {
		s.MaxRequestsPerClient = max(s.MaxConnections/DefaultClientRequestShare, 1)
	}
	if s.MaxClientResetsPerSecond == 0 {
		s.MaxClientResetsPerSecond = DefaultMaxClientResetsPerSecond
	}
	if s.MaxResetsPerSecond == 0 {
		s.MaxResetsPerSecond = DefaultMaxResetsPerSecond
	}
	if c.Metrics.RouteHistograms == 0 {
		c.Metrics.RouteHistograms = DefaultRouteHistograms
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		setString(&r.Keyspace, r.Name)
		setString(&r.Policy, PolicyReserveThenCommit)
		setString(&r.Duplicate, DuplicateReplay)
		setString(&r.Concurrent, ConcurrentReject)
		setString(&r.OnMissingKey, MissingKeyReject)
		setString(&r.OnStoreError, StoreErrorReject)
		setString(&r.Mode, ModeEnforce)
		setString(&r.Key.Normalize, NormalizeNone)
		setDuration(&r.WaitTimeout, DefaultWaitTimeout)
		setDuration(&r.TTL, DefaultTTL)
		setDuration(&r.UpstreamTimeout, DefaultUpstreamTimeout)
		setDuration(&r.Lease, r.UpstreamTimeout.D()+DefaultLeaseMargin)
		if r.MaxBodyBytes == 0 {
			r.MaxBodyBytes = DefaultMaxBodyBytes
		}
		if r.MaxStoredBodyBytes == 0 {
			r.MaxStoredBodyBytes = DefaultMaxStoredBodyBytes
		}
		if r.ReplayHeaders == nil {
			r.ReplayHeaders = append([]string(nil), DefaultReplayHeaders...)
		}
		for j, h := range r.ReplayHeaders {
			r.ReplayHeaders[j] = http.CanonicalHeaderKey(h)
		}
		if rc := r.Reconcile; rc != nil {
			// The first lookup waits well past the window in which the
			// original request may still be processed upstream.
			setDuration(&rc.Grace, max(DefaultReconcileGrace, 2*r.Lease.D()))
			setDuration(&rc.Interval, DefaultReconcileInterval)
			if rc.AppliedStatus == 0 {
				rc.AppliedStatus = DefaultReconcileAppliedStatus
			}
		}
	}
}

// DefaultStore is the kind of store used when the configuration sets none:
// Badger, in DefaultBadgerDir.
const DefaultStore = StoreBadger

// applyDefaults selects DefaultStore when no kind of store is set, and
// fills the unset fields of the selected section (of every section set:
// Validate refuses more than one).
func (s *Store) applyDefaults() {
	if s.Kind() == "" {
		for _, k := range storeKinds {
			if k.name == DefaultStore {
				k.add(s)
			}
		}
	}
	setDuration(&s.EpochCheckInterval, DefaultEpochCheckInterval)
	setDuration(&s.CanaryInterval, DefaultCanaryInterval)
	setDuration(&s.WitnessWindow, DefaultWitnessWindow)
	if s.WitnessMaxKeys == 0 {
		s.WitnessMaxKeys = DefaultWitnessMaxKeys
	}
	for _, k := range s.kindsSet() {
		k.section(s).applyDefaults()
	}
}

func (b *Badger) applyDefaults() {
	setString(&b.Dir, DefaultBadgerDir)
	if b.SyncWrites == nil {
		t := true
		b.SyncWrites = &t
	}
	setDuration(&b.GCInterval, DefaultGCInterval)
	if b.MinFreeBytes == 0 {
		b.MinFreeBytes = DefaultBadgerMinFreeBytes
	}
	setString(&b.Preallocate, DefaultBadgerPreallocate)
}

func (r *Redis) applyDefaults() {
	setString(&r.KeyPrefix, DefaultRedisKeyPrefix)
	setDuration(&r.DialTimeout, DefaultRedisDialTimeout)
	setDuration(&r.OpTimeout, DefaultRedisOpTimeout)
	setDuration(&r.WaitTimeout, DefaultRedisWaitTimeout)
	setString(&r.RecordLayout, DefaultRedisRecordLayout)
	setString(&r.WaitReplicas, DefaultRedisWaitReplicas)
}

func (pg *Postgres) applyDefaults() {
	if pg.MaxConns == 0 {
		pg.MaxConns = DefaultPostgresMaxConns
	}
	setDuration(&pg.ConnectTimeout, DefaultPostgresConnectTimeout)
	setDuration(&pg.StatementTimeout, DefaultPostgresStatementTimeout)
	setString(&pg.Schema, DefaultPostgresSchema)
	setString(&pg.Table, DefaultPostgresTable)
}

func setString(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

func setDuration(d *Duration, def time.Duration) {
	if *d == 0 {
		*d = Duration(def)
	}
}

// DefaultReleaseStatuses are the client errors that mean "refused before
// any work": the upstream did nothing, so the key is released and the
// corrected request (or a plain retry) goes through. Keeping them would
// make a validation error (or a squatter's invalid body) the key's answer
// for its whole TTL. They are a route's release set unless it sets
// release_statuses; the proxy's classify says what an answer does to a key.
var DefaultReleaseStatuses = []int{
	http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
	http.StatusMethodNotAllowed, http.StatusConflict, http.StatusRequestEntityTooLarge,
	http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity, http.StatusTooManyRequests,
}
