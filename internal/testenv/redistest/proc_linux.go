package redistest

import "syscall"

// Pause freezes the server with SIGSTOP: connections stay open but nothing
// answers, as in a network partition or a stalled host. Resume undoes it;
// Stop and the test's cleanup kill a paused server too.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("redistest: signal %v: redis-server on port %d is not running", sig, s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("redistest: signal %v: %v", sig, err)
	}
}
