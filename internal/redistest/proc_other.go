//go:build !linux

package redistest

import "os/exec"

func setProcAttr(cmd *exec.Cmd) {}

// Pause is only supported on Linux.
func (s *Server) Pause() { s.tb.Helper(); s.tb.Fatal("redistest: Pause needs Linux") }

// Resume is only supported on Linux.
func (s *Server) Resume() { s.tb.Helper(); s.tb.Fatal("redistest: Resume needs Linux") }
