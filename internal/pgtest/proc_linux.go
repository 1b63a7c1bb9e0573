package pgtest

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the postmaster in its own process group, so that Kill
// reaches its backends too, and makes the kernel kill it if the test binary
// dies without running its cleanups (its backends then exit on their own
// when they notice the postmaster is gone).
func setProcAttr(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// killLocked kills the postmaster's process group with SIGKILL and waits for
// the postmaster to exit.
func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd, s.done = nil, nil
}
