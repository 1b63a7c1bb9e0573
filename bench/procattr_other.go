//go:build unix && !linux

package main

import "syscall"

// procAttr runs a child as cred (nil: as the run). Outside Linux nothing
// kills the children of a run that dies without stopping them.
func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
