// Package freeport picks loopback TCP ports for servers that tests and the
// chaos run start and restart on the same port (redis-server, PostgreSQL,
// the proxies).
//
// A port the kernel hands out for "127.0.0.1:0" lies in its ephemeral range,
// the range it also takes the local ports of outgoing connections from. Once
// such a server stops, any process's next connection may take its port, and
// the restart fails with "address already in use". Pick chooses ports below
// the ephemeral range instead, which connections never take.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// The range Pick draws from when the kernel's ephemeral range cannot be
// read or leaves too little room below it.
const (
	lowest  = 20000
	highest = 32767 // below Linux's default ephemeral range, 32768-60999
)

// Pick returns a loopback TCP port outside the ephemeral range that was
// free a moment ago. With offset > 0, port+offset was free too (a Redis
// Cluster node's bus port), and both stay below 65536.
func Pick(offset int) (int, error) {
	hi := highest
	if lo := ephemeralLow(); lo > lowest+1000 && lo-1 < hi {
		hi = lo - 1
	}
	for range 200 {
		port := lowest + rand.IntN(hi-lowest+1)
		if port+offset > 65535 || !free(port) || (offset > 0 && !free(port+offset)) {
			continue
		}
		return port, nil
	}
	return 0, errors.New("find a free port: none found in 200 tries")
}

// free reports whether port can be listened on at 127.0.0.1 now.
func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo); err != nil {
		return 0
	}
	return lo
}
