package testrun

import (
	"os/exec"
	"syscall"
)

func setProcAttr(cmd *exec.Cmd) {
	setPgid(cmd)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
