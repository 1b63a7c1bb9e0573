//go:build !linux

package redistest

// Pause is only supported on Linux.
func (s *Server) Pause() { s.tb.Helper(); s.tb.Fatal("redistest: Pause needs Linux") }

// Resume is only supported on Linux.
func (s *Server) Resume() { s.tb.Helper(); s.tb.Fatal("redistest: Resume needs Linux") }
