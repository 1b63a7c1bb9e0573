//go:build !unix

package pgtest

import "os/exec"

// runAs is the user the server's processes run as. Off Unix (Windows)
// there is no root to step down from: credential returns nil (Geteuid is
// -1), and the server runs as the current user.
type runAs struct{ Uid, Gid uint32 }

// setRunAs is never called off Unix: there is no user to run as (runAs).
func setRunAs(*exec.Cmd, *runAs) {}
