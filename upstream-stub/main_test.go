package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// waitAddrFile waits for the -addr-file of a starting server and returns the
// address in it.
func waitAddrFile(t *testing.T, path string, exited <-chan struct{}) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			return strings.TrimSpace(string(b))
		}
		select {
		case <-exited:
			t.Fatal("the server exited before it wrote its address")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address in %s after 10s: %v", path, err)
		}
	}
}

func TestRunUsage(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"help", []string{"-h"}, 0, "-listen", ""},
		{"unknown flag", []string{"-nope"}, 2, "", "flag provided but not defined: -nope"},
		{"extra argument", []string{"serve"}, 2, "", `unexpected arguments: ["serve"]`},
		{"bad shutdown timeout", []string{"-shutdown-timeout", "0s"}, 2, "", "-shutdown-timeout must be positive"},
		{"bad log level", []string{"-log-level", "LOUD"}, 2, "", "-log-level"},
		{"bad log format", []string{"-log-format", "xml"}, 2, "", `-log-format: "xml" is not json or text`},
		{"unwritable pid file", []string{"-listen", "127.0.0.1:0", "-pid-file", filepath.Join(t.TempDir(), "missing", "pid")}, 1, "", "write pid file:"},
		{"bad listen address", []string{"-listen", "127.0.0.1:bad"}, 1, "", "listen:"},
		{"unwritable addr file", []string{"-listen", "127.0.0.1:0", "-addr-file", filepath.Join(t.TempDir(), "missing", "addr")}, 1, "", "write addr file:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			if got := run(ctx, tt.args, &stdout, &stderr); got != tt.wantCode {
				t.Errorf("run(%q) = %d, want %d; stderr:\n%s", tt.args, got, tt.wantCode, &stderr)
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", &stdout, tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", &stderr, tt.wantStderr)
			}
		})
	}
}

func TestRunServesUntilCanceled(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := make(chan int, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		code <- run(ctx, []string{"-listen", "127.0.0.1:0", "-addr-file", addrFile}, &stdout, &stderr)
	}()
	addr := waitAddrFile(t, addrFile, exited)

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", resp.StatusCode)
	}

	cancel()
	select {
	case got := <-code:
		if got != 0 {
			t.Errorf("run = %d, want 0; stderr:\n%s", got, &stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return 10s after its context was canceled")
	}
	// JSON lines, as idemproxy's: the two share a terminal.
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		msgs = append(msgs, m["msg"].(string))
		if m["msg"] == "upstream-stub listening" && m["addr"] != addr {
			t.Errorf("listening line = %s, want addr %s", line, addr)
		}
		if m["msg"] == "upstream-stub shutting down" && m["timeout"] != "10s" {
			t.Errorf("shutting down line = %s, want the timeout as 10s", line)
		}
	}
	if want := []string{"upstream-stub listening", "upstream-stub shutting down", "upstream-stub stopped"}; !slices.Equal(msgs, want) {
		t.Errorf("log messages = %q, want %q", msgs, want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", &stdout)
	}
}
