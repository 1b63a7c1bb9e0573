//go:build linux

package admission

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// backlogPair returns the server's side of a loopback TCP connection whose
// client wrote an HTTP/2 preface and then as many DATA frames as the
// kernel holds unread (past maxBacklog), as a tracked connection of l.
func backlogPair(t *testing.T, l *Limiter) (*trackedConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	go func() {
		w := bufio.NewWriterSize(cli, 64<<10)
		w.WriteString(h2attack.Preface)
		for range 64 { // 1 MiB: more than the kernel holds unread
			h2attack.WriteFrame(w, h2attack.FrameData, 0, 1, make([]byte, 16<<10))
		}
		cli.SetWriteDeadline(time.Now().Add(30 * time.Second))
		w.Flush()
	}()
	h2attack.Eventually(t, "the backlog passes maxBacklog", func() bool { return unreadBytes(srv) > maxBacklog })
	return &trackedConn{Conn: srv, l: l, born: time.Now(), client: &clientEntry{id: "127.0.0.1"}}, cli
}

// TestBacklogThatStaysLargeIsClosed: an HTTP/2 connection whose unread
// backlog stays past maxBacklog for backlogFor is closed as it is read,
// rather than drained at the server's pace, and counted; while the proxy
// sheds it is closed at its first read. A connection whose backlog is
// read down is kept.
func TestBacklogThatStaysLargeIsClosed(t *testing.T) {
	t.Run("judged", func(t *testing.T) {
		l := newLimiter(nil, 0, time.Second)
		c, _ := backlogPair(t, l)
		now := time.Now()
		if large, stays := c.backlog.large(c.Conn, now); !large || stays {
			t.Fatalf("large, stays = %v, %v at first, want true, false", large, stays)
		}
		if got := c.costly(now, false); got != "" {
			t.Errorf("costly at first = %q, want kept for backlogFor", got)
		}
		if got := c.costly(now, true); got != reasonBacklog {
			t.Errorf("costly while shedding = %q, want %q at once", got, reasonBacklog)
		}
		if got := c.costly(now.Add(backlogFor), false); got != reasonBacklog {
			t.Errorf("costly after backlogFor = %q, want %q", got, reasonBacklog)
		}
		// Read down, it is small again and the connection is kept.
		buf := make([]byte, 1<<20)
		for unreadBytes(c.Conn) > 0 {
			c.Conn.Read(buf)
		}
		if got := c.costly(now.Add(2*backlogFor), false); got != "" {
			t.Errorf("costly once read down = %q, want kept", got)
		}
	})
	t.Run("read", func(t *testing.T) {
		l := newLimiter(nil, 0, time.Second)
		c, cli := backlogPair(t, l)
		buf := make([]byte, 9)
		var err error
		for deadline := time.Now().Add(30 * time.Second); err == nil && time.Now().Before(deadline); {
			_, err = c.Read(buf) // a frame header at a time: slower than the client writes
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(err, errOverloadBacklog) {
			t.Fatalf("Read = %v, want the connection closed for its backlog", err)
		}
		if n := l.over.counted(actionCloseConn, reasonBacklog); n != 1 {
			t.Errorf("idemproxy_overload_actions_total{action=close_connection,reason=backlog} = %d, want 1", n)
		}
		cli.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := cli.Read(buf); err == nil {
			t.Errorf("the client's side is still open, want it closed")
		}
	})
}
