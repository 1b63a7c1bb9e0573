package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/h2attack"
)

// headerOf returns a request header of n lines in all: the request line,
// Host, Content-Length and n-3 small fields (distinct names when distinct,
// else one name repeated), without the empty line that ends it.
func headerOf(n int, distinct bool, contentLength int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST /charges HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n", contentLength)
	for i := 3; i < n; i++ {
		if distinct {
			fmt.Fprintf(&b, "h%d:v\r\n", i)
		} else {
			b.WriteString("a:b\r\n")
		}
	}
	return b.String()
}

// TestHeaderLinesAreBounded: Go's server turns every header line into
// strings and map entries before any handler runs, so 60 KiB of one-byte
// fields (within the 64 KiB header limit) cost about half a mebibyte
// while the request is read, and as long as its body stalls: a few
// hundred such connections took the proxy past 300 MiB. A header of more
// than 256 lines is answered 431 too-many-header-fields as it is read,
// whatever the field names, and never forwarded; one of 256 lines is
// served; a connection that sent a large header earlier and then a
// normal request is served too (the count is per request).
func TestHeaderLinesAreBounded(t *testing.T) {
	up := startHoldingUpstream(t)
	dir := t.TempDir()
	p := startProxy(t, writeConfig(t, filepath.Join(dir, "c.yaml"), up.URL, filepath.Join(dir, "data"), "", chargesRoute))

	body := func(order string) string { return fmt.Sprintf(`{"orderId": %q, "amount": 1}`, order) }
	send := func(c *h2attack.RawConn, lines int, distinct bool, order string) (int, string, error) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b := body(order)
		if _, err := fmt.Fprint(c, headerOf(lines, distinct, len(b))+"\r\n"+b); err != nil {
			return 0, "", err
		}
		return c.ReadAnswer()
	}
	for _, tt := range []struct {
		name     string
		lines    int
		distinct bool
		want     int
	}{
		{"256 lines", 256, true, 200},
		{"257 lines", 257, true, 431},
		{"12,000 repeated fields", 12000, false, 431},
		{"7,000 distinct fields", 7000, true, 431},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(up.seenCopy())
			order := "ORD-HDR-" + strings.ReplaceAll(tt.name, " ", "-")
			st, got, err := send(h2attack.DialRaw(t, p.addr), tt.lines, tt.distinct, order)
			if err != nil || st != tt.want {
				t.Fatalf("answer = %d %v, want %d", st, err, tt.want)
			}
			forwarded := len(up.seenCopy()) - before
			if tt.want != 431 {
				if forwarded != 1 {
					t.Errorf("upstream saw %d requests, want 1", forwarded)
				}
				return
			}
			if forwarded != 0 {
				t.Errorf("a refused header reached the upstream (%d requests)", forwarded)
			}
			var prob struct{ Type, Detail string }
			if err := json.Unmarshal([]byte(got), &prob); err != nil || prob.Type != "urn:idemproxy:problem:too-many-header-fields" {
				t.Errorf("431 body = %q (%v), want an RFC 9457 too-many-header-fields problem", got, err)
			}
		})
	}
	if got := scrapeValue(t, p, "idemproxy_request_headers_refused_total"); got != 3 {
		t.Errorf("idemproxy_request_headers_refused_total = %v, want 3", got)
	}

	// The count is per request: a keep-alive connection whose requests are
	// each under the bound is served, however many lines they add up to.
	c := h2attack.DialRaw(t, p.addr)
	for i := range 4 {
		if st, _, err := send(c, 200, true, fmt.Sprintf("ORD-HDR-KA-%d", i)); err != nil || st != 200 {
			t.Fatalf("request %d on one connection = %d %v, want 200", i, st, err)
		}
	}

	// Many connections at once, each sending a header of thousands of
	// fields and holding its connection: every one is answered 431 and a
	// normal charge is served meanwhile.
	const n = 200
	conns := make([]*h2attack.RawConn, n)
	for i := range conns {
		conns[i] = h2attack.DialRaw(t, p.addr)
		conns[i].SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprint(conns[i], headerOf(6000, true, 10)+"\r\n{")
	}
	if st, _, err := send(h2attack.DialRaw(t, p.addr), 10, false, "ORD-HDR-MEANWHILE"); err != nil || st != 200 {
		t.Errorf("a charge during the header flood = %d %v, want 200", st, err)
	}
	for i, c := range conns {
		if st, _, err := c.ReadAnswer(); err != nil || st != 431 {
			t.Fatalf("flood connection %d = %d %v, want 431", i, st, err)
		}
	}
}

// seenCopy returns the headers of the requests the upstream has seen.
func (u *holdingUpstream) seenCopy() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}
