package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/internal/witness"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/badger"
	"github.com/idemproxy/idemproxy/store/redis"
)

// BenchmarkProxiedRequest measures a whole protected request through the
// proxy's handler (body read, key, fingerprint, reserve, forward to a real
// HTTP upstream, capture, commit) with a new key each time, and a replay.
func BenchmarkProxiedRequest(b *testing.B) {
	up := benchUpstream(b)
	for _, sync := range []bool{false, true} {
		st, err := badger.Open(badger.Options{Dir: b.TempDir(), SyncWrites: sync})
		if err != nil {
			b.Fatal(err)
		}
		cfg := proxytest.ParseConfig(&testing.T{}, up.URL, chargesByOrder)
		p, err := proxy.New(cfg, proxy.Options{Store: st})
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		b.Run(fmt.Sprintf("new-key/sync=%v", sync), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					body := fmt.Sprintf(`{"orderId": "B-%d", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`, n.Add(1))
					serve(b, p, body, 201)
				}
			})
		})
		// One request at a time: the latency a single client sees.
		b.Run(fmt.Sprintf("new-key-serial/sync=%v", sync), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				body := fmt.Sprintf(`{"orderId": "S-%d", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`, n.Add(1))
				serve(b, p, body, 201)
			}
		})
		b.Run(fmt.Sprintf("replay/sync=%v", sync), func(b *testing.B) {
			body := `{"orderId": "B-1", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					serve(b, p, body, 201)
				}
			})
		})
		st.Close()
	}
}

// BenchmarkProxiedRequestWitness is BenchmarkProxiedRequest's new-key
// request (Badger without sync, where the proxy's own cost shows most)
// without and with the witness of answered keys (internal/witness, at its
// default size), whose insert on every commit and look-up on every
// reservation must not cost measurable throughput.
func BenchmarkProxiedRequestWitness(b *testing.B) {
	up := benchUpstream(b)
	st, err := badger.Open(badger.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	var n atomic.Int64
	for _, on := range []bool{false, true} {
		opts := proxy.Options{Store: st}
		if on {
			opts.Witness = witness.New(witness.Options{Window: config.DefaultWitnessWindow, MaxKeys: config.DefaultWitnessMaxKeys})
		}
		p, err := proxy.New(proxytest.ParseConfig(&testing.T{}, up.URL, chargesByOrder), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("new-key/witness=%v", on), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					body := fmt.Sprintf(`{"orderId": "W-%d", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`, n.Add(1))
					serve(b, p, body, 201)
				}
			})
		})
	}
}

// BenchmarkProxiedRequestRedis is BenchmarkProxiedRequest's new-key
// request on the Redis store (a real redis-server, AOF everysec as in
// go run ./bench).
func BenchmarkProxiedRequestRedis(b *testing.B) {
	up := benchUpstream(b)
	srv := redistest.Start(b, "--appendonly", "yes", "--appendfsync", "everysec")
	st, err := redis.New(redis.Options{Addrs: []string{srv.Addr()}, KeyPrefix: "bench:", DialTimeout: time.Second, OpTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	p, err := proxy.New(proxytest.ParseConfig(&testing.T{}, up.URL, chargesByOrder), proxy.Options{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.Run("new-key", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				body := fmt.Sprintf(`{"orderId": "R-%d", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`, n.Add(1))
				serve(b, p, body, 201)
			}
		})
	})
	b.Run("new-key-serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			body := fmt.Sprintf(`{"orderId": "RS-%d", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`, n.Add(1))
			serve(b, p, body, 201)
		}
	})
}

// benchUpstream is the benchmarks' upstream: a 201 with a small JSON
// body, closed when the benchmark ends.
func benchUpstream(b *testing.B) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write([]byte(`{"chargeId":"ch_1","orderId":"x","amount":10}`))
	}))
	b.Cleanup(up.Close)
	return up
}

func serve(b *testing.B, h http.Handler, body string, want int) {
	req := httptest.NewRequest("POST", "/charges", strings.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != want {
		b.Fatalf("status %d: %s", w.Code, w.Body)
	}
}
