package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/store"
)

// Defaults for zero Options fields.
const (
	defaultMaxConns         = 16
	DefaultConnectTimeout   = time.Second
	DefaultStatementTimeout = 500 * time.Millisecond
	defaultSchema           = "public"
	DefaultTable            = "idemproxy_keys"
	defaultSweepInterval    = 5 * time.Second
	defaultSweepBatch       = 1000
)

// replyGrace is how much longer than statement_timeout the store waits for
// a statement's reply: the server's own timeout fires first and rolls the
// statement back, so a call that gave up has, but for a network stall
// longer than this, changed nothing.
const replyGrace = 250 * time.Millisecond

// Options configures a Store.
type Options struct {
	// DSN is the libpq or URL connection string (pgx's syntax: host, port,
	// user, password, dbname, sslmode, ...).
	DSN string
	// MaxConns is the size of the connection pool; zero means
	// defaultMaxConns (16). A call that finds every connection busy waits
	// at most ConnectTimeout for one, then fails.
	MaxConns int
	// ConnectTimeout bounds getting a connection, from the pool or a new
	// one, for each host the DSN lists (a new connection tries them in
	// turn, each for up to ConnectTimeout, as libpq does); zero means
	// DefaultConnectTimeout (1s).
	ConnectTimeout time.Duration
	// StatementTimeout is set as statement_timeout on every connection and
	// bounds every statement the store runs; zero means
	// DefaultStatementTimeout (500ms).
	StatementTimeout time.Duration
	// Schema and Table name the table of key records; empty means
	// defaultSchema ("public") and DefaultTable ("idemproxy_keys"). The
	// schema version lives in Table + "_schema" next to it.
	Schema, Table string
	// SynchronousCommit, when not empty, is set as synchronous_commit on
	// every connection: on, remote_apply, remote_write, local or off (see
	// the package documentation for what each promises).
	SynchronousCommit string
	// SweepInterval is how often expired records are deleted; zero means
	// defaultSweepInterval (5s), negative turns the sweeper off (another
	// process sweeps). Expired records count as absent whether or not they
	// were swept.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one DELETE removes at most;
	// zero means defaultSweepBatch (1000).
	SweepBatch int
	// Logger receives the sweeper's errors; nil discards them.
	Logger *slog.Logger
	// EpochSeen, when set, is called with the epoch marker (epoch.go) read
	// on every new connection, before the pool hands it out; an error
	// fails the connection, so that nothing is reserved on a table that
	// lost its keys. A failed read (the table not created yet) calls
	// nothing. Nil: nothing is called.
	EpochSeen func(m *store.Epoch, read bool) error
}

// Store is a store.Store and store.ReconcileStore kept in one PostgreSQL
// table. It is safe for concurrent use, also by several processes sharing
// one database.
type Store struct {
	pool             *pgxpool.Pool
	sql              queries
	connectTimeout   time.Duration // ConnectTimeout per host of the DSN
	statementTimeout time.Duration
	table            string // schema-qualified and quoted, for messages
	log              *slog.Logger
	instance         string // tags this Store's DueLookups listings
	clock            dbClock
	batch            batcher
	// bytewise is whether the key column sorts byte by byte (list.go):
	// 0 not read yet, 1 yes, 2 no.
	bytewise atomic.Int32

	sweepBatch int
	swept      atomic.Int64
	sweepFails atomic.Int64
	stop       chan struct{}
	stopped    sync.WaitGroup
	closeOnce  sync.Once

	// expect is the epoch ID reservations check (ExpectEpoch); nil or
	// "": none.
	expect    atomic.Pointer[string]
	epochSeen func(m *store.Epoch, read bool) error
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.ReconcileStore = (*Store)(nil)
)

