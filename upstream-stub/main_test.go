package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
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
	for _, want := range []string{"msg=listening addr=" + addr, "msg=stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log does not contain %q:\n%s", want, &stderr)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", &stdout)
	}
}
