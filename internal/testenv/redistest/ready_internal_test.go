package redistest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadinessChecksProcessID points a server whose process never listens
// (a script that just sleeps) at the port of a running redis-server: the
// PONG comes from that other process, and start must say so instead of
// reporting the server ready.
func TestReadinessChecksProcessID(t *testing.T) {
	other := Start(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "not-redis")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Server{tb: t, bin: bin, dir: dir, port: other.Port()}
	t.Cleanup(s.cleanup)
	err := s.start()
	if err == nil || !strings.Contains(err.Error(), "held by another redis-server") {
		t.Fatalf("start with another redis-server on the port = %v; want a foreign-server error", err)
	}
	t.Log(err)
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		t.Error("start left its own process running after refusing the port")
	}
	if got, err := other.Do("PING"); err != nil || got != "PONG" {
		t.Errorf("the other server after the refused start: PING = %q, %v; want it untouched", got, err)
	}
}
