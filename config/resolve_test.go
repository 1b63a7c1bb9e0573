package config

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
)

// TestHostWarnings: an upstream whose host does not resolve is a warning,
// never a problem of the file (the file still loads); a host that
// resolves, and an IP address, which is not looked up, are none. The
// names are real: .invalid never resolves (RFC 6761), localhost always.
func TestHostWarnings(t *testing.T) {
	tests := []struct {
		name     string
		upstream string
		want     string // the warning's start; "" for none
	}{
		{"a name that never resolves", "http://nonexistent.invalid:9000", `upstream: host "nonexistent.invalid" does not resolve (`},
		{"with a path and https", "https://pay.nonexistent.invalid/api", `upstream: host "pay.nonexistent.invalid" does not resolve (`},
		{"localhost", "http://localhost:9000", ""},
		{"an IPv4 address", "http://127.0.0.1:9000", ""},
		{"an IPv6 address", "http://[::1]:9000", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := withUpstream(t, tt.upstream).HostWarnings(context.Background(), nil)
			switch {
			case tt.want == "" && len(got) != 0:
				t.Errorf("warnings = %q, want none", got)
			case tt.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tt.want) ||
				!strings.HasSuffix(got[0], "); requests to the upstream fail until it does")):
				t.Errorf("warnings = %q, want one starting %q", got, tt.want)
			}
		})
	}
}

func withUpstream(t *testing.T, upstream string) *Config {
	t.Helper()
	return mustParse(t, "listen: 127.0.0.1:8080\nupstream: "+upstream+"\nroutes:\n  - name: a\n    match: POST /a\n    key: {json: id}\n")
}

// TestHostWarningsBounded: a resolver that never answers delays the
// warning by resolveTimeout, not by its own retries; the warning says so.
// The resolver is a real UDP socket that reads the queries and drops them.
func TestHostWarningsBounded(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	silent := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	got := withUpstream(t, "http://pay.example:9000").HostWarnings(context.Background(), silent)
	want := []string{`upstream: host "pay.example" did not resolve within 2s; requests to the upstream fail until it does`}
	if !slices.Equal(got, want) {
		t.Errorf("warnings = %q\nwant       %q", got, want)
	}
}
