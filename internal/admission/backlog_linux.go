//go:build linux

package admission

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unreadBytes returns the bytes the kernel holds for c that nobody has
// read yet (SIOCINQ), or -1 when it cannot tell.
func unreadBytes(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	if err := rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n = v
		}
	}); err != nil {
		return -1
	}
	return n
}
