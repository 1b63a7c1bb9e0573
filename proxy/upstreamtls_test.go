package proxy_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/internal/testenv/testpki"
	"github.com/idemproxy/idemproxy/store"
)

// tlsUpstream starts an https upstream whose certificate, for pay.internal
// and 127.0.0.1, is signed by ca; with clientCA set it asks for a client
// certificate signed by it; maxVersion 0 means TLS 1.3. It counts the requests it serves.
func tlsUpstream(t *testing.T, ca, clientCA *testpki.CA, maxVersion uint16) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"charged": true}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshakes are the point
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "pay.internal", "127.0.0.1").TLS}, MaxVersion: maxVersion}
	if clientCA != nil {
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		srv.TLS.ClientCAs = x509.NewCertPool()
		srv.TLS.ClientCAs.AppendCertsFromPEM(clientCA.PEM)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &hits
}

// TestUpstreamTLS: an https upstream signed by a private CA is reached with
// upstream_tls.ca_file (and a client certificate when it asks for one);
// without the CA, with another CA, under a name its certificate does not
// hold, or without the client certificate the upstream wants, the TLS
// handshake fails before the request is read: 502 upstream-unreachable,
// and the key is released, so the retry is charged once the configuration
// is fixed. (With TLS 1.3 the upstream refuses a client certificate only
// after the proxy has written the request: that refusal, a TLS alert, is
// still "not sent", never in doubt.)
func TestUpstreamTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, otherCA, clientCA := testpki.NewCA(t, "payments CA"), testpki.NewCA(t, "someone else's CA"), testpki.NewCA(t, "clients CA")
	caFile := testpki.WriteFile(t, dir, "ca.pem", ca.PEM)
	otherFile := testpki.WriteFile(t, dir, "other.pem", otherCA.PEM)
	client := clientCA.Client(t, "idemproxy")
	certFile := testpki.WriteFile(t, dir, "client.pem", client.CertPEM)
	keyFile := testpki.WriteFile(t, dir, "client.key", client.KeyPEM)
	stranger := otherCA.Client(t, "stranger")
	otherCert := testpki.WriteFile(t, dir, "stranger.pem", stranger.CertPEM)
	otherKey := testpki.WriteFile(t, dir, "stranger.key", stranger.KeyPEM)
	tests := []struct {
		name    string
		section string // upstream_tls, "" for none
		mtls    bool   // the upstream asks for a client certificate
		tls12   bool   // the upstream speaks TLS 1.2 at most
		want    int    // status
	}{
		{"private CA", "{ca_file: " + caFile + "}", false, false, http.StatusCreated},
		{"private CA and its name", "{ca_file: " + caFile + ", server_name: pay.internal}", false, false, http.StatusCreated},
		{"private CA and TLS 1.3", "{ca_file: " + caFile + `, min_version: "1.3"}`, false, false, http.StatusCreated},
		{"mutual TLS, TLS 1.2", fmt.Sprintf("{ca_file: %s, cert_file: %s, key_file: %s}", caFile, certFile, keyFile), true, true, http.StatusCreated},
		{"mutual TLS", fmt.Sprintf("{ca_file: %s, cert_file: %s, key_file: %s}", caFile, certFile, keyFile), true, false, http.StatusCreated},
		{"system roots only", "", false, false, http.StatusBadGateway},
		{"mutual TLS with a certificate the upstream does not trust", fmt.Sprintf("{ca_file: %s, cert_file: %s, key_file: %s}", caFile, otherCert, otherKey), true, false, http.StatusBadGateway},
		{"mutual TLS without a client certificate", "{ca_file: " + caFile + "}", true, false, http.StatusBadGateway},
		{"mutual TLS, TLS 1.2, without a client certificate", "{ca_file: " + caFile + "}", true, true, http.StatusBadGateway},
		{"server name only", "{server_name: pay.internal}", false, false, http.StatusBadGateway},
		{"another CA", "{ca_file: " + otherFile + "}", false, false, http.StatusBadGateway},
		{"a name the certificate does not hold", "{ca_file: " + caFile + ", server_name: pay.example}", false, false, http.StatusBadGateway},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var up *httptest.Server
			var hits *atomic.Int64
			var clients *testpki.CA
			var maxVersion uint16
			if tt.mtls {
				clients = clientCA
			}
			if tt.tls12 {
				maxVersion = tls.VersionTLS12
			}
			up, hits = tlsUpstream(t, ca, clients, maxVersion)
			y := "listen: 127.0.0.1:0\nupstream: " + up.URL + "\n"
			if tt.section != "" {
				y += "upstream_tls: " + tt.section + "\n"
			}
			cfg, err := config.Parse([]byte(y + "store: {badger: {dir: unused}}\nroutes:\n" + chargesByOrder))
			if err != nil {
				t.Fatal(err)
			}
			e := &proxytest.Env{T: t}
			e.StartConfig(cfg)
			order := fmt.Sprintf("ORD-TLS-%d", i)
			first := e.Charge(`"`+order+`"`, 1)
			if tt.want == http.StatusCreated {
				proxytest.WantStatus(t, "charge", first, http.StatusCreated, "")
				if replay := e.Charge(`"`+order+`"`, 1); !replay.Replayed() || replay.Status != http.StatusCreated {
					t.Errorf("retry = %s, want the answer replayed", replay)
				}
				if got := e.State("charges", "", order); got != store.StateCompleted {
					t.Errorf("key state = %q, want %q", got, store.StateCompleted)
				}
				if got := hits.Load(); got != 1 {
					t.Errorf("upstream served %d requests, want 1", got)
				}
				return
			}
			proxytest.WantStatus(t, "charge", first, http.StatusBadGateway, "upstream-unreachable")
			if got := e.State("charges", "", order); got != "" {
				t.Errorf("key state = %q, want released", got)
			}
			if got := hits.Load(); got != 0 {
				t.Errorf("upstream served %d requests, want none", got)
			}
		})
	}
}
