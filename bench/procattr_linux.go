package main

import "syscall"

// procAttr runs a child as cred (nil: as the run), killed by the kernel
// if the run dies without stopping it.
func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
}