// New connects to the database, creates the schema, table and indexes when
// they are missing (see the package documentation for the privileges this
// needs), checks that their version is one this binary knows and that the
// database takes writes, and starts the sweeper of expired records. It
// fails when the database cannot be reached within ctx, is a read-only
// standby, or refuses writes to the table.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.DSN == "" {
		return nil, errors.New("postgres store: empty dsn")
	}
	if opts.MaxConns < 0 || opts.ConnectTimeout < 0 || opts.StatementTimeout < 0 || opts.SweepBatch < 0 {
		return nil, errors.New("postgres store: negative pool size, timeout or sweep batch")
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = defaultMaxConns
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.StatementTimeout == 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.Schema == "" {
		opts.Schema = defaultSchema
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = defaultSweepInterval
	}
	if opts.SweepBatch == 0 {
		opts.SweepBatch = defaultSweepBatch
	}
	switch opts.SynchronousCommit {
	case "", "on", "remote_apply", "remote_write", "local", "off":
	default:
		return nil, fmt.Errorf("postgres store: synchronous_commit %q: want on, remote_apply, remote_write, local or off", opts.SynchronousCommit)
	}
	cfg, err := poolConfig(opts)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	s := &Store{
		pool:             pool,
		sql:              newQueries(opts.Schema, opts.Table),
		connectTimeout:   opts.ConnectTimeout * time.Duration(hosts(cfg)),
		statementTimeout: opts.StatementTimeout,
		table:            pgx.Identifier{opts.Schema, opts.Table}.Sanitize(),
		log:              opts.Logger,
		instance:         randomToken(),
		sweepBatch:       opts.SweepBatch,
		stop:             make(chan struct{}),
		epochSeen:        opts.EpochSeen,
	}
	s.batch.s = s
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := s.setUp(ctx, opts.Schema, opts.Table); err != nil {
		pool.Close()
		return nil, err
	}
	if opts.SweepInterval > 0 {
		s.stopped.Add(1)
		go s.sweepLoop(opts.SweepInterval)
	}
	return s, nil
}

// poolConfig maps opts (with defaults filled in) to the pool's
// configuration.
func poolConfig(opts Options) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		// pgx's message may quote the DSN, password included.
		return nil, errors.New("postgres store: the dsn cannot be parsed (see pgx's connection string syntax)")
	}
	cfg.MaxConns = int32(min(opts.MaxConns, 1<<20))
	cfg.PingTimeout = opts.ConnectTimeout
	cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	params := cfg.ConnConfig.RuntimeParams
	params["statement_timeout"] = strconv.FormatInt(max(opts.StatementTimeout.Milliseconds(), 1), 10)
	// The statements are written for read committed, where a statement
	// that meets a row changed by a concurrent transaction re-reads it.
	// Under a stricter default of the database or role it would fail
	// instead (SQLSTATE 40001): a duplicate of a request in flight would
	// get an error, not the record.
	params["default_transaction_isolation"] = "read committed"
	if opts.SynchronousCommit != "" {
		params["synchronous_commit"] = opts.SynchronousCommit
	}
	if params["application_name"] == "" {
		params["application_name"] = "idemproxy"
	}
	// A call that gives up asks the server to cancel its statement, rather
	// than only dropping the connection: a statement cancelled is rolled
	// back, one whose client vanished may still commit. It waits a little
	// for the server's answer to the cancel, then drops the connection.
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: replyGrace}
	}
	cfg.ConnConfig.OnNotice = noteUnreplicated
	if opts.EpochSeen != nil {
		table := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			m, err := readEpochOn(ctx, c, table)
			if err != nil {
				return nil // the watcher's checks tell
			}
			return opts.EpochSeen(m, true)
		}
	}
	return cfg, nil
}

// unreplicatedKey marks, in a connection's custom data, that its statement
// drew the warning of a commit the synchronous standby did not confirm.
const unreplicatedKey = "idemproxy.unreplicated"

// noteUnreplicated is the connections' notice handler. When a commit waits
// for a synchronous standby and the wait is cancelled (by
// statement_timeout, or the cancel request of a call that gave up),
// PostgreSQL answers success with a WARNING (SQLSTATE 01000, "canceling
// wait for synchronous replication"): the write is on the primary only,
// and a failover loses it. It is the one WARNING the store's statements
// draw; its text is translated (lc_messages), its severity and code are
// not.
func noteUnreplicated(c *pgconn.PgConn, n *pgconn.Notice) {
	sev := n.SeverityUnlocalized
	if sev == "" {
		sev = n.Severity
	}
	if sev == "WARNING" && n.Code == "01000" {
		c.CustomData()[unreplicatedKey] = n.Message
	}
}

// hosts returns how many addresses a new connection of cfg may try in
// turn (the DSN's host list), each for up to ConnectTimeout: a frozen first
// host (the old primary after a failover) costs its timeout before the next
// one is tried. Fallbacks to one address (sslmode=prefer's TLS then plain
// attempt) share its timeout.
func hosts(cfg *pgxpool.Config) int {
	seen := map[string]bool{}
	add := func(host string, port uint16) { seen[host+":"+strconv.Itoa(int(port))] = true }
	add(cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	for _, f := range cfg.ConnConfig.Fallbacks {
		add(f.Host, f.Port)
	}
	return len(seen)
}

// Close stops the sweeper and closes the connections.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.stopped.Wait()
		s.pool.Close()
	})
	return nil
}

