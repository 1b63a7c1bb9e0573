package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPick: the ports picked are free, outside the ephemeral range, and
// with an offset the second port is free too.
func TestPick(t *testing.T) {
	lo := ephemeralLow()
	for _, offset := range []int{0, 10000} {
		for range 20 {
			port, err := Pick(offset)
			if err != nil {
				t.Fatal(err)
			}
			if port < lowest || (lo > 0 && port >= lo) {
				t.Errorf("Pick(%d) = %d, want a port in [%d, %d)", offset, port, lowest, lo)
			}
			for _, p := range []int{port, port + offset} {
				l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				if err != nil {
					t.Fatalf("Pick(%d) = %d: port %d is not free: %v", offset, port, p, err)
				}
				l.Close()
			}
		}
	}
}

// TestPickSkipsABusyPort: a port someone listens on is never picked.
func TestPickSkipsABusyPort(t *testing.T) {
	busy := map[int]bool{}
	var ls []net.Listener
	for p := lowest; p < lowest+200; p++ {
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			ls = append(ls, l)
			busy[p] = true
		}
	}
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range 200 {
		port, err := Pick(0)
		if err != nil {
			t.Fatal(err)
		}
		if busy[port] {
			t.Fatalf("Pick chose port %d, which is in use", port)
		}
	}
}
