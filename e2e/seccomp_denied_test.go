//go:build linux && (amd64 || arm64)

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// denySeccompEnv names the binary the test binary runs, as a launcher,
// under a seccomp filter that refuses seccomp(2) with EPERM: a container
// whose profile refuses the proxy its own filter.
const denySeccompEnv = "IDEMPROXY_TEST_EXEC_WITHOUT_SECCOMP"

func init() {
	path := os.Getenv(denySeccompEnv)
	if path == "" {
		return
	}
	// The filter is installed on this thread, which then execs.
	runtime.LockOSThread()
	arch := uint32(unix.AUDIT_ARCH_X86_64)
	if runtime.GOARCH == "arm64" {
		arch = unix.AUDIT_ARCH_AARCH64
	}
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: arch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_SECCOMP},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		panic(err)
	}
	env := []string{}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, denySeccompEnv+"=") {
			env = append(env, e)
		}
	}
	panic(syscall.Exec(path, append([]string{path}, os.Args[1:]...), env))
}

// TestSeccompRefused: where seccomp(2) is refused (a container profile),
// the proxy does not preallocate but runs as before: it says so once at
// start, idemproxy_badger_preallocation_active is 0, and it serves.
func TestSeccompRefused(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := startCmd(t, exec.Command(self, "-config", cfg), denySeccompEnv+"="+bin)
	if l := p.log.logLines("files are not preallocated: a disk that fills between two free-space checks can crash the store"); len(l) != 1 {
		t.Errorf("warnings that files are not preallocated: %d, want 1\n%s", len(l), p.log)
	} else if e, _ := l[0]["err"].(string); !strings.Contains(e, "operation not permitted") {
		t.Errorf("the warning's err = %q, want it to say seccomp was not permitted", e)
	}
	if r := charge(p, "ORD-NOSECCOMP"); r.status != 201 {
		t.Errorf("charge without seccomp = %d %s, want 201", r.status, r.body)
	}
	if v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "idemproxy_badger_preallocation_active"); v != "0" {
		t.Errorf("idemproxy_badger_preallocation_active = %q, want 0", v)
	}
}

// TestPreallocationActive: with seccomp available (this machine, CI), the
// proxy preallocates and says so.
func TestPreallocationActive(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	if l := p.log.logLines("files grown with ftruncate are preallocated: a full disk is an error, not a crash"); len(l) != 1 {
		t.Errorf("start-up lines saying files are preallocated: %d, want 1\n%s", len(l), p.log)
	}
	if v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "idemproxy_badger_preallocation_active"); v != "1" {
		t.Errorf("idemproxy_badger_preallocation_active = %q, want 1", v)
	}
}
