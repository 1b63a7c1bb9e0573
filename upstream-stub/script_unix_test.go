//go:build unix

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopFromAScript: started with go run in the background of a shell
// script, as the README's set-up command does, the stub stops on the
// README's kill $(cat PID-FILE), although $! and %1 there name the go
// command, whose death would leave the stub running.
func TestStopFromAScript(t *testing.T) {
	dir := t.TempDir()
	pidFile, addrFile, logFile := filepath.Join(dir, "stub.pid"), filepath.Join(dir, "addr"), filepath.Join(dir, "log")
	script := `set -e
go run ./upstream-stub -listen 127.0.0.1:0 -pid-file "$PIDF" -addr-file "$ADDRF" 2>"$LOGF" &
i=0; while [ ! -s "$ADDRF" ]; do i=$((i+1)); [ $i -lt 1200 ]; sleep 0.1; done
cat "$PIDF" > "$PIDF.seen"
kill $(cat "$PIDF")
wait
`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Dir = ".." // the module's root, as in the README
	cmd.Env = append(os.Environ(), "PIDF="+pidFile, "ADDRF="+addrFile, "LOGF="+logFile)
	out, err := cmd.CombinedOutput()
	log, _ := os.ReadFile(logFile)
	if err != nil {
		t.Fatalf("script: %v\n%s\nstub log:\n%s", err, out, log)
	}
	seen, err := os.ReadFile(pidFile + ".seen")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(seen)))
	if err != nil {
		t.Fatalf("pid file held %q: %v", seen, err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the stub (pid %d) still runs after the script's kill", pid)
	}
	if !strings.Contains(string(log), `"msg":"upstream-stub stopped"`) {
		t.Errorf("the stub did not stop cleanly:\n%s", log)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("pid file after a clean stop: %v, want it removed", err)
	}
}
