package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testpki"
)

// httpsRoute is a valid configuration with an https upstream and the
// given upstream_tls section (indented under it).
func httpsRoute(tlsSection string) string {
	return "listen: 127.0.0.1:8080\nupstream: https://pay.internal:8443\nupstream_tls:\n" + tlsSection +
		"routes:\n  - name: charges\n    match: POST /charges\n    key: {json: orderId}\n"
}

// TestUpstreamTLSValid: the files are read, the private CA replaces the
// system's roots, and the name, client certificate and version are set.
func TestUpstreamTLSValid(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "private CA")
	client := ca.Client(t, "idemproxy")
	caFile := testpki.WriteFile(t, dir, "ca.pem", ca.PEM)
	certFile := testpki.WriteFile(t, dir, "client.pem", client.CertPEM)
	keyFile := testpki.WriteFile(t, dir, "client.key", client.KeyPEM)
	c := mustParse(t, httpsRoute(fmt.Sprintf("  ca_file: %s\n  server_name: pay.example\n  cert_file: %s\n  key_file: %s\n  min_version: \"1.3\"\n",
		caFile, certFile, keyFile)))
	tc, err := c.UpstreamTLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if tc.ServerName != "pay.example" || tc.MinVersion != tls.VersionTLS13 || len(tc.Certificates) != 1 {
		t.Errorf("ClientConfig = server name %q, min version %x, %d certificates; want pay.example, TLS 1.3, 1",
			tc.ServerName, tc.MinVersion, len(tc.Certificates))
	}
	if tc.RootCAs == nil || !tc.RootCAs.Equal(poolOf(t, ca.PEM)) {
		t.Errorf("RootCAs is not exactly the private CA")
	}
	// Nothing set: Go's defaults, the system's roots.
	if tc, err := mustParse(t, withRoute("")).UpstreamTLS.ClientConfig(); err != nil || tc != nil {
		t.Errorf("no upstream_tls: ClientConfig = %v, %v; want nil, nil", tc, err)
	}
	// Only a server name, with the system's roots and TLS 1.2 at least.
	tc, err = mustParse(t, httpsRoute("  server_name: pay.example\n")).UpstreamTLS.ClientConfig()
	if err != nil || tc.RootCAs != nil || tc.MinVersion != tls.VersionTLS12 {
		t.Errorf("server_name only: ClientConfig = %+v, %v; want the system's roots and TLS 1.2", tc, err)
	}
}

// TestUpstreamTLSProblems: a file that cannot be read, holds no
// certificate, or a key that is not the certificate's fails -check naming
// the field, each problem reported with the others.
func TestUpstreamTLSProblems(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "private CA")
	client, other := ca.Client(t, "idemproxy"), ca.Client(t, "someone else")
	caFile := testpki.WriteFile(t, dir, "ca.pem", ca.PEM)
	certFile := testpki.WriteFile(t, dir, "client.pem", client.CertPEM)
	keyFile := testpki.WriteFile(t, dir, "client.key", client.KeyPEM)
	otherKey := testpki.WriteFile(t, dir, "other.key", other.KeyPEM)
	garbage := testpki.WriteFile(t, dir, "garbage.pem", []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name, section string
		want          []string
	}{
		{"missing ca_file", "  ca_file: " + missing + "\n", []string{"upstream_tls.ca_file: open " + missing}},
		{"ca_file without a certificate", "  ca_file: " + garbage + "\n", []string{"upstream_tls.ca_file: no PEM certificate in " + garbage}},
		{"ca_file holding a key only", "  ca_file: " + keyFile + "\n", []string{"upstream_tls.ca_file: no PEM certificate"}},
		{"cert_file without key_file", "  cert_file: " + certFile + "\n", []string{"upstream_tls.key_file: required with cert_file"}},
		{"key_file without cert_file", "  key_file: " + keyFile + "\n", []string{"upstream_tls.cert_file: required with key_file"}},
		{"key of another certificate", "  cert_file: " + certFile + "\n  key_file: " + otherKey + "\n",
			[]string{"upstream_tls.key_file: " + otherKey + " does not hold the private key of cert_file"}},
		{"key and certificate swapped", "  cert_file: " + keyFile + "\n  key_file: " + certFile + "\n",
			[]string{"upstream_tls.cert_file: no PEM certificate in " + keyFile}},
		{"missing cert_file", "  cert_file: " + missing + "\n  key_file: " + keyFile + "\n", []string{"upstream_tls.cert_file: open " + missing}},
		{"missing key_file", "  cert_file: " + certFile + "\n  key_file: " + missing + "\n", []string{"upstream_tls.key_file: open " + missing}},
		{"old version", "  min_version: \"1.1\"\n", []string{`upstream_tls.min_version: "1.1" is not 1.2 or 1.3`}},
		{"every problem at once", "  ca_file: " + garbage + "\n  cert_file: " + certFile + "\n  key_file: " + otherKey + "\n  min_version: \"1.0\"\n",
			[]string{"upstream_tls.ca_file:", "upstream_tls.key_file:", "upstream_tls.min_version:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probs := problemsOf(t, httpsRoute(tt.section))
			if len(probs) != len(tt.want) {
				t.Errorf("problems = %q, want %d", probs, len(tt.want))
			}
			for _, w := range tt.want {
				found := false
				for _, p := range probs {
					found = found || strings.HasPrefix(p, w)
				}
				if !found {
					t.Errorf("problems %q\nhave none starting with %q", probs, w)
				}
			}
		})
	}
	// The same section on a plain http upstream would never be used.
	probs := problemsOf(t, strings.Replace(httpsRoute("  ca_file: "+caFile+"\n"), "https://", "http://", 1))
	if len(probs) != 1 || !strings.HasPrefix(probs[0], `upstream_tls: set, but upstream "http://pay.internal:8443" is plain http`) {
		t.Errorf("http upstream: problems = %q", probs)
	}
}

func poolOf(t *testing.T, pem []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate")
	}
	return p
}
