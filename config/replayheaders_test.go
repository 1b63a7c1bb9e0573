package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestReplayHeadersRefuseCredentials: a header that carries a credential,
// a session or the client's scope, or that belongs to one connection, is
// refused in replay_headers in any letter case, naming its field; replaying
// it would hand one client's credentials to another.
func TestReplayHeadersRefuseCredentials(t *testing.T) {
	refused := []string{
		// The issue's, and their spellings.
		"Authorization", "authorization", "AUTHORIZATION", "aUtHoRiZaTiOn",
		"Proxy-Authorization", "proxy-authorization", "Cookie", "COOKIE", "Set-Cookie", "set-cookie",
		"Set-Cookie2", "Cookie2",
		// Authentication exchanges.
		"WWW-Authenticate", "www-authenticate", "Proxy-Authenticate", "Authentication-Info",
		"Proxy-Authentication-Info", "DPoP", "DPoP-Nonce",
		// API keys, tokens, sessions, CSRF.
		"X-Api-Key", "x-api-key", "Api-Key", "X-API-KEY", "X-Apikey", "Apikey", "X-Auth-Token", "X-Access-Token",
		"X-Refresh-Token", "X-Id-Token", "X-Csrf-Token", "X-Xsrf-Token", "X-CSRFToken", "Csrf-Token",
		"X-Session-Id", "X-Session-Token", "Session-Id", "X-Amz-Security-Token", "X-Vault-Token",
		"X-Client-Secret", "X-Password", "X-Goog-Iap-Jwt-Assertion", "X-Amzn-Oidc-Accesstoken",
		"X-Amzn-Oidc-Data", "X-Ms-Client-Principal", "X-Ms-Token-Aad-Access-Token", "X-Access-Key",
		"X-Credentials", "X-Bearer", "X_Api_Key", "x_auth_token", "Oauth-Token", "X-Oauth-Scopes",
		// Client certificates forwarded by a TLS terminator.
		"X-Forwarded-Client-Cert", "x-forwarded-client-cert", "Client-Cert", "Client-Cert-Chain",
		"X-Ssl-Client-Cert", "X-Client-Verify", "X-Ssl-Client-Dn",
		// Hop-by-hop and framing.
		"Connection", "keep-alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
		"HTTP2-Settings", "Content-Length", "Idempotent-Replayed", "idempotent-reconciled",
	}
	for _, h := range refused {
		t.Run(h, func(t *testing.T) {
			probs := problemsOf(t, withRoute(fmt.Sprintf("    replay_headers: [Content-Type, %q]\n", h)))
			want := "routes[0].replay_headers[1]: "
			if len(probs) != 1 || !strings.HasPrefix(probs[0], want) || !strings.Contains(probs[0], "is never replayed: ") {
				t.Errorf("problems = %q, want one starting with %q that says it is never replayed", probs, want)
			}
		})
	}
}

// TestReplayHeadersRefuseScopeHeader: the header a route keys its clients
// by is theirs, in any letter case, whatever its name.
func TestReplayHeadersRefuseScopeHeader(t *testing.T) {
	for _, h := range []string{"X-Tenant", "x-tenant", "X-TENANT"} {
		probs := problemsOf(t, withRoute("    scope: {header: X-Tenant}\n    replay_headers: [Location, "+h+"]\n"))
		want := "routes[0].replay_headers[1]: X-Tenant is never replayed: it is the route's scope.header"
		if len(probs) != 1 || !strings.HasPrefix(probs[0], want) {
			t.Errorf("%s: problems = %q, want one starting with %q", h, probs, want)
		}
	}
	// Without the scope it is an ordinary header.
	mustParse(t, withRoute("    replay_headers: [X-Tenant]\n"))
}

// TestReplayHeadersAllowed: ordinary answer headers are still accepted,
// the defaults among them; the credential words do not catch them.
func TestReplayHeadersAllowed(t *testing.T) {
	allowed := append([]string{"X-Request-Id", "Retry-After", "Vary", "X-Ratelimit-Remaining",
		"Content-Security-Policy", "Strict-Transport-Security", "Idempotency-Key", "X-Charge-Id",
		"Content-Disposition", "Expires", "Age", "Date", "Server", "X-Correlation-Id"}, defaultReplayHeaders...)
	for _, h := range allowed {
		if why := ReplayRefusal(h, ""); why != "" {
			t.Errorf("ReplayRefusal(%q) = %q, want it allowed", h, why)
		}
	}
	mustParse(t, withRoute("    replay_headers: ["+strings.Join(allowed, ", ")+"]\n"))
}

// TestReplayRefusalDoesNotAllocate: the proxy checks every header it
// replays, so the check must stay off the allocator.
func TestReplayRefusalDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		ReplayRefusal("Content-Type", "X-Tenant")
		ReplayRefusal("X-Api-Key", "")
	}); n != 0 {
		t.Errorf("ReplayRefusal allocates %v times a call, want 0", n)
	}
}
