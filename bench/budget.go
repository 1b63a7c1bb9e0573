//go:build unix

package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The per-request budget (issue 37): what a request costs the measured
// process besides CPU time, read before and after the loaded run.
//
//   - allocations and bytes allocated: go_memstats_mallocs_total and
//     go_memstats_alloc_bytes_total, scraped from idemproxy's admin
//     /metrics (the bare proxy serves the same two counters, memstats.go
//     style, on an address of its own);
//   - syscalls: syscr + syscw of /proc/<pid>/io, the kernel's exact counts
//     of the read- and write-family calls (read, readv, pread, write,
//     writev, pwrite: socket and file I/O; not epoll, futex or fdatasync);
//   - with -profile, the stages of idemproxy's CPU (stageShares).

// allocCounters are a process's allocation counters so far.
type allocCounters struct{ mallocs, bytes float64 }

// sub is c minus before.
func (c allocCounters) sub(before allocCounters) allocCounters {
	return allocCounters{c.mallocs - before.mallocs, c.bytes - before.bytes}
}

// scrapeAllocs reads go_memstats_mallocs_total and
// go_memstats_alloc_bytes_total from a Prometheus text exposition at
// http://addr/metrics.
func scrapeAllocs(addr string) (allocCounters, error) {
	resp, err := getOK("http://" + addr + "/metrics")
	if err != nil {
		return allocCounters{}, err
	}
	defer resp.Body.Close()
	var c allocCounters
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_memstats_mallocs_total":
			dst = &c.mallocs
		case "go_memstats_alloc_bytes_total":
			dst = &c.bytes
		default:
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
		if err != nil {
			return allocCounters{}, fmt.Errorf("%s: %w", name, err)
		}
		*dst = f
		found++
	}
	if err := sc.Err(); err != nil {
		return allocCounters{}, err
	}
	if found != 2 {
		return allocCounters{}, errors.New("/metrics has no go_memstats_mallocs_total or go_memstats_alloc_bytes_total")
	}
	return c, nil
}

// getOK GETs url, within 5 s, and returns its answer if it is 200 OK.
func getOK(url string) (*http.Response, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}

// serveMemstats serves the two allocation counters that scrapeAllocs
// reads, for the bare proxy, on an address of its own.
func serveMemstats(listen string) {
	srv := &http.Server{Addr: listen, ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(w, "go_memstats_mallocs_total %d\ngo_memstats_alloc_bytes_total %d\n", ms.Mallocs, ms.TotalAlloc)
		})}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

// syscalls is the number of read- and write-family system calls a process
// made so far (syscr + syscw of /proc/<pid>/io); -1 when unreadable.
func syscalls(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return -1
	}
	var n int64
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "syscr" || k == "syscw") {
			c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return -1
			}
			n += c
			found++
		}
	}
	if found != 2 {
		return -1
	}
	return n
}

// stage is one part of idemproxy's work on a request, recognised in a CPU
// profile's sample by a function on its stack.
type stage struct {
	name string
	// match says whether a function of the stack belongs to the stage.
	match func(fn string) bool
}

const proxyPkg = "github.com/idemproxy/idemproxy/proxy."

func fnIs(names ...string) func(string) bool {
	return func(fn string) bool {
		for _, n := range names {
			if fn == n {
				return true
			}
		}
		return false
	}
}

func fnHasPrefix(prefixes ...string) func(string) bool {
	return func(fn string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(fn, p) {
				return true
			}
		}
		return false
	}
}

// stages are checked in order: a sample counts for the first stage one of
// whose functions is on its stack (commit and capture run inside the
// forward, the forward inside the connection's goroutine).
var stages = []stage{
	{"commit", fnIs(proxyPkg + "(*attempt).commit")},
	{"capture", fnIs(proxyPkg + "(*attempt).captureAnswer")},
	{"reservation", fnIs(proxyPkg + "(*attempt).reserve")},
	{"body, key, fingerprint", fnIs(proxyPkg+"(*attempt).readBody", proxyPkg+"(*attempt).identify")},
	{"metrics, logs", func(fn string) bool {
		return fn == proxyPkg+"(*Proxy).finish" || strings.HasPrefix(fn, "github.com/idemproxy/idemproxy/internal/app/logsink.")
	}},
	{"forward (upstream, answer to client)", fnIs(proxyPkg+"(*Proxy).forward",
		"net/http.(*persistConn).readLoop", "net/http.(*persistConn).writeLoop")},
	{"store's own goroutines", fnHasPrefix("github.com/idemproxy/idemproxy/store/",
		"github.com/idemproxy/idemproxy/internal/batch.", "github.com/dgraph-io/badger/",
		"github.com/redis/go-redis/", "github.com/jackc/pgx/")},
	{"client connection (request, flush)", fnIs("net/http.(*conn).serve")},
	{"garbage collector", fnIs("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge")},
}

