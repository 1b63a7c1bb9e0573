package config

import (
	"crypto/tls"
	"crypto/x509"
	"os"
)

// ClientTLS reads tls_ca_file and returns the TLS configuration of the
// connections to Redis: nil without tls, else TLS 1.2 or later, verified
// against tls_ca_file's certificates when it is set and the system's roots
// otherwise. Its error names the field at fault. Validation reads the file
// the same way, so that a file -check accepts is one the store opens with.
func (r *Redis) ClientTLS() (*tls.Config, error) {
	var p problems
	c := r.loadTLS(&p)
	if len(p) > 0 {
		return nil, &validationError{Problems: p}
	}
	return c, nil
}

// loadTLS builds the TLS configuration of r, adding a problem for each
// field at fault.
func (r *Redis) loadTLS(p *problems) *tls.Config {
	const f = "store.redis.tls_ca_file"
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.TLSCAFile != "" {
		if !r.TLS {
			p.add(f, "needs tls: true")
		}
		if pem, err := os.ReadFile(r.TLSCAFile); err != nil {
			p.add(f, "%v", err)
		} else if c.RootCAs = x509.NewCertPool(); !c.RootCAs.AppendCertsFromPEM(pem) {
			p.add(f, "no PEM certificate in %s", r.TLSCAFile)
		}
	}
	if !r.TLS {
		return nil
	}
	return c
}
