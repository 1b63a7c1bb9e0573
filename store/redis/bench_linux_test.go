package redis

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// BenchmarkReserveCommit measures the common path of a protected request
// on Redis: a reservation of a new key and the commit of its answer, from
// one goroutine and from 32. Besides the store's own time and allocations
// it reports cpu-µs/op, this process's CPU time per reservation and
// commit, and redis-µs/op, the CPU time of the redis-server process (AOF
// everysec, as in go run ./bench) per reservation and commit: on a small
// machine the proxy and Redis share the cores.
func BenchmarkReserveCommit(b *testing.B) {
	srv := redistest.Start(b, "--appendonly", "yes", "--appendfsync", "everysec")
	pid := redisPID(b, srv)
	s, err := New(Options{Addrs: []string{srv.Addr()}, KeyPrefix: "bench:", DialTimeout: time.Second, OpTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	resp := store.Response{Status: 201, BodyStored: true,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"chargeId":"ch_1","orderId":"O-123456","amount":10}`)}
	var n atomic.Int64
	one := func(b *testing.B) {
		ctx := context.Background()
		key := "charges//O-" + strconv.FormatInt(n.Add(1), 10)
		tok := strconv.FormatInt(n.Load(), 36) + "-token-abcdefghijklmnop"
		rec, err := s.Reserve(ctx, key, store.Reservation{Token: tok, Fingerprint: "fp-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			Lease: time.Minute, TTL: 24 * time.Hour})
		if err != nil || rec != nil {
			b.Fatalf("reserve: %v, %v", rec, err)
		}
		if err := s.Commit(ctx, key, tok, resp, 24*time.Hour); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
	// epoch=checked: the reservation's script checks the epoch marker
	// (ExpectEpoch), as the program does on a single node.
	if _, _, err := s.SwapEpoch(context.Background(), "", store.Epoch{ID: "bench", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	for _, run := range []struct {
		name   string
		expect string
		par    int
	}{{"conns=1", "", 1}, {"conns=32", "", 32}, {"epoch=checked/conns=1", "bench", 1}, {"epoch=checked/conns=32", "bench", 32}} {
		par := run.par
		s.ExpectEpoch(run.expect)
		b.Run(run.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0, self0 := procCPU(b, pid), selfCPU()
			if par == 1 {
				for b.Loop() {
					one(b)
				}
			} else {
				b.SetParallelism((par + 1) / 2)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						one(b)
					}
				})
			}
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(b.N), "redis-µs/op")
			b.ReportMetric(float64((selfCPU()-self0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// selfCPU returns the user and system CPU time of this process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func redisPID(b *testing.B, srv *redistest.Server) int {
	info, err := srv.Do("INFO", "server")
	if err != nil {
		b.Fatal(err)
	}
	pid, err := strconv.Atoi(infoField(info, "process_id"))
	if err != nil {
		b.Fatal(err)
	}
	return pid
}

// procCPU returns the user and system CPU time of process pid (Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ 100
}

// BenchmarkEncodeResponse measures the encoding of a typical stored answer.
func BenchmarkEncodeResponse(b *testing.B) {
	resp := store.Response{Status: 201, BodyStored: true,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"chargeId":"ch_1","orderId":"O-123456","amount":10}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeResponse(resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserveFunctionVsEvalsha compares the reservation script sent
// with EVALSHA (as the store sends it) with the same body registered as a
// Redis Function (FUNCTION LOAD) and called with FCALL: redis-µs/op is
// redis-server's CPU time per reservation of a new key, in pipelines of
// 64 as the pipeliner sends them under load.
func BenchmarkReserveFunctionVsEvalsha(b *testing.B) {
	srv := redistest.Start(b, "--appendonly", "yes", "--appendfsync", "everysec")
	pid := redisPID(b, srv)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	lib := "#!lua name=idemproxy_bench\nredis.register_function('reserve', function(KEYS, ARGV)\n" +
		nowMillis + reserveBody + "\nend)\n"
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		b.Fatal(err)
	}
	if err := reserveScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	for _, mode := range []string{"evalsha", "fcall"} {
		b.Run(mode, func(b *testing.B) {
			cpu0 := procCPU(b, pid)
			calls := 0
			for b.Loop() {
				pipe := c.Pipeline()
				for range 64 {
					k := "bench:charges/-/" + strconv.FormatInt(n.Add(1), 10)
					args := []any{"token-abcdefghijklmnop", "fp-0123456789abcdef0123456789abcdef", 60000, 86400000}
					if mode == "fcall" {
						pipe.FCall(ctx, "reserve", []string{k}, args...)
					} else {
						reserveScript.EvalSha(ctx, pipe, []string{k}, args...)
					}
				}
				cmds, err := pipe.Exec(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for _, cmd := range cmds {
					if v, err := cmd.(*goredis.Cmd).Slice(); err != nil || len(v) != 1 {
						b.Fatalf("reply %v, %v; want {1}", v, err)
					}
				}
				calls += 64
			}
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(calls), "redis-µs/op")
		})
	}
}