// conn gets a connection within ConnectTimeout per host of the DSN (and
// ctx).
func (s *Store) conn(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	c, err := s.pool.Acquire(actx)
	if err != nil {
		if ctx.Err() == nil && actx.Err() != nil {
			return nil, fmt.Errorf("no connection within %v (pool of %d busy, or the database unreachable): %w",
				s.connectTimeout, s.pool.Config().MaxConns, err)
		}
		return nil, err
	}
	return c, nil
}

// errUnreplicated is the error of a statement whose commit the
// synchronous standby did not confirm (see noteUnreplicated).
var errUnreplicated = errors.New("the write was not confirmed by the synchronous standby (it may be on the primary only, which a failover loses)")

// run runs f on a connection: getting it is bounded by ConnectTimeout, f
// by StatementTimeout plus a grace for the reply. A write whose commit the
// synchronous standby did not confirm is an error (errUnreplicated). A failure that pgx knows
// happened before anything was sent (a dead pooled connection), or the
// server's ending of the session (see terminated), is retried once on
// another connection.
func (s *Store) run(ctx context.Context, f func(ctx context.Context, c *pgxpool.Conn) error) error {
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var c *pgxpool.Conn
		c, err = s.conn(ctx)
		if err != nil {
			return err
		}
		qctx, cancel := context.WithTimeout(ctx, s.statementTimeout+replyGrace)
		data := c.Conn().PgConn().CustomData()
		delete(data, unreplicatedKey)
		err = f(qctx, c)
		if err == nil && qctx.Err() != nil {
			// The reply came after the call gave up and asked the server to
			// cancel. A commit whose wait for a synchronous standby is
			// cancelled stays committed on the primary alone (PostgreSQL's
			// WARNING "canceling wait for synchronous replication") and is
			// answered as a success: it was not acknowledged as asked.
			err = fmt.Errorf("the reply came after the deadline, the write may be on the primary only: %w", qctx.Err())
		}
		cancel()
		if msg, ok := data[unreplicatedKey]; ok && err == nil {
			// Acknowledged, a reservation lost in a failover would let
			// the retry through: the caller must not count on the write.
			err = fmt.Errorf("%w: %v", errUnreplicated, msg)
			delete(data, unreplicatedKey)
		}
		c.Release()
		if err == nil || !(pgconn.SafeToRetry(err) || terminated(err)) || ctx.Err() != nil {
			break
		}
	}
	return err
}

// terminated reports whether err is the server ending the session
// (SQLSTATE class 57P: pg_terminate_backend, a shutdown, an
// idle_session_timeout). A pooled connection whose session was ended
// while idle meets it on its next use, its statement never run. A
// statement that was running is rolled back, or, if it had just committed,
// is found done by the retry: every store operation is idempotent for its
// caller (Reserve finds its own token, Commit keeps its answer), except that
// a repeated Release or ResolveLookup reports ErrNotOwner, which its callers
// take as the record being settled.
func terminated(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := pgErr.SeverityUnlocalized // Severity is translated (lc_messages)
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev == "FATAL" && strings.HasPrefix(pgErr.Code, "57P")
}

// Reserve implements store.Store. The reservation is one INSERT ... ON
// CONFLICT DO UPDATE that takes the key when no live record holds it (an
// expired row is overwritten). When a live record holds it, the record is
// read by a second statement; should it have expired or been released in
// between, the reservation is tried again. Reservations made while other
// writes run share a batch (batch.go), whose one statement also reads the
// records of the keys it did not take.
func (s *Store) Reserve(ctx context.Context, key string, res store.Reservation) (*store.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if res.Token == "" {
		return nil, errors.New("postgres store: reserve: empty token")
	}
	if res.Lease <= 0 || res.TTL <= 0 {
		return nil, fmt.Errorf("postgres store: reserve: lease %v and ttl %v must be positive", res.Lease, res.TTL)
	}
	if err := store.CheckOrigin(res.Origin); err != nil {
		return nil, fmt.Errorf("postgres store: reserve: %w", err)
	}
	expect := s.expectedEpoch()
	if batchable(res.Token, res.Fingerprint, res.Origin) {
		o := &op{kind: opReserve, ctx: ctx, key: key, token: res.Token, fingerprint: res.Fingerprint,
			lease: micros(res.Lease), ttl: micros(res.TTL), epoch: expect, origin: res.Origin}
		if r, alone := s.batch.enter(o); alone {
			defer s.batch.leave(r)
		} else {
			if err := o.wait(ctx); err != nil {
				return nil, fmt.Errorf("postgres store: reserve: %w", err)
			}
			switch {
			case o.err != nil:
				return nil, fmt.Errorf("postgres store: reserve: %w", o.err)
			case o.reserved:
				return nil, nil
			case o.rec != nil && o.rec.State == store.StateInFlight && o.rec.Token == res.Token:
				return nil, nil // the caller's own (a batch tried again after a lost session)
			case o.rec != nil:
				return o.rec, nil
			}
			// o.alone: as below.
		}
	}
	return s.reserveAlone(ctx, key, res, expect)
}

