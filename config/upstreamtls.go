package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// tlsVersions are the values of upstream_tls.min_version.
var tlsVersions = map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}

// IsZero reports whether u sets nothing.
func (u UpstreamTLS) IsZero() bool { return u == UpstreamTLS{} }

// ClientConfig reads u's files and returns the TLS configuration of the
// connections to the upstream; nil when u sets nothing (Go's defaults and
// the system's roots). Its error names the field at fault.
func (u UpstreamTLS) ClientConfig() (*tls.Config, error) {
	var p problems
	c := u.load(&p)
	if len(p) > 0 {
		return nil, &validationError{Problems: p}
	}
	return c, nil
}

// load builds the TLS configuration of u, adding a problem for each field
// at fault.
func (u UpstreamTLS) load(p *problems) *tls.Config {
	if u.IsZero() {
		return nil
	}
	const f = "upstream_tls."
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.ServerName}
	if u.MinVersion != "" {
		if v, ok := tlsVersions[u.MinVersion]; ok {
			c.MinVersion = v
		} else {
			p.add(f+"min_version", "%q is not 1.2 or 1.3", u.MinVersion)
		}
	}
	if u.CAFile != "" {
		if pem, err := os.ReadFile(u.CAFile); err != nil {
			p.add(f+"ca_file", "%v", err)
		} else {
			c.RootCAs = x509.NewCertPool()
			if !c.RootCAs.AppendCertsFromPEM(pem) {
				p.add(f+"ca_file", "no PEM certificate in %s", u.CAFile)
			}
		}
	}
	switch {
	case u.CertFile == "" && u.KeyFile == "":
	case u.CertFile == "":
		p.add(f+"cert_file", "required with key_file")
	case u.KeyFile == "":
		p.add(f+"key_file", "required with cert_file")
	default:
		cert, err := loadKeyPair(u.CertFile, u.KeyFile)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
				p.add(f+fe.field, "%v", fe.err)
			} else {
				p.add(f+"key_file", "%v", err)
			}
		} else {
			c.Certificates = []tls.Certificate{cert}
		}
	}
	return c
}

type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }

// loadKeyPair is tls.LoadX509KeyPair, with the file at fault named: an
// unreadable file, or one without its PEM block, is that file's problem;
// a key that does not match the certificate is key_file's.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, &fieldError{"cert_file", err}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, &fieldError{"key_file", err}
	}
	if !x509.NewCertPool().AppendCertsFromPEM(certPEM) {
		return tls.Certificate{}, &fieldError{"cert_file", fmt.Errorf("no PEM certificate in %s", certFile)}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &fieldError{"key_file", fmt.Errorf("%s does not hold the private key of cert_file %s: %w", keyFile, certFile, err)}
	}
	return cert, nil
}
