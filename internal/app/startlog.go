package app

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app/buildinfo"
)

// startAttrs are the attributes of the first log line: the version, then
// the store and where it is, then the routes, so that the first line of a
// log says what runs against what.
func (a *app) startAttrs() []any {
	b := buildinfo.Read()
	attrs := []any{"version", b.Version}
	if b.Commit != "" {
		attrs = append(attrs, "commit", b.Commit)
	}
	attrs = append(attrs, "config", a.path)
	attrs = append(attrs, storeAttrs(a.cfg.Store, a.getenv)...)
	n := min(len(a.cfg.Routes), startLogRoutes)
	routes := make([]string, n)
	for i, r := range a.cfg.Routes[:n] {
		routes[i] = r.Name
	}
	attrs = append(attrs, "routes", routes)
	if more := len(a.cfg.Routes) - n; more > 0 {
		attrs = append(attrs, "routes_not_listed", more)
	}
	attrs = append(attrs, "listen", a.cfg.Listen, "admin_listen", a.cfg.Admin.Listen, "upstream", redactURL(a.cfg.Upstream))
	attrs = append(attrs, a.overrides.Sources()...)
	return append(attrs, "tracing", a.cfg.Tracing.Enabled)
}

// startLogRoutes is how many route names the first log line lists; the
// others are counted (routes_not_listed), so that a configuration of
// 10,000 routes does not make a line of hundreds of kilobytes, which log
// pipelines split or drop (Docker at 16 KiB, many shippers at 64 KiB).
const startLogRoutes = 20

// storeAttrs names the configured store and where it is (its backend's
// startAttrs): Badger's data directory, the Redis addresses, or the
// PostgreSQL host and database of the DSN, never its credentials.
func storeAttrs(s config.Store, getenv func(string) string) []any {
	b, ok := backendOf(s.Kind())
	if !ok {
		return []any{"store", "none"}
	}
	return append([]any{"store", b.kind}, b.startAttrs(s, getenv)...)
}

// badgerAttrs: the data directory, and whether its files are preallocated.
func badgerAttrs(s config.Store, _ func(string) string) []any {
	return []any{"badger_dir", s.Badger.Dir, "badger_preallocate", s.Badger.Preallocate}
}

// redisAttrs: the addresses, the Sentinel master or the Cluster they lead
// to, the record layout and the replicas a write waits for.
func redisAttrs(s config.Store, _ func(string) string) []any {
	attrs := []any{"redis_addrs", strings.Join(s.Redis.Addrs, ",")}
	switch {
	case s.Redis.MasterName != "":
		attrs = append(attrs, "redis_master_name", s.Redis.MasterName)
	case s.Redis.Cluster || len(s.Redis.Addrs) > 1:
		attrs = append(attrs, "redis_cluster", true)
	}
	// The layout it writes, which a rolling upgrade or a rollback turns on
	// (docs/redis.md), and the replicas a write waits for.
	if s.Redis.RecordLayout != "" {
		attrs = append(attrs, "redis_record_layout", s.Redis.RecordLayout)
	}
	if w := s.Redis.WaitReplicas; w != "" && w != "0" {
		attrs = append(attrs, "redis_wait_replicas", s.Redis.WaitReplicas)
	}
	return attrs
}

// postgresAttrs: the host, port and database of the DSN, and the table.
func postgresAttrs(s config.Store, getenv func(string) string) []any {
	return []any{"postgres", postgresWhere(getenv(s.Postgres.DSNEnv)),
		"postgres_table", s.Postgres.Schema + "." + s.Postgres.Table}
}

// postgresWhere returns the host, port and database a DSN names
// ("db.internal:5432/orders"), without its user or password; an empty or
// unreadable DSN says so instead (opening the store reports the error).
func postgresWhere(dsn string) string {
	if dsn == "" {
		return "(empty DSN)"
	}
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(unreadable DSN)"
	}
	return fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
}

// redactURL is u for a log line: a password it carries (upstream
// "http://user:secret@host") shows as "xxxxx".
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	return p.Redacted()
}