// reserveAlone is Reserve with the single statements.
func (s *Store) reserveAlone(ctx context.Context, key string, res store.Reservation, expect string) (*store.Record, error) {
	for range 3 {
		var rec *store.Record
		var sampled time.Time
		var lostEpoch *store.Epoch
		reserved, lost := false, false
		err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
			deadline, at, err := s.deadline(ctx, c)
			if err != nil {
				return err
			}
			sampled = at
			sql, args := s.sql.reserve, []any{key, res.Token, res.Fingerprint, micros(res.Lease), micros(res.TTL), deadline, res.Origin}
			if expect != "" {
				sql, args = s.sql.reserveEpoch, append(args, expect)
			}
			tag, err := c.Exec(ctx, sql, args...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 1 {
				reserved = true
				return nil
			}
			rec, err = s.get(ctx, c, key)
			if err != nil || rec != nil || expect == "" {
				return err
			}
			// Not taken, and no record: was it the marker?
			lostEpoch, err = s.readEpoch(ctx, c)
			lost = err == nil && (lostEpoch == nil || lostEpoch.ID != expect)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("postgres store: reserve: %w", err)
		}
		if lost {
			if s.epochSeen != nil {
				s.epochSeen(lostEpoch, true)
			}
			return nil, fmt.Errorf("postgres store: reserve: %w: the epoch marker changed under a reservation", store.ErrKeysLost)
		}
		if reserved {
			return nil, nil
		}
		if rec == nil {
			// Gone since the INSERT saw it, or the INSERT found the
			// deadline past: with the caller still waiting, a clock was
			// stepped since the offset was measured. Try again, measuring
			// it anew.
			if ctx.Err() == nil {
				s.clock.distrust(sampled)
			}
			continue
		}
		if rec.State == store.StateInFlight && rec.Token == res.Token {
			return nil, nil // the caller's own (a retry after a lost reply)
		}
		return rec, nil
	}
	return nil, errors.New("postgres store: reserve: the key's record kept changing; try again")
}

// Commit implements store.Store. The record may also be in doubt (its lease
// ran out, or it was marked so) as long as it carries token: the answer is
// known now, and storing it beats keeping the doubt. Committing twice keeps
// the first answer and its expiry.
func (s *Store) Commit(ctx context.Context, key, token string, resp store.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("postgres store: commit: ttl %v must be positive", ttl)
	}
	meta, err := encodeMeta(resp)
	if err != nil {
		return fmt.Errorf("postgres store: commit: encode response: %w", err)
	}
	o := &op{kind: opCommit, meta: meta, body: body(resp), ttl: micros(ttl)}
	if !batchable(meta) || strings.Contains(meta, `\u0000`) {
		o = nil // jsonb refuses a NUL character: this one fails alone
	}
	return s.fenced(ctx, "commit", o, s.sql.commit, key, token, meta, body(resp), micros(ttl))
}

// Release implements store.Store: the record is deleted, whatever its
// state, when it carries token.
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.fenced(ctx, "release", &op{kind: opRelease}, s.sql.release, key, token)
}

// MarkInDoubt implements store.Store. A record that is already completed
// stays completed: a known answer is never turned into a doubt.
func (s *Store) MarkInDoubt(ctx context.Context, key, token string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("postgres store: mark in doubt: ttl %v must be positive", ttl)
	}
	return s.fenced(ctx, "mark in doubt", &op{kind: opMarkInDoubt, ttl: micros(ttl)}, s.sql.markInDoubt, key, token, micros(ttl))
}

