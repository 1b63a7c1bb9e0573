package app

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestStoreAttrs: the first log line says where the store is, never a
// credential of the PostgreSQL DSN or of Redis.
func TestStoreAttrs(t *testing.T) {
	tests := []struct {
		name  string
		store config.Store
		env   map[string]string
		want  []any
	}{
		{"badger", config.Store{Badger: &config.Badger{Dir: "/var/lib/idemproxy", Preallocate: "off"}}, nil,
			[]any{"store", "badger", "badger_dir", "/var/lib/idemproxy", "badger_preallocate", "off"}},
		{"redis", config.Store{Redis: &config.Redis{Addrs: []string{"10.0.0.1:6379"}}}, nil,
			[]any{"store", "redis", "redis_addrs", "10.0.0.1:6379"}},
		{"redis sentinels", config.Store{Redis: &config.Redis{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "main"}}, nil,
			[]any{"store", "redis", "redis_addrs", "s1:26379,s2:26379", "redis_master_name", "main"}},
		{"redis sentinels waiting, hash layout", config.Store{Redis: &config.Redis{Addrs: []string{"s1:26379"}, MasterName: "main", RecordLayout: "hash", WaitReplicas: "1"}}, nil,
			[]any{"store", "redis", "redis_addrs", "s1:26379", "redis_master_name", "main", "redis_record_layout", "hash", "redis_wait_replicas", "1"}},
		{"redis cluster", config.Store{Redis: &config.Redis{Addrs: []string{"c1:6379", "c2:6379"}}}, nil,
			[]any{"store", "redis", "redis_addrs", "c1:6379,c2:6379", "redis_cluster", true}},
		{"postgres URL", config.Store{Postgres: &config.Postgres{DSNEnv: "DSN", Schema: "public", Table: "idemproxy_keys"}},
			map[string]string{"DSN": "postgres://app:hunter2@db.internal:6432/orders?sslmode=disable"},
			[]any{"store", "postgres", "postgres", "db.internal:6432/orders", "postgres_table", "public.idemproxy_keys"}},
		{"postgres keywords", config.Store{Postgres: &config.Postgres{DSNEnv: "DSN", Schema: "s", Table: "t"}},
			map[string]string{"DSN": "host=db.internal user=app password=hunter2 dbname=orders"},
			[]any{"store", "postgres", "postgres", "db.internal:5432/orders", "postgres_table", "s.t"}},
		{"postgres unset", config.Store{Postgres: &config.Postgres{DSNEnv: "DSN", Schema: "s", Table: "t"}}, nil,
			[]any{"store", "postgres", "postgres", "(empty DSN)", "postgres_table", "s.t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := storeAttrs(tt.store, func(k string) string { return tt.env[k] })
			if s := fmtAny(got); strings.Contains(s, "hunter2") || strings.Contains(s, "app") {
				t.Errorf("storeAttrs = %v shows a credential", got)
			}
			if fmtAny(got) != fmtAny(tt.want) {
				t.Errorf("storeAttrs = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStartAttrsUpstreamCredential: an upstream URL may carry a user and
// password (validation takes it); the first log line must not show them.
func TestStartAttrsUpstreamCredential(t *testing.T) {
	a := &app{path: "idemproxy.yaml", getenv: func(string) string { return "" }, cfg: &config.Config{
		Upstream: "http://svc:hunter2@10.0.0.7:9000/base",
		Store:    config.Store{Badger: &config.Badger{Dir: "/d"}},
	}}
	s := fmt.Sprint(a.startAttrs()...)
	if strings.Contains(s, "hunter2") {
		t.Errorf("startAttrs = %s shows the upstream's password", s)
	}
	if !strings.Contains(s, "10.0.0.7:9000/base") {
		t.Errorf("startAttrs = %s, want the upstream's host and path", s)
	}
}

// TestStartLineWithManyRoutes: the first log line of a configuration of
// 10,000 routes lists the first 20 names and counts the others, so that it
// stays one short line (a line of hundreds of kilobytes is split or
// dropped by log pipelines); with a few routes it lists them all.
func TestStartLineWithManyRoutes(t *testing.T) {
	for _, tc := range []struct {
		routes, listed, notListed int
	}{{2, 2, 0}, {20, 20, 0}, {21, 20, 1}, {10000, 20, 9980}} {
		cfg := &config.Config{Upstream: "http://10.0.0.7:9000", Store: config.Store{Badger: &config.Badger{Dir: "/d"}}}
		for i := range tc.routes {
			cfg.Routes = append(cfg.Routes, config.Route{Name: fmt.Sprintf("tenant-%05d-charges", i)})
		}
		a := &app{path: "idemproxy.yaml", getenv: func(string) string { return "" }, cfg: cfg}
		var buf strings.Builder
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("idemproxy starting", a.startAttrs()...)
		var m struct {
			Routes          []string `json:"routes"`
			RoutesNotListed int      `json:"routes_not_listed"`
		}
		if err := json.Unmarshal([]byte(buf.String()), &m); err != nil {
			t.Fatalf("%d routes: %v", tc.routes, err)
		}
		if len(m.Routes) != tc.listed || m.RoutesNotListed != tc.notListed || m.Routes[0] != "tenant-00000-charges" {
			t.Errorf("%d routes: the line lists %d (first %q) and counts %d not listed, want %d and %d",
				tc.routes, len(m.Routes), m.Routes[0], m.RoutesNotListed, tc.listed, tc.notListed)
		}
		if len(buf.String()) > 4096 {
			t.Errorf("%d routes: first line is %d bytes, want at most 4 KiB", tc.routes, buf.Len())
		}
	}
}

func fmtAny(v []any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