// stageShare is one stage's share of a profile's CPU samples.
type stageShare struct {
	name  string
	share float64
}

// stageShares reads a CPU profile (gzipped profile.proto, as
// /debug/pprof/profile writes it) and returns each stage's share of its
// CPU time, stages in order and then "other".
func stageShares(path string) ([]stageShare, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p, err := parseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sums := make([]float64, len(stages)+1)
	var total float64
	for _, s := range p.samples {
		v := float64(s.value)
		total += v
		i := len(stages) // other
	find:
		for si, st := range stages {
			for _, loc := range s.locs {
				for _, fn := range p.locFuncs[loc] {
					if st.match(p.strings[p.funcNames[fn]]) {
						i = si
						break find
					}
				}
			}
		}
		sums[i] += v
	}
	if total == 0 {
		return nil, fmt.Errorf("%s: no samples", path)
	}
	out := make([]stageShare, 0, len(sums))
	for i, st := range stages {
		out = append(out, stageShare{st.name, sums[i] / total})
	}
	return append(out, stageShare{"other (runtime, scheduler, ...)", sums[len(stages)] / total}), nil
}

// profile is what stageShares needs of a profile.proto.
type profile struct {
	samples   []profSample
	locFuncs  map[uint64][]uint64 // location id: function ids, innermost first
	funcNames map[uint64]int64    // function id: index in strings
	strings   []string
}

type profSample struct {
	locs  []uint64
	value int64 // the last sample value: CPU nanoseconds
}

// parseProfile decodes the fields of profile.proto that stageShares reads
// (github.com/google/pprof/proto/profile.proto): sample (2), location
// (4), function (5) and string_table (6).
func parseProfile(b []byte) (*profile, error) {
	p := &profile{locFuncs: map[uint64][]uint64{}, funcNames: map[uint64]int64{}}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 2: // Sample
			var s profSample
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 1:
					s.locs = append(s.locs, varints(typ, v, x)...)
				case 2:
					if vs := varints(typ, v, x); len(vs) > 0 {
						s.value = int64(vs[len(vs)-1])
					}
				}
				return nil
			})
			p.samples = append(p.samples, s)
			return err
		case 4: // Location
			var id uint64
			var fns []uint64
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1:
					id = x
				case num == 4 && typ == protowire.BytesType: // Line
					return eachField(v, func(num protowire.Number, _ protowire.Type, _ []byte, x uint64) error {
						if num == 1 {
							fns = append(fns, x)
						}
						return nil
					})
				}
				return nil
			})
			p.locFuncs[id] = fns
			return err
		case 5: // Function
			var id uint64
			var name int64
			err := eachField(v, func(num protowire.Number, _ protowire.Type, _ []byte, x uint64) error {
				switch num {
				case 1:
					id = x
				case 2:
					name = int64(x)
				}
				return nil
			})
			p.funcNames[id] = name
			return err
		case 6:
			p.strings = append(p.strings, string(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, n := range p.funcNames {
		if n < 0 || n >= int64(len(p.strings)) {
			return nil, errors.New("a function's name is outside the string table")
		}
	}
	return p, nil
}

// varints is a repeated varint field's values: packed (v) or one (x).
func varints(typ protowire.Type, v []byte, x uint64) []uint64 {
	if typ != protowire.BytesType {
		return []uint64{x}
	}
	var out []uint64
	for len(v) > 0 {
		x, n := protowire.ConsumeVarint(v)
		if n < 0 {
			return out
		}
		out = append(out, x)
		v = v[n:]
	}
	return out
}

// printStages prints, for each profiled target, the share of its CPU and
// the CPU per request of each stage.
func printStages(w io.Writer, dir string, rs []result) error {
	var names []string
	shares := map[string][]stageShare{}
	cpu := map[string]time.Duration{}
	for _, r := range rs {
		path := dir + "/" + r.name + ".pprof"
		if _, err := os.Stat(path); err != nil {
			continue // not profiled: the bare proxy
		}
		s, err := stageShares(path)
		if err != nil {
			return err
		}
		names = append(names, r.name)
		shares[r.name], cpu[r.name] = s, r.cpuPerReq
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	fmt.Fprintln(w, "\nwhere idemproxy's CPU goes, by stage (-profile of the loaded run): share of its CPU, and µs a request")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "stage\t")
	for _, n := range names {
		fmt.Fprintf(tw, "%s\tµs/req\t", n)
	}
	fmt.Fprintln(tw)
	for i := range shares[names[0]] {
		fmt.Fprintf(tw, "%s\t", shares[names[0]][i].name)
		for _, n := range names {
			s := shares[n][i].share
			fmt.Fprintf(tw, "%.1f %%\t%.1f µs\t", 100*s, s*float64(cpu[n].Nanoseconds())/1000)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
