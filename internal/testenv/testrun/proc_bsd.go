//go:build unix && !linux

package testrun

import "os/exec"

// setProcAttr has no Pdeathsig to set outside Linux.
func setProcAttr(cmd *exec.Cmd) { setPgid(cmd) }
