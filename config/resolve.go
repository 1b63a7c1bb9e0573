package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// resolveTimeout bounds HostWarnings' lookup of a host: a resolver that
// does not answer delays -check, and nothing else, by at most this long.
const resolveTimeout = 2 * time.Second

// HostWarnings looks up the host of the upstream (the reconcile lookups
// go to it too) and returns a warning for one that does not resolve, or
// does not within resolveTimeout: "upstream: host "pay.internal" does not
// resolve: ...". A warning, not a problem of the file: DNS in a container
// may come later than the proxy, whose requests to the upstream fail
// until the name resolves. An IP address is not looked up; nil r is the
// default resolver.
func (c *Config) HostWarnings(ctx context.Context, r *net.Resolver) []string {
	u, err := url.Parse(c.Upstream)
	if err != nil || u.Hostname() == "" || net.ParseIP(u.Hostname()) != nil {
		return nil
	}
	if r == nil {
		r = net.DefaultResolver
	}
	host := u.Hostname()
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	_, err = r.LookupHost(ctx, host)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return []string{fmt.Sprintf("upstream: host %q did not resolve within %s; requests to the upstream fail until it does", host, resolveTimeout)}
	}
	why := err.Error()
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		why = dnsErr.Err // "no such host", without the resolver's address
	}
	return []string{fmt.Sprintf("upstream: host %q does not resolve (%s); requests to the upstream fail until it does", host, why)}
}

// isTimeout reports whether err is a lookup that timed out.
func isTimeout(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && dnsErr.IsTimeout
}
