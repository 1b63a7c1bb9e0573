//go:build linux && (amd64 || arm64)

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// badgerDir is writeConfig's dir for a data directory with
// store.badger.preallocate set to mode ("" leaves it out).
func badgerDir(dir, mode string) string {
	if mode == "" {
		return dir
	}
	return dir + "\n    preallocate: " + mode
}

// seccompStatus reads the seccomp lines of /proc/PID/status of a running
// process: whether no_new_privs is set and how many seccomp filters it has.
func seccompStatus(t *testing.T, pid int) (noNewPrivs, filters string) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		switch k {
		case "NoNewPrivs":
			noNewPrivs = strings.TrimSpace(v)
		case "Seccomp_filters":
			filters = strings.TrimSpace(v)
		}
	}
	return noNewPrivs, filters
}

// TestPreallocateModes: store.badger.preallocate auto and required install
// the supervisor where seccomp is available (this machine, CI), and off
// installs nothing: no seccomp filter and no no_new_privs on the process,
// which says so at start and serves. The test process itself has no
// filter, so the binary's filters are its own.
func TestPreallocateModes(t *testing.T) {
	t.Parallel()
	if nnp, filters := seccompStatus(t, os.Getpid()); nnp != "0" || filters != "0" {
		t.Fatalf("the test process has no_new_privs %s and %s seccomp filters, want none: a child would inherit them", nnp, filters)
	}
	up := startStub(t)
	for _, tc := range []struct {
		mode       string
		installed  bool
		wantActive string
	}{
		{"", true, "1"},
		{"auto", true, "1"},
		{"required", true, "1"},
		{"off", false, "0"},
	} {
		t.Run("preallocate="+tc.mode, func(t *testing.T) {
			dir := t.TempDir()
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, badgerDir(filepath.Join(dir, "data"), tc.mode), "", chargesRoute))
			want := tc.mode
			if want == "" {
				want = "auto"
			}
			if l := p.log.logLines("idemproxy starting"); len(l) != 1 || l[0]["badger_preallocate"] != want {
				t.Errorf("start line's badger_preallocate = %v, want %q", l, want)
			}
			nnp, filters := seccompStatus(t, p.cmd.Process.Pid)
			if got := nnp == "1" && filters == "1"; got != tc.installed {
				t.Errorf("the proxy's NoNewPrivs %s, Seccomp_filters %s; want the supervisor's filter installed: %v", nnp, filters, tc.installed)
			}
			if v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "idemproxy_badger_preallocation_active"); v != tc.wantActive {
				t.Errorf("idemproxy_badger_preallocation_active = %q, want %s", v, tc.wantActive)
			}
			warned := p.log.logLines("files are not preallocated: a disk that fills between two free-space checks can crash the store")
			if tc.installed && len(warned) != 0 {
				t.Errorf("warned that files are not preallocated: %v", warned)
			}
			if !tc.installed && (len(warned) != 1 || warned[0]["reason"] != "store.badger.preallocate is off") {
				t.Errorf("warnings that files are not preallocated = %v, want one saying store.badger.preallocate is off", warned)
			}
			if r := charge(p, "ORD-PREALLOC-"+want); r.status != 201 {
				t.Errorf("charge = %d %s, want 201", r.status, r.body)
			}
		})
	}
}

// TestPreallocateRequiredWithoutSeccomp: where seccomp(2) is refused (a
// container profile), required refuses to start: exit status 1, an error
// naming the field and the reason, nothing served and no store opened;
// auto starts without it (TestSeccompRefused).
func TestPreallocateRequiredWithoutSeccomp(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, badgerDir(data, "required"), "", chargesRoute)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-config", cfg)
	cmd.Env = append(os.Environ(), denySeccompEnv+"="+bin)
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("still running 60 s after start, want it to refuse to start:\n%s", out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit status = %d, want 1\n%s", code, out.String())
	}
	log := &syncBuffer{}
	log.Write([]byte(out.String()))
	failed := log.logLines("idemproxy failed")
	if len(failed) != 1 {
		t.Fatalf("error lines = %v, want one\n%s", failed, out.String())
	}
	e, _ := failed[0]["err"].(string)
	for _, want := range []string{"store.badger.preallocate is required", "operation not permitted"} {
		if !strings.Contains(e, want) {
			t.Errorf("the error %q does not say %q", e, want)
		}
	}
	if l := log.logLines("idemproxy listening"); len(l) != 0 {
		t.Errorf("it listened before refusing: %v", l)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("the data directory exists (%v): the store was opened before refusing", err)
	}
}

// mountBtrfs mounts a fresh btrfs image for the test (as root, with
// btrfs-progs: .ci/run installs it).
func mountBtrfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "btrfs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.btrfs", "-q", "-f", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs (install btrfs-progs): %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount a btrfs image (as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// TestCopyOnWriteWarning: a data directory on btrfs, where fallocate does
// not reserve the space of overwrites, is a warning at start naming the
// file system, whether preallocation is auto or required; with off there
// is nothing to warn about (off warns that nothing is preallocated). The
// proxy serves either way.
//
// It stays serial: its btrfs image is small, and in parallel with the
// tests that fill disks its last store once answered 503
// store-unavailable instead of serving.
func TestCopyOnWriteWarning(t *testing.T) {
	up := startStub(t)
	mnt := mountBtrfs(t)
	const msg = "the data directory is on a copy-on-write file system: preallocation does not reserve the space of overwrites there, and a disk that fills can still crash the store"
	for _, tc := range []struct {
		mode  string
		warns bool
	}{{"auto", true}, {"required", true}, {"off", false}} {
		t.Run(tc.mode, func(t *testing.T) {
			dir := t.TempDir()
			// Not created yet: the warning looks at the parent.
			data := filepath.Join(mnt, tc.mode, "data")
			p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, badgerDir(data, tc.mode), "", chargesRoute))
			l := p.log.logLines(msg)
			switch {
			case tc.warns && (len(l) != 1 || l[0]["fs"] != "btrfs" || l[0]["badger_dir"] != data || l[0]["level"] != "WARN"):
				t.Errorf("copy-on-write warnings = %v, want one WARN naming btrfs and %s", l, data)
			case !tc.warns && len(l) != 0:
				t.Errorf("copy-on-write warnings with preallocate off = %v, want none", l)
			}
			if r := charge(p, "ORD-BTRFS-"+tc.mode); r.status != 201 {
				t.Errorf("charge on btrfs = %d %s, want 201", r.status, r.body)
			}
		})
	}
	// On ext4-like file systems (the test's own directory) nothing is said.
	p := startProxy(t, writeConfig(t, filepath.Join(t.TempDir(), "c.yaml"), up.URL, filepath.Join(t.TempDir(), "data"), "", chargesRoute))
	if l := p.log.logLines(msg); len(l) != 0 {
		t.Errorf("copy-on-write warnings off btrfs: %v", l)
	}
}
