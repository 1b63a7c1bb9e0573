package main

import (
	"net"
	"sync"
)

// limitListener accepts at most n connections open at once; further
// connections wait in the kernel's listen backlog until one closes, so a
// flood of connections cannot take the sidecar's memory and file
// descriptors.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

// limitListen returns ln limited to n connections at once (n <= 0: ln).
func limitListen(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

// limitConn gives its slot back once, on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
