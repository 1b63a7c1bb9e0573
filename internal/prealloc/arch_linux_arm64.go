package prealloc

import "golang.org/x/sys/unix"

// auditArch and sysFtruncate identify ftruncate in the filter.
const (
	auditArch    = unix.AUDIT_ARCH_AARCH64
	sysFtruncate = unix.SYS_FTRUNCATE
)
