package config

import (
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testpki"
)

// TestRedisClientTLS: the store's TLS configuration is built where it is
// validated: nil without tls, TLS 1.2 or later on the system's roots with
// it, and tls_ca_file's CAs instead when set; a file the store could not
// use is an error naming the field.
func TestRedisClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "redis CA")
	caFile := testpki.WriteFile(t, dir, "ca.pem", ca.PEM)
	notPEM := testpki.WriteFile(t, dir, "not.pem", []byte("not a certificate"))
	tests := []struct {
		name    string
		redis   Redis
		wantNil bool
		wantCA  bool
		wantErr string
	}{
		{name: "no tls", redis: Redis{}, wantNil: true},
		{name: "tls, system roots", redis: Redis{TLS: true}},
		{name: "tls, private CA", redis: Redis{TLS: true, TLSCAFile: caFile}, wantCA: true},
		{name: "CA file without a certificate", redis: Redis{TLS: true, TLSCAFile: notPEM}, wantErr: "store.redis.tls_ca_file: no PEM certificate in " + notPEM},
		{name: "CA file missing", redis: Redis{TLS: true, TLSCAFile: filepath.Join(dir, "missing.pem")}, wantErr: "store.redis.tls_ca_file: open "},
		{name: "CA file without tls", redis: Redis{TLSCAFile: caFile}, wantErr: "store.redis.tls_ca_file: needs tls: true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.redis.ClientTLS()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("ClientTLS() = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ClientTLS(): %v", err)
			}
			if (c == nil) != tt.wantNil {
				t.Fatalf("ClientTLS() = %v, want nil: %v", c, tt.wantNil)
			}
			if c == nil {
				return
			}
			if c.MinVersion != tls.VersionTLS12 {
				t.Errorf("MinVersion = %x, want TLS 1.2", c.MinVersion)
			}
			if got := c.RootCAs != nil && c.RootCAs.Equal(poolOf(t, ca.PEM)); got != tt.wantCA {
				t.Errorf("RootCAs is the private CA: %v, want %v", got, tt.wantCA)
			}
			if !tt.wantCA && c.RootCAs != nil {
				t.Errorf("RootCAs set without tls_ca_file, want the system's roots (nil)")
			}
		})
	}
}
