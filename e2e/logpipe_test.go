package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/app/logsink"
)

// TestLogReaderGoneDoesNotKill: a proxy whose log reader goes away (the
// read end of its stderr pipe closed: a log shipper that died, a "| tee"
// that was stopped) keeps serving. A write to a broken pipe on stderr
// kills a Go program with SIGPIPE unless it handles the signal, which
// would cut every request in flight and leave their keys in doubt.
func TestLogReaderGoneDoesNotKill(t *testing.T) {
	t.Parallel()
	up := startStub(t)
	dir := t.TempDir()
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	p := &proc{t: t, cmd: cmd, exited: exited}
	sc := bufio.NewScanner(r)
	for p.addr == "" && sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "idemproxy listening" {
			p.addr = m["addr"].(string)
		}
	}
	if p.addr == "" {
		t.Fatalf("idemproxy did not listen: %v", sc.Err())
	}
	r.Close() // the log reader goes away

	for i, order := range []string{"ORD-P1", "ORD-P1", "ORD-P2"} {
		res := charge(p, order)
		if res.err != nil || (res.status != 201 && res.status != 200) {
			t.Fatalf("charge %d after the log reader went away: %v %d", i, res.err, res.status)
		}
		time.Sleep(2 * logsink.AccessFlushDelay) // the access line is written
	}
	select {
	case <-exited:
		t.Fatalf("idemproxy died when its log could not be written: %v", cmd.ProcessState)
	default:
	}
	if got := chargeCount(t, up.URL, "ORD-P1"); got != 1 {
		t.Errorf("ORD-P1 charged %d times, want 1", got)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("idemproxy did not exit within 30s of SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit status %d (%v), want 0", code, cmd.ProcessState)
	}
}
