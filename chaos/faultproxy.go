//go:build linux

package main

import (
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// faultProxy is a small TCP fault layer: it forwards every connection it
// accepts to target and, on demand, adds latency to every chunk, drops
// everything (a blackhole: the connections that lost bytes are reset when it
// ends), holds everything and delivers it late (a stall, as a partition that
// heals before TCP gives up), delays every close (a slow close), or resets
// every connection at once.
type faultProxy struct {
	ln     net.Listener
	target string
	// exempt are the source IPs whose connections pass untouched: the
	// store's own traffic (replication, Sentinel's checks), which a fault
	// of the clients' network must not reach.
	exempt []string

	mu        sync.Mutex
	latency   time.Duration
	blackhole bool
	stall     bool
	slowClose time.Duration
	// cut is a source IP whose connections are reset and refused (a
	// replica cut off from its master); "" cuts none.
	cut   string
	conns map[*pipePair]struct{}
	wg    sync.WaitGroup
}

type pipePair struct {
	client, server net.Conn
	tainted        bool   // it lost bytes to a blackhole
	exempt         bool   // from an exempt address: no fault of the clients' network applies
	source         string // the client's IP
}

func newFaultProxy(target string) (*faultProxy, error) { return newFaultProxyExempt(target) }

// newFaultProxyExempt is newFaultProxy whose faults spare the connections
// that come from the IPs exempt.
func newFaultProxyExempt(target string, exempt ...string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{ln: ln, target: target, exempt: exempt, conns: map[*pipePair]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var source string
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			source = a.IP.String()
		}
		p.mu.Lock()
		cut := p.cut != "" && source == p.cut
		p.mu.Unlock()
		if cut {
			resetConn(c)
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			resetConn(c)
			continue
		}
		pp := &pipePair{client: c, server: s, source: source, exempt: slices.Contains(p.exempt, source)}
		p.mu.Lock()
		p.conns[pp] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pipe(pp, c, s) }()
			go func() { defer wg.Done(); p.pipe(pp, s, c) }()
			wg.Wait()
			c.Close()
			s.Close()
			p.mu.Lock()
			delete(p.conns, pp)
			p.mu.Unlock()
		}()
	}
}

// pipe copies src to dst under the current faults, then half-closes dst.
func (p *faultProxy) pipe(pp *pipePair, src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat, hole := p.latency, p.blackhole
			if pp.exempt {
				lat, hole = 0, false
			}
			if hole {
				pp.tainted = true
			}
			p.mu.Unlock()
			if !hole {
				if !pp.exempt {
					p.waitStall()
				}
				if lat > 0 {
					time.Sleep(lat)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					resetConn(src)
					return
				}
			}
		}
		if err != nil {
			p.mu.Lock()
			slow := p.slowClose
			if pp.exempt {
				slow = 0
			}
			p.mu.Unlock()
			if slow > 0 && errors.Is(err, io.EOF) {
				time.Sleep(slow)
			}
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
			} else {
				resetConn(dst)
			}
			return
		}
	}
}

// set changes the faults: zero values heal.
func (p *faultProxy) set(latency time.Duration, blackhole bool, slowClose time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.slowClose = latency, slowClose
	if p.blackhole && !blackhole {
		for pp := range p.conns {
			if pp.tainted {
				resetConn(pp.client)
				resetConn(pp.server)
			}
		}
	}
	p.blackhole = blackhole
}

// setStall holds every byte from now until it is called with false.
func (p *faultProxy) setStall(on bool) {
	p.mu.Lock()
	p.stall = on
	p.mu.Unlock()
}

// waitStall waits while the proxy is stalled.
func (p *faultProxy) waitStall() {
	for {
		p.mu.Lock()
		on := p.stall
		p.mu.Unlock()
		if !on {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// resetAll resets every open connection (RST both ways).
func (p *faultProxy) resetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for pp := range p.conns {
		if pp.exempt {
			continue
		}
		resetConn(pp.client)
		resetConn(pp.server)
		n++
	}
	return n
}

// cutSource resets every connection from the IP source and refuses new
// ones until it is called with "": a replica cut off from its master,
// which sees it gone at once.
func (p *faultProxy) cutSource(source string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = source
	if source == "" {
		return
	}
	for pp := range p.conns {
		if pp.source == source {
			resetConn(pp.client)
			resetConn(pp.server)
		}
	}
}

func (p *faultProxy) close() {
	p.setStall(false)
	p.ln.Close()
	p.mu.Lock()
	for pp := range p.conns {
		resetConn(pp.client)
		resetConn(pp.server)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// resetConn closes c with an RST instead of a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
