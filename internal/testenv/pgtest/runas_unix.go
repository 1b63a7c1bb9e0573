//go:build unix

package pgtest

import (
	"os/exec"
	"syscall"
)

// runAs is the user the server's processes run as.
type runAs = syscall.Credential

// setRunAs makes cmd run as c.
func setRunAs(cmd *exec.Cmd, c *runAs) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = c
}
