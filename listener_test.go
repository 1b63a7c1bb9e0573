package main

import (
	"net"
	"testing"
	"time"
)

// TestLimitListener: with a limit of 2, a third connection is not accepted
// while two are open, and is accepted as soon as one of them closes.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitListen(inner, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, second := <-accepted, <-accepted
	defer second.Close()
	// The third waits in the backlog: it cannot be accepted while two are
	// open, however long we look (the fix makes this certain; a quarter of a
	// second is only how long a broken limit has to show itself).
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("a third connection was accepted while two were open")
	case <-time.After(250 * time.Millisecond):
	}
	first.Close()
	first.Close() // a second Close does not free a second slot
	third := <-accepted
	defer third.Close()
	select {
	case <-accepted:
		t.Fatal("a fourth connection appeared")
	default:
	}
}
