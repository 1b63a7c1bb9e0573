//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestFullDisk runs the binary on a small, nearly full file system (a
// tmpfs): it starts instead of crash-looping, is not ready, answers
// protected requests 503 store-unavailable without forwarding them, and
// serves once space is back, without a restart.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	// Room for Badger's files once the filler is gone (they take about
	// 52 MiB, allocated when space comes back) above the 32 MiB floor:
	// on a 64 MiB disk the store would stay below its floor.
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 104<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: "+strconv.Itoa(32<<20), chargesRoute)
	p := startProxy(t, cfg)

	if r := do("GET", p.adminURL("/readyz"), ""); r.status != 503 {
		t.Errorf("/readyz on a full disk = %d %s, want 503", r.status, r.body)
	}
	r := do("POST", p.url("/charges"), `{"orderId": "ORD-FULL", "amount": 1}`)
	if r.status != 503 || problemType(r) != "store-unavailable" {
		t.Errorf("charge on a full disk = %d %s, want 503 store-unavailable", r.status, r.body)
	}
	if s := do("GET", up.URL+"/orders/ORD-FULL/charges", ""); s.body == "" || s.status != 200 || strings.Contains(s.body, `"charges":1`) {
		t.Errorf("the stub was charged on a full disk: %s", s.body)
	}
	if v, _ := metricValue(do("GET", p.adminURL("/metrics"), "").body, "idemproxy_badger_low_disk_refusals_total"); v == "0" || v == "" {
		t.Errorf("idemproxy_badger_low_disk_refusals_total = %q, want > 0", v)
	}

	os.Remove(filler)
	eventually(t, "ready once space is back", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if r := do("POST", p.url("/charges"), `{"orderId": "ORD-FULL", "amount": 1}`); r.status != 201 {
		t.Errorf("charge once space is back = %d %s, want 201", r.status, r.body)
	}
	select {
	case <-p.exited:
		t.Fatalf("idemproxy exited: %v\n%s", p.exitErr, p.log)
	default:
	}
}

// TestReadyzBadgerBelowFloor: a disk that fills past
// store.badger.min_free_bytes while the proxy runs makes /readyz 503 with
// the reason within a few seconds, though no request has come (the write
// probe finds it), and ready again once there is room.
func TestReadyzBadgerBelowFloor(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount a tmpfs (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(mnt, "data"),
		"    min_free_bytes: "+strconv.Itoa(32<<20), chargesRoute))
	if r := charge(p, "ORD-FLOOR-1"); r.status != 201 {
		t.Fatalf("charge with room = %d %s", r.status, r.body)
	}
	eventually(t, "ready with room", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })

	// Fill the disk to 16 MiB free, a MiB at a time.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		if st.Bavail*uint64(st.Bsize) < 16<<20 {
			break
		}
		if _, err := f.Write(make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var r result
	eventually(t, "/readyz 503 below the floor", func() bool {
		r = do("GET", p.adminURL("/readyz"), "")
		return r.status == 503
	})
	if !strings.Contains(r.body, "store unavailable: ") || !strings.Contains(r.body, "floor") {
		t.Errorf("/readyz below the floor = %q, want the reason", r.body)
	}
	if v := scrapeValue(t, p, "idemproxy_store_writable"); v != 0 {
		t.Errorf("idemproxy_store_writable below the floor = %v, want 0", v)
	}
	if v := scrapeValue(t, p, "idemproxy_badger_low_disk_refusals_total"); v != 0 {
		t.Errorf("idemproxy_badger_low_disk_refusals_total = %v with no request refused, want 0: the probe is not a refused reservation", v)
	}
	os.Remove(filler)
	eventually(t, "ready once space is back", func() bool { return do("GET", p.adminURL("/readyz"), "").status == 200 })
	if r := charge(p, "ORD-FLOOR-2"); r.status != 201 {
		t.Errorf("charge once space is back = %d %s, want 201", r.status, r.body)
	}
}

// TestOpenFilesLimitRaised: started with a low soft limit of open files,
// the binary runs with the hard limit.
func TestOpenFilesLimitRaised(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max <= 256 {
		t.Fatalf("the hard limit %d is too low for this test", lim.Max)
	}
	low := lim
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	up := startStub(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) // the test process itself
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); strings.HasPrefix(line, "Max open files") && len(f) >= 5 {
			if f[3] != strconv.FormatUint(lim.Max, 10) {
				t.Errorf("the proxy runs with a soft limit of %s open files, want the hard limit %d", f[3], lim.Max)
			}
			return
		}
	}
	t.Fatalf("no open files limit in /proc/pid/limits:\n%s", b)
}
