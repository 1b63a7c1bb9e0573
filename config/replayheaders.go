package config

import (
	"bytes"
	"net/http"
	"strings"
)

// Why a response header is never stored and replayed (ReplayRefusal).
const (
	refusedHopByHop   = "a hop-by-hop header belongs to one connection"
	refusedFraming    = "the proxy sets it on every answer itself"
	refusedCredential = "it carries credentials or a session: a replay would hand one client's to another"
)

// neverReplayed are the header names (canonical form) a replay must never
// carry, with the reason.
var neverReplayed = map[string]string{
	// Hop-by-hop (RFC 9110 section 7.6.1), and the ones HTTP/1.0 and
	// proxies used.
	"Connection": refusedHopByHop, "Keep-Alive": refusedHopByHop, "Proxy-Connection": refusedHopByHop,
	"Te": refusedHopByHop, "Trailer": refusedHopByHop, "Transfer-Encoding": refusedHopByHop,
	"Upgrade": refusedHopByHop, "Http2-Settings": refusedHopByHop,
	// Framing and the proxy's own markers.
	"Content-Length": refusedFraming, "Idempotent-Replayed": refusedFraming, "Idempotent-Reconciled": refusedFraming,
	// Credentials, sessions and authentication exchanges.
	"Authorization": refusedCredential, "Proxy-Authorization": refusedCredential,
	"Www-Authenticate": refusedCredential, "Proxy-Authenticate": refusedCredential,
	"Authentication-Info": refusedCredential, "Proxy-Authentication-Info": refusedCredential,
	"Cookie": refusedCredential, "Cookie2": refusedCredential,
	"Set-Cookie": refusedCredential, "Set-Cookie2": refusedCredential,
	"Dpop": refusedCredential, "Dpop-Nonce": refusedCredential,
	"Client-Cert": refusedCredential, "Client-Cert-Chain": refusedCredential,
	"X-Amz-Security-Token": refusedCredential, "X-Ms-Client-Principal": refusedCredential,
	"X-Goog-Iap-Jwt-Assertion": refusedCredential, "X-Amzn-Oidc-Data": refusedCredential,
}

// credentialWords are parts of header names that, by common use, carry a
// credential, a session or proof of one (X-Api-Key, X-Auth-Token,
// X-Csrf-Token, X-Session-Id, X-Forwarded-Client-Cert, X-Vault-Token,
// Oauth-Token, X-Password): a name holding one is refused even if it is
// not in neverReplayed. Matched on the lower-cased name.
var credentialWords = [][]byte{
	[]byte("auth"), []byte("token"), []byte("secret"), []byte("passw"), []byte("cookie"),
	[]byte("session"), []byte("csrf"), []byte("xsrf"), []byte("apikey"), []byte("api-key"),
	[]byte("api_key"), []byte("access-key"), []byte("access_key"), []byte("credential"),
	[]byte("client-cert"), []byte("client-verify"), []byte("client-dn"), []byte("ssl-client"),
	[]byte("jwt"), []byte("bearer"),
}

// ReplayRefusal reports why the response header name (in any letter case)
// is never stored nor replayed, or "" when it may be. scopeHeader is the
// route's scope.header ("" for none): it identifies the client, so it is
// refused too. It does not allocate for a name in canonical form of up to
// 128 bytes, so the proxy can check every header it replays.
func ReplayRefusal(name, scopeHeader string) string {
	if why, ok := neverReplayed[http.CanonicalHeaderKey(name)]; ok {
		return why
	}
	if scopeHeader != "" && strings.EqualFold(name, scopeHeader) {
		return "it is the route's scope.header, which identifies the client"
	}
	var buf [128]byte
	lower := buf[:0]
	if len(name) > len(buf) {
		lower = make([]byte, 0, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower = append(lower, c)
	}
	for _, w := range credentialWords {
		if bytes.Contains(lower, w) {
			return refusedCredential
		}
	}
	return ""
}
