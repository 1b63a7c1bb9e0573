package config

import (
	"net/http"
	"time"
)

// Defaults, in one place.
const (
	defaultTTL                      = 24 * time.Hour
	defaultUpstreamTimeout          = 30 * time.Second
	defaultLeaseMargin              = 5 * time.Second
	defaultWaitTimeout              = 5 * time.Second
	defaultMaxBodyBytes             = 1 << 20
	defaultMaxStoredBodyBytes       = 1 << 20
	defaultBadgerDir                = "./data"
	defaultGCInterval               = 5 * time.Minute
	defaultBadgerMinFreeBytes       = 64 << 20
	defaultBadgerPreallocate        = preallocateAuto
	DefaultRedisKeyPrefix           = "idemproxy:"
	defaultRedisDialTimeout         = time.Second
	defaultRedisOpTimeout           = 500 * time.Millisecond
	defaultRedisRecordLayout        = recordLayoutPacked
	defaultRedisWaitReplicas        = redisWaitAuto          // wait for one replica whenever the master reports one: a promotion loses no acknowledged write
	defaultRedisWaitTimeout         = 500 * time.Millisecond // a replica nearby acks in ~1ms: 500ms means down or far behind; 503 within op_timeout + wait_timeout (1s), well inside the 5s lease margin
	defaultEpochCheckInterval       = 2 * time.Second
	defaultCanaryInterval           = time.Second
	DefaultWitnessWindow            = 5 * time.Minute
	DefaultWitnessMaxKeys           = 1 << 16
	defaultPostgresMaxConns         = 16
	defaultPostgresConnectTimeout   = time.Second
	defaultPostgresStatementTimeout = 500 * time.Millisecond
	defaultPostgresSchema           = "public"
	defaultPostgresTable            = "idemproxy_keys"
	DefaultAdminTokenEnv            = "IDEMPROXY_ADMIN_TOKEN"
	defaultAdminMaxConnections      = 64
	defaultReadHeaderTimeout        = 10 * time.Second
	defaultReadTimeout              = 60 * time.Second
	defaultIdleTimeout              = 120 * time.Second
	defaultPassthroughTimeout       = 60 * time.Second
	defaultShutdownTimeout          = 30 * time.Second
	defaultMaxBufferedBytes         = 64 << 20
	defaultMaxConnections           = 1024
	defaultBodyTimeout              = 10 * time.Second
	defaultReconcileGrace           = 5 * time.Minute
	defaultReconcileInterval        = time.Minute
	// defaultReconcileAppliedStatus is reconcile.applied_status's default:
	// the status of a POST that created what it was asked to (201
	// Created), which a client retrying a charge expects.
	defaultReconcileAppliedStatus = http.StatusCreated
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
	// defaultClientShare: one client holds at most max_buffered_bytes /
	// defaultClientShare, unless max_buffered_bytes_per_client says
	// otherwise.
	defaultClientShare = 8
	// defaultClientRequestShare: one client has at most max_connections /
	// defaultClientRequestShare requests in flight, unless
	// max_requests_per_client says otherwise.
	defaultClientRequestShare = 4
	// defaultMaxClientResetsPerSecond is the rate of HTTP/2 stream resets
	// a client may keep up (and ten seconds of it at once) before its
	// connections are closed and refused.
	defaultMaxClientResetsPerSecond = 100
	// defaultMaxResetsPerSecond is the rate of HTTP/2 stream resets all
	// clients together may keep up (one second of it at once) before the
	// connections that reset more than they are served are shed.
	defaultMaxResetsPerSecond = 1000
)

