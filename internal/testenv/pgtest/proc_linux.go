package pgtest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killLocked kills the postmaster and its children (backends and auxiliary
// processes, each in a session of its own, so a process-group signal would
// miss them) with SIGKILL and waits for the postmaster to exit.
func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new children meanwhile
	for _, c := range children(pid) {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-s.done
	s.cmd, s.done = nil, nil
}

// Pause freezes the postmaster and its backends with SIGSTOP: connections
// stay open and new ones are accepted by the kernel, but nothing answers,
// as on a stalled host or a network partition. Resume undoes it; Stop, Kill
// and the test's cleanup end a paused server too.
func (s *Server) Pause() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("pgtest: pause: postgres on port %d is not running", s.port)
	}
	pid := s.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("pgtest: pause: %v", err)
	}
	for _, c := range children(pid) {
		_ = syscall.Kill(c, syscall.SIGSTOP)
	}
}

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("pgtest: resume: postgres on port %d is not running", s.port)
	}
	s.continueLocked()
}

// continueLocked sends SIGCONT to the postmaster's children and then to it.
func (s *Server) continueLocked() {
	pid := s.cmd.Process.Pid
	for _, c := range children(pid) {
		_ = syscall.Kill(c, syscall.SIGCONT)
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
}

// children returns the ids of the processes whose parent is pid, from
// /proc.
func children(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		rest := string(b)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, c)
		}
	}
	return out
}
