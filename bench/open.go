//go:build unix

package main

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// startRedis starts a redis-server in dir (AOF everysec, as a production
// Redis would persist) on a free loopback port, through start, and returns
// its address and process id.
func startRedis(dir string, start func(name string, args ...string) (*exec.Cmd, error)) (string, int, error) {
	addr := freeAddr()
	_, port, _ := net.SplitHostPort(addr)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, err
	}
	c, err := start("redis-server", "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
	if err != nil {
		return "", 0, err
	}
	if err := waitListening(addr); err != nil {
		return "", 0, fmt.Errorf("redis: %w", err)
	}
	return addr, c.Process.Pid, nil
}

// startRedisReplica starts a redis-server in dir as startRedis does, a
// replica of the Redis at master, and waits until the master counts it
// (connected_slaves:1) and its link is up. It returns the replica's
// process id.
func startRedisReplica(dir string, start func(name string, args ...string) (*exec.Cmd, error), master string) (int, error) {
	addr := freeAddr()
	_, port, _ := net.SplitHostPort(addr)
	mhost, mport, _ := net.SplitHostPort(master)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	c, err := start("redis-server", "--bind", "127.0.0.1", "--port", port, "--dir", dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--replicaof", mhost, mport)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err1 := redisDo(addr, "INFO", "replication")
		m, err2 := redisDo(master, "INFO", "replication")
		if err1 == nil && err2 == nil && strings.Contains(r, "master_link_status:up") && strings.Contains(m, "connected_slaves:1") {
			return c.Process.Pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("redis replica on %s not in sync within 30s: %v, %v", addr, err1, err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openResult is one target's open-loop measurement.
type openResult struct {
	name                    string
	rate                    float64 // answered per second
	p50, p90, p99, p999, mx time.Duration
	cpuPerReq               time.Duration
	storeCPU                time.Duration // -1: no database server
	peakRSS                 int64
	sent, errors            int64
}

// runOpen measures every target open-loop at o.rate for o.d, -rounds
// times in turn (a target's rounds alternate with the others'), and prints
// the median round of each by p99.
func runOpen(o options, ts []*target, stubURL string) error {
	fmt.Printf("load: open-loop, unique-key POST /charges at %d/s for %s (latency from each request's intended start, at most %d in flight), Go client; %d round(s), %d CPUs\n",
		o.rate, o.d, maxInFlight, o.rounds, runtime.NumCPU())
	nonce := fmt.Sprintf("%x", time.Now().UnixNano())
	all := map[string][]openResult{}
	for r := range o.rounds {
		for _, t := range ts {
			prefix := fmt.Sprintf("%s-%d-%s", nonce, r, t.name)
			// Warm up: connections, the store's first tables.
			warm, err := loadOpen(t.addr, o.rate, time.Second, prefix+"-w")
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			t.sent += warm.requests
			var prof chan error
			if t.admin != "" && r == o.rounds-1 {
				prof = make(chan error, 1)
				go func() {
					prof <- cpuProfile(t.admin, max(o.d-time.Second, time.Second), filepath.Join(o.profile, t.name+".pprof"))
				}()
			}
			cpu0 := cpuTime(t.pid)
			var db0 time.Duration
			if t.storeCPU != nil {
				db0 = t.storeCPU()
			}
			s, err := loadOpen(t.addr, o.rate, o.d, prefix)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			t.sent += s.requests
			res := openResult{name: t.name, rate: float64(s.requests) / s.elapsed.Seconds(),
				p50: s.quantile(0.50), p90: s.quantile(0.90), p99: s.quantile(0.99), p999: s.quantile(0.999), mx: s.max(),
				storeCPU: -1, sent: s.sent, errors: s.errors}
			if s.requests > 0 {
				res.cpuPerReq = (cpuTime(t.pid) - cpu0) / time.Duration(s.requests)
				if t.storeCPU != nil {
					res.storeCPU = (t.storeCPU() - db0) / time.Duration(s.requests)
				}
			}
			if prof != nil {
				if err := <-prof; err != nil {
					return fmt.Errorf("%s: profile: %w", t.name, err)
				}
			}
			res.peakRSS = vmHWM(t.pid)
			fmt.Printf("round %d %s: p50 %s p99 %s max %s, peak RSS %.1f MiB\n", r+1, t.name, ms(res.p50), ms(res.p99), ms(res.mx), mib(res.peakRSS))
			all[t.name] = append(all[t.name], res)
			forgetCharges(stubURL)
		}
	}
	var out []openResult
	for _, t := range ts {
		rs := all[t.name]
		// The median round by p99; peak RSS is the process's over all rounds.
		slices.SortFunc(rs, func(a, b openResult) int { return cmp.Compare(a.p99, b.p99) })
		m := rs[len(rs)/2]
		m.peakRSS = vmHWM(t.pid)
		out = append(out, m)
	}
	printOpenTable(os.Stdout, out)
	return nil
}

// forgetCharges has the stub forget the charges it keeps.
func forgetCharges(stubURL string) {
	if req, err := http.NewRequest("DELETE", stubURL+"/charges", nil); err == nil {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
}

func printOpenTable(w io.Writer, rs []openResult) {
	var base *openResult
	for i := range rs {
		if rs[i].name == "bare" {
			base = &rs[i]
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\trate\tp50\tp90\tp99\tp99.9\tmax\tCPU/req\tvs bare\tDB CPU/req\tpeak RSS\terrors\t\n")
	for _, r := range rs {
		cr, db := "-", "-"
		if base != nil && base.cpuPerReq > 0 {
			cr = fmt.Sprintf("%.2f", float64(r.cpuPerReq)/float64(base.cpuPerReq))
		}
		if r.storeCPU >= 0 {
			db = us(r.storeCPU)
		}
		fmt.Fprintf(tw, "%s\t%.0f/s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%d\t\n", r.name, r.rate,
			ms(r.p50), ms(r.p90), ms(r.p99), ms(r.p999), ms(r.mx), us(r.cpuPerReq), cr, db, mib(r.peakRSS), r.errors)
	}
	tw.Flush()
	fmt.Fprintln(w, "Latencies are from each request's intended start (open loop: queueing behind a stall counts);")
	fmt.Fprintln(w, "rate is the answered requests per second; CPU/req is the measured process's user+system time over")
	fmt.Fprintln(w, "the run divided by its requests; DB CPU/req the same for its Redis server, its Redis Cluster (every")
	fmt.Fprintln(w, "node's) or its PostgreSQL server; peak RSS")
	fmt.Fprintln(w, "is the measured process's VmHWM after all rounds (serving only: prefills are done before it starts).")
}