// applyDefaults fills every unset field. It is the only place defaults are
// applied.
func (c *Config) applyDefaults() {
	if c.Admin.TokenEnv == "" {
		c.Admin.TokenEnv = DefaultAdminTokenEnv
	}
	if c.Admin.MaxConnections == 0 {
		c.Admin.MaxConnections = defaultAdminMaxConnections
	}
	c.Store.applyDefaults()
	s := &c.Server
	setDuration(&s.ReadHeaderTimeout, defaultReadHeaderTimeout)
	setDuration(&s.ReadTimeout, defaultReadTimeout)
	setDuration(&s.IdleTimeout, defaultIdleTimeout)
	setDuration(&s.PassthroughTimeout, defaultPassthroughTimeout)
	setDuration(&s.ShutdownTimeout, defaultShutdownTimeout)
	if s.MaxBufferedBytes == 0 {
		s.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	if s.MaxBufferedBytesPerClient == 0 && s.MaxBufferedBytes > 0 {
		s.MaxBufferedBytesPerClient = s.MaxBufferedBytes / defaultClientShare
	}
	setDuration(&s.BodyTimeout, defaultBodyTimeout)
	if s.MaxConnections == 0 {
		s.MaxConnections = defaultMaxConnections
	}
	if s.MaxRequestsPerClient == 0 && s.MaxConnections > 0 {
		s.MaxRequestsPerClient = max(s.MaxConnections/defaultClientRequestShare, 1)
	}
	if s.MaxClientResetsPerSecond == 0 {
		s.MaxClientResetsPerSecond = defaultMaxClientResetsPerSecond
	}
	if s.MaxResetsPerSecond == 0 {
		s.MaxResetsPerSecond = defaultMaxResetsPerSecond
	}
	if c.Metrics.RouteHistograms == 0 {
		c.Metrics.RouteHistograms = DefaultRouteHistograms
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		setString(&r.Keyspace, r.Name)
		setString(&r.Policy, PolicyReserveThenCommit)
		setString(&r.Duplicate, duplicateReplay)
		setString(&r.Concurrent, concurrentReject)
		setString(&r.OnMissingKey, missingKeyReject)
		setString(&r.OnStoreError, storeErrorReject)
		setString(&r.Mode, modeEnforce)
		setString(&r.Key.Normalize, NormalizeNone)
		setDuration(&r.WaitTimeout, defaultWaitTimeout)
		setDuration(&r.TTL, defaultTTL)
		setDuration(&r.UpstreamTimeout, defaultUpstreamTimeout)
		setDuration(&r.Lease, r.UpstreamTimeout.D()+defaultLeaseMargin)
		if r.MaxBodyBytes == 0 {
			r.MaxBodyBytes = defaultMaxBodyBytes
		}
		if r.MaxStoredBodyBytes == 0 {
			r.MaxStoredBodyBytes = defaultMaxStoredBodyBytes
		}
		if r.ReplayHeaders == nil {
			r.ReplayHeaders = append([]string(nil), defaultReplayHeaders...)
		}
		for j, h := range r.ReplayHeaders {
			r.ReplayHeaders[j] = http.CanonicalHeaderKey(h)
		}
		if rc := r.Reconcile; rc != nil {
			// The first lookup waits well past the window in which the
			// original request may still be processed upstream.
			setDuration(&rc.Grace, max(defaultReconcileGrace, 2*r.Lease.D()))
			setDuration(&rc.Interval, defaultReconcileInterval)
			if rc.AppliedStatus == 0 {
				rc.AppliedStatus = defaultReconcileAppliedStatus
			}
		}
	}
}

// defaultStore is the kind of store used when the configuration sets none:
// Badger, in defaultBadgerDir.
const defaultStore = StoreBadger

// applyDefaults selects defaultStore when no kind of store is set, and
// fills the unset fields of the selected section (of every section set:
// Validate refuses more than one).
func (s *Store) applyDefaults() {
	if s.Kind() == "" {
		for _, k := range storeKinds {
			if k.name == defaultStore {
				k.add(s)
			}
		}
	}
	setDuration(&s.EpochCheckInterval, defaultEpochCheckInterval)
	setDuration(&s.CanaryInterval, defaultCanaryInterval)
	setDuration(&s.WitnessWindow, DefaultWitnessWindow)
	if s.WitnessMaxKeys == 0 {
		s.WitnessMaxKeys = DefaultWitnessMaxKeys
	}
	for _, k := range s.kindsSet() {
		k.section(s).applyDefaults()
	}
}

func (b *Badger) applyDefaults() {
	setString(&b.Dir, defaultBadgerDir)
	if b.SyncWrites == nil {
		t := true
		b.SyncWrites = &t
	}
	setDuration(&b.GCInterval, defaultGCInterval)
	if b.MinFreeBytes == 0 {
		b.MinFreeBytes = defaultBadgerMinFreeBytes
	}
	setString(&b.Preallocate, defaultBadgerPreallocate)
}

func (r *Redis) applyDefaults() {
	setString(&r.KeyPrefix, DefaultRedisKeyPrefix)
	setDuration(&r.DialTimeout, defaultRedisDialTimeout)
	setDuration(&r.OpTimeout, defaultRedisOpTimeout)
	setDuration(&r.WaitTimeout, defaultRedisWaitTimeout)
	setString(&r.RecordLayout, defaultRedisRecordLayout)
	setString(&r.WaitReplicas, defaultRedisWaitReplicas)
}

func (pg *Postgres) applyDefaults() {
	if pg.MaxConns == 0 {
		pg.MaxConns = defaultPostgresMaxConns
	}
	setDuration(&pg.ConnectTimeout, defaultPostgresConnectTimeout)
	setDuration(&pg.StatementTimeout, defaultPostgresStatementTimeout)
	setString(&pg.Schema, defaultPostgresSchema)
	setString(&pg.Table, defaultPostgresTable)
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
