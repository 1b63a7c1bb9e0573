//go:build !linux

package pgtest

// killLocked kills the postmaster with SIGKILL and waits for it to exit.
func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Pause is only supported on Linux.
func (s *Server) Pause() { s.tb.Helper(); s.tb.Fatal("pgtest: Pause needs Linux") }

// Resume is only supported on Linux.
func (s *Server) Resume() { s.tb.Helper(); s.tb.Fatal("pgtest: Resume needs Linux") }

func (s *Server) continueLocked() {}
