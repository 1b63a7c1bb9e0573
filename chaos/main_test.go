//go:build linux

package main

import (
	"bufio"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"testing"
	"time"
)

func TestSameSeedSameSchedule(t *testing.T) {
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
		if f.At > time.Minute || (i > 0 && f.At < a[i-1].At+a[i-1].For) {
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
