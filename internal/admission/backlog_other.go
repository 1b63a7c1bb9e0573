//go:build !linux

package admission

import "net"

// unreadBytes returns -1: only Linux tells the bytes a socket holds
// unread (SIOCINQ); elsewhere a connection's backlog is never judged.
func unreadBytes(c net.Conn) int { return -1 }
