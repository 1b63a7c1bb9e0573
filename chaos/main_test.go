//go:build linux

package main

import (
	"bufio"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSameSeedSameSchedule(t *testing.T) {
	t.Parallel()
	kinds := []string{kFailBefore, kKill, "redis-sigstop", kUpBlackhole}
	draw := func(seed uint64) []fault {
		return schedule(rand.New(rand.NewPCG(seed, 0x1d3)), time.Minute, 2*time.Second, kinds, 4)
	}
	a, b := draw(7), draw(7)
	if len(a) == 0 || !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 drew two schedules:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, draw(8)) {
		t.Errorf("seeds 7 and 8 drew the same schedule")
	}
	for i, f := range a {
		// One at a time: a fault starts once the one before is over
		// (an instant one is over when it starts).
		if f.At > time.Minute || (i > 0 && !instant(a[i-1].Kind) && f.At < a[i-1].At+a[i-1].For) {
			t.Errorf("fault %d at %v overlaps the one before or ends the run late: %v", i, f.At, a)
		}
	}
}

// echoServer echoes every line it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func TestFaultProxy(t *testing.T) {
	t.Parallel()
	fp, err := newFaultProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer fp.close()
	c, err := net.Dial("tcp", fp.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) (string, error) {
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	if got, err := roundTrip("a"); err != nil || got != "a\n" {
		t.Fatalf("through the proxy: %q, %v; want the echo", got, err)
	}
	fp.set(0, true, 0)
	if got, err := roundTrip("b"); err == nil {
		t.Fatalf("through a blackhole: %q, want a timeout", got)
	}
	fp.set(0, false, 0) // the connection lost bytes: it is reset
	if got, err := roundTrip("c"); err == nil {
		t.Fatalf("after the blackhole: %q, want the connection reset", got)
	}

	// A stall holds the bytes and delivers them when it ends.
	c3, err := net.Dial("tcp", fp.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	fp.setStall(true)
	if _, err := c3.Write([]byte("s\n")); err != nil {
		t.Fatal(err)
	}
	_ = c3.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c3.Read(make([]byte, 8)); err == nil {
		t.Fatalf("read %d bytes through a stall", n)
	}
	fp.setStall(false)
	_ = c3.SetReadDeadline(time.Now().Add(time.Second))
	if got, err := bufio.NewReader(c3).ReadString('\n'); err != nil || got != "s\n" {
		t.Fatalf("after the stall: %q, %v; want the held bytes", got, err)
	}

	c2, err := net.Dial("tcp", fp.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(time.Second))
	if _, err := c2.Write([]byte("d\n")); err != nil {
		t.Fatal(err)
	}
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != "d\n" {
		t.Fatalf("a new connection after the blackhole: %q, %v", got, err)
	}
	if n := fp.resetAll(); n < 1 {
		t.Errorf("resetAll reset %d connections, want the open one", n)
	}
	_ = c2.SetDeadline(time.Now().Add(time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil {
		t.Errorf("read after a reset succeeded")
	}
}

// TestCIScheduleDensity: the CI form (go run ./chaos -duration 60s, every
// store, the default kinds, the default interval) schedules at least 30
// faults of at least 6 kinds, whatever the seed; the default kinds leave
// out the slow ones, which -faults slow names.
func TestCIScheduleDensity(t *testing.T) {
	t.Parallel()
	r := &run{stores: []*storeSrv{{name: "redis"}, {name: "postgres"}}, tmpfs: true}
	kinds, err := r.chosenKinds()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		if slow(k) {
			t.Errorf("the default kinds hold the slow kind %s", k)
		}
	}
	fewest, fewestKinds := 1<<30, 1<<30
	for seed := uint64(1); seed <= 300; seed++ {
		sched := schedule(rand.New(rand.NewPCG(seed, 0x1d3)), time.Minute, defaultInterval, kinds, 6)
		seen := map[string]bool{}
		for _, f := range sched {
			seen[f.Kind] = true
		}
		fewest, fewestKinds = min(fewest, len(sched)), min(fewestKinds, len(seen))
	}
	if fewest < 30 || fewestKinds < 6 {
		t.Errorf("a 60 s run schedules as few as %d faults of %d kinds over 300 seeds; want at least 30 of 6", fewest, fewestKinds)
	}
	t.Logf("%d default kinds; the fewest over 300 seeds: %d faults, %d kinds", len(kinds), fewest, fewestKinds)

	r.opts.kinds = []string{"slow"}
	slowKinds, err := r.chosenKinds()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"redis-sigstop-past-lease", "redis-failover", "postgres-sigstop-past-lease", "postgres-failover"}
	if !reflect.DeepEqual(slowKinds, want) {
		t.Errorf("-faults slow = %v, want %v", slowKinds, want)
	}
	r.opts.kinds = []string{"default", "slow"}
	if all, _ := r.chosenKinds(); len(all) != len(kinds)+len(want) {
		t.Errorf("-faults default,slow = %d kinds, want %d", len(all), len(kinds)+len(want))
	}
	r.opts.kinds = []string{"redis-failover", "mysql-failover"}
	if _, err := r.chosenKinds(); err == nil {
		t.Errorf("-faults with an unknown kind: no error")
	}
}

// TestScheduleDurations: a fault that outlasts the lease is drawn longer
// than the lease, every other one shorter than the lease, and an instant
// fault (queued in the stub, a reset, a reload) lets the next one start
// at once; every kind comes once before any comes twice.
func TestScheduleDurations(t *testing.T) {
	t.Parallel()
	kinds := []string{kStallPastLease, "redis-sigstop-past-lease", kUpReset, kUpBlackhole, "postgres-failover"}
	sched := schedule(rand.New(rand.NewPCG(3, 0x1d3)), 10*time.Minute, defaultInterval, kinds, 4)
	if len(sched) < 2*len(kinds) {
		t.Fatalf("%d faults in 10 minutes", len(sched))
	}
	for i, f := range sched {
		if outlastsLease(f.Kind) != (f.For > lease) {
			t.Errorf("%v: lasts %v, the lease is %v", f, f.For, lease)
		}
		if i > 0 && !instant(sched[i-1].Kind) && f.At < sched[i-1].At+sched[i-1].For {
			t.Errorf("%v starts before %v ends", f, sched[i-1])
		}
		if round := i / len(kinds); i%len(kinds) == len(kinds)-1 {
			seen := map[string]bool{}
			for _, g := range sched[round*len(kinds) : i+1] {
				seen[g.Kind] = true
			}
			if len(seen) != len(kinds) {
				t.Errorf("round %d drew %d kinds of %d", round, len(seen), len(kinds))
			}
		}
	}
	if !instant(kStallPastLease) || instant(kUpBlackhole) || !outlastsLease("postgres-sigstop-past-lease") || outlastsLease(kStallPastLease) {
		t.Errorf("instant/outlastsLease misread the kinds")
	}
}

// TestDocChaosFaultTableListsEveryKind: docs/chaos.md's fault table has a row for
// every kind the run can inject, and names no kind it cannot.
func TestDocChaosFaultTableListsEveryKind(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/chaos.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	cell := regexp.MustCompile("`([a-z0-9-]+)`")
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	r := &run{stores: []*storeSrv{{name: "redis"}, {name: "postgres"}}, tmpfs: true, power: &powerDisk{}}
	kinds := r.kinds()
	for _, k := range kinds {
		if !documented[k] {
			t.Errorf("docs/chaos.md's fault table has no row for %s", k)
		}
	}
	for k := range documented {
		if !slices.Contains(kinds, k) {
			t.Errorf("docs/chaos.md's fault table names %s, which the run cannot inject", k)
		}
	}
}

// TestFaultProxyCutsASource: redis-failover-lagging cuts the replica off
// its master at the master's fault layer: the connections from the
// replica's address are reset and new ones refused, the others (the
// Sentinel's, exempt too; the proxies') pass, until the cut is lifted.
func TestFaultProxyCutsASource(t *testing.T) {
	t.Parallel()
	fp, err := newFaultProxyExempt(echoServer(t), storeSource, replSource)
	if err != nil {
		t.Fatal(err)
	}
	defer fp.close()
	dial := func(from string) (net.Conn, error) {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		return d.Dial("tcp", fp.addr())
	}
	echo := func(c net.Conn, msg string) error {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && got != msg+"\n" {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	conns := map[string]net.Conn{}
	for _, from := range []string{replSource, storeSource, "127.0.0.1"} {
		c, err := dial(from)
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		defer c.Close()
		if err := echo(c, "a"); err != nil {
			t.Fatalf("from %s before the cut: %v", from, err)
		}
		conns[from] = c
	}
	fp.cutSource(replSource)
	if err := echo(conns[replSource], "b"); err == nil {
		t.Errorf("the replica's connection passed the cut")
	}
	if c, err := dial(replSource); err == nil {
		if echo(c, "c") == nil {
			t.Errorf("a new connection from the replica passed the cut")
		}
		c.Close()
	}
	for _, from := range []string{storeSource, "127.0.0.1"} {
		if err := echo(conns[from], "d"); err != nil {
			t.Errorf("from %s during the cut: %v", from, err)
		}
	}
	fp.cutSource("")
	c, err := dial(replSource)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c, "e"); err != nil {
		t.Errorf("from the replica once the cut is lifted: %v", err)
	}
}

// TestPartialKindsAreANamedSet: the partial losses and the rename by
// reload are not default kinds; -faults partial names them.
func TestPartialKindsAreANamedSet(t *testing.T) {
	t.Parallel()
	r := &run{stores: []*storeSrv{{name: "redis"}, {name: "postgres"}}}
	def, err := r.chosenKinds()
	if err != nil {
		t.Fatal(err)
	}
	r.opts.kinds = []string{partialSet}
	got, err := r.chosenKinds()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{kReloadRename, kEvict, kLagging, kRestoreOld}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("-faults partial: %v, want %v", got, want)
	}
	for _, k := range want {
		if slices.Contains(def, k) {
			t.Errorf("%s is a default kind", k)
		}
	}
}