// fenced runs one of the token-checked statements, whose parameters are
// key, token, args; it changed one row or the record does not carry token.
// The write b, when not nil, is the same one for a batch (batch.go), its
// key and token not filled in yet.
func (s *Store) fenced(ctx context.Context, op string, b *op, sql, key, token string, args ...any) error {
	if err := checkKey(key); err != nil {
		if errors.Is(err, errUnstorable) {
			return store.ErrNotOwner
		}
		return err
	}
	if token == "" {
		return fmt.Errorf("postgres store: %s: empty token", op)
	}
	if b != nil && batchable(token) {
		b.ctx, b.key, b.token = ctx, key, token
		if r, alone := s.batch.enter(b); alone {
			defer s.batch.leave(r)
		} else {
			if err := b.wait(ctx); err != nil {
				return fmt.Errorf("postgres store: %s: %w", op, err)
			}
			switch {
			case b.err != nil:
				return fmt.Errorf("postgres store: %s: %w", op, b.err)
			case b.alone:
			case b.changed:
				return nil
			default:
				return store.ErrNotOwner
			}
		}
	}
	var n int64
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		tag, err := c.Exec(ctx, sql, append([]any{key, token}, args...)...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres store: %s: %w", op, err)
	}
	if n != 1 {
		return store.ErrNotOwner
	}
	return nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := checkKey(key); err != nil {
		if errors.Is(err, errUnstorable) {
			return nil, nil
		}
		return nil, err
	}
	var rec *store.Record
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) (err error) {
		rec, err = s.get(ctx, c, key)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres store: get: %w", err)
	}
	return rec, nil
}

// get reads the live record under key on c; nil when there is none.
func (s *Store) get(ctx context.Context, c *pgxpool.Conn, key string) (*store.Record, error) {
	var (
		st, tok, fp    string
		cr, exp        time.Time
		lease          *time.Time
		meta, respBody []byte
		origin         *string
	)
	err := c.QueryRow(ctx, s.sql.get, key).Scan(&st, &tok, &fp, &cr, &lease, &exp, &meta, &respBody, &origin)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(st, tok, fp, cr, lease, exp, meta, respBody, origin)
}

// decodeRecord builds the record of a row as the get statement (and the
// batch statement, for a key it did not reserve) returns it; a NULL
// origin (none, or a row of an earlier release), or one stored with
// another token, is "".
func decodeRecord(st, tok, fp string, cr time.Time, lease *time.Time, exp time.Time, meta, respBody []byte, origin *string) (*store.Record, error) {
	hasMeta, hasBody := meta != nil, respBody != nil
	rec := &store.Record{State: store.State(st), Token: tok, Fingerprint: fp, CreatedAt: cr, ExpiresAt: exp}
	if origin != nil {
		// Kept only with the token it was stored with: the release
		// before origins reserves an expired row again without touching
		// the column, which then holds another reservation's origin.
		if o, ok := strings.CutSuffix(*origin, " "+tok); ok {
			rec.Origin = o
		}
	}
	switch rec.State {
	case store.StateInFlight:
		if lease == nil {
			return nil, errors.New("in-flight record has no lease")
		}
		rec.LeaseExpiresAt = *lease
	case store.StateCompleted:
		if !hasMeta {
			return nil, errors.New("completed record has no response")
		}
		resp, err := decodeMeta(meta)
		if err != nil {
			return nil, fmt.Errorf("decode stored response: %w", err)
		}
		if hasBody {
			resp.Body = respBody
		}
		rec.Response = &resp
	case store.StateInDoubt:
	default:
		return nil, fmt.Errorf("record has unknown state %q", st)
	}
	return rec, nil
}

// Ping implements store.Store: the database answers a query on a pooled
// connection, and is not a read-only standby (which cannot take
// reservations; after a failover the DSN must lead to the new primary).
func (s *Store) Ping(ctx context.Context) error {
	var recovery bool
	err := s.run(ctx, func(ctx context.Context, c *pgxpool.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery)
	})
	if err != nil {
		return fmt.Errorf("postgres store: ping: %w", err)
	}
	if recovery {
		return errors.New("postgres store: ping: the server is a read-only standby (in recovery); reservations need the primary")
	}
	return nil
}

// errUnstorable is checkKey's error for a key no text column can hold.
var errUnstorable = errors.New("postgres store: the key holds a NUL byte or is not valid UTF-8, which text columns cannot hold")

// checkKey returns an error for an empty key, and errUnstorable for one
// that PostgreSQL's text cannot hold (a NUL byte, invalid UTF-8). Keys are
// opaque strings, and the admin API builds them from any bytes of its URL;
// no record can exist under an unstorable key, so the methods that read or
// change a record answer for it as for a key without one (Reserve fails).
func checkKey(key string) error {
	if key == "" {
		return errors.New("postgres store: empty key")
	}
	if strings.IndexByte(key, 0) >= 0 || !utf8.ValidString(key) {
		return errUnstorable
	}
	return nil
}

// micros converts d to whole microseconds, the unit the statements
// multiply interval '1 microsecond' by, rounding up so that a positive
// duration never becomes 0.
func micros(d time.Duration) int64 {
	us := d / time.Microsecond
	if d%time.Microsecond > 0 {
		us++
	}
	return int64(us)
}
