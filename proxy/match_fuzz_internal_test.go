package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// FuzzHostMatch checks host matching against Go's ServeMux, as ServeHTTP
// uses it: a request for /charges with any Host header matches the route
// "POST API.Example.com./charges" exactly when its host, as a DNS name
// (any case, final dot, any port), is api.example.com; and the canonical
// forms are stable.
func FuzzHostMatch(f *testing.F) {
	for _, h := range []string{"api.example.com", "API.EXAMPLE.COM", "api.example.com.", "api.example.com:8080",
		"Api.Example.Com.:443", "other.example.com", "[::1]:80", "api.example.com..", "", ":", "api.example.com:x:y"} {
		f.Add(h)
	}
	mux := http.NewServeMux()
	mux.Handle(config.CanonicalPattern("POST API.Example.com./charges"), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	f.Fuzz(func(t *testing.T, host string) {
		c := canonicalHost(host)
		if again := canonicalHost(c); again != c && strings.LastIndexByte(c, ':') < 0 {
			t.Fatalf("canonicalHost(%q) = %q, but canonicalHost of that = %q", host, c, again)
		}
		if c != strings.ToLower(c) {
			t.Fatalf("canonicalHost(%q) = %q is not lower case", host, c)
		}
		r := httptest.NewRequest("POST", "/charges", nil)
		r.Host = c
		_, pattern := mux.Handler(r)
		matched := pattern != ""
		want := stripPort(c) == "api.example.com"
		if matched != want {
			t.Fatalf("Host %q (canonical %q): matched %v, want %v", host, c, matched, want)
		}
	})
}

// stripPort is the port stripping of Go's ServeMux.
func stripPort(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		return h[:i]
	}
	return h
}

// FuzzCleanPath checks the cleaned form a path is matched in: absolute,
// stable, and free of empty, "." and ".." segments.
func FuzzCleanPath(f *testing.F) {
	for _, p := range []string{"/charges", "/charges/", "//charges", "/./charges", "/a/../charges", "", "/", "..", "a//b/./../c/"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c := cleanPath(p)
		if !strings.HasPrefix(c, "/") && c != "." {
			if !strings.HasPrefix(p, "/") && c == strings.TrimPrefix(c, "/") {
				return // a relative path stays relative; the server never hands one over
			}
			t.Fatalf("cleanPath(%q) = %q is not absolute", p, c)
		}
		if again := cleanPath(c); again != c {
			t.Fatalf("cleanPath(%q) = %q, but cleanPath of that = %q", p, c, again)
		}
		if strings.HasPrefix(p, "/") {
			for _, seg := range strings.Split(c, "/")[1:] {
				if (seg == "" && c != "/") || seg == "." || seg == ".." {
					t.Fatalf("cleanPath(%q) = %q holds segment %q", p, c, seg)
				}
			}
		}
	})
}
