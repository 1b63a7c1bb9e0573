package proxy_test

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"
	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// TestClientShareAnswerNamesTheSetting: behind a mesh every request comes
// from one address, and the answer of a request refused for the client's
// share of the buffers must say what to change: the problem names
// server.max_buffered_bytes_per_client (detail and the "setting" member)
// and the client it counted; the access log line and the warning carry the
// reason.
func TestClientShareAnswerNamesTheSetting(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	e := &proxytest.Env{T: t, Log: &log}
	e.Stub = httptest.NewServer(stub.New(slog.New(slog.DiscardHandler)))
	t.Cleanup(e.Stub.Close)
	c := proxytest.ParseConfig(t, e.Stub.URL, chargesByOrder)
	c.Server.MaxBufferedBytes = 1 << 20
	c.Server.MaxBufferedBytesPerClient = 16 << 10
	c.Server.BodyTimeout = config.Duration(3 * time.Second)
	e.StartConfig(c)
	client := &http.Client{Timeout: 20 * time.Second}
	first := stalledStream(t, client, e.Server.URL, `{"orderId": "ORD-MESH", "note": "`+strings.Repeat("x", 16<<10))
	proxytest.Eventually(t, "the first body holds the share", func() bool { return bufferedBytes(e) >= 16<<10 })
	a := proxytest.Send(client, "POST", e.Server.URL+"/charges", `{"orderId": "ORD-MESH-2", "amount": 1}`)
	proxytest.WantStatus(t, "a charge over the client's share", a, 503, "overloaded")
	var p struct {
		Detail  string
		Setting string
		Client  string
		Limit   int64
	}
	if err := json.Unmarshal(a.Body, &p); err != nil {
		t.Fatal(err)
	}
	if p.Setting != "server.max_buffered_bytes_per_client" || p.Client != "127.0.0.1" || p.Limit != 16<<10 ||
		!strings.Contains(p.Detail, "server.max_buffered_bytes_per_client") || !strings.Contains(p.Detail, "127.0.0.1") {
		t.Errorf("the problem = %s, want the setting server.max_buffered_bytes_per_client, its limit 16384 and client 127.0.0.1 named", a.Body)
	}
	<-first
	var access, warn map[string]any
	sc := bufio.NewScanner(strings.NewReader(log.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		switch {
		case m["msg"] == "request" && m["outcome"] == "overloaded":
			access = m
		case m["level"] == "WARN" && strings.Contains(m["msg"].(string), "share"):
			warn = m
		}
	}
	if access == nil || access["reason"] != "client" {
		t.Errorf("the access log line of the refused request = %v, want reason=client", access)
	}
	if warn == nil || warn["setting"] != "server.max_buffered_bytes_per_client" || warn["client"] != "127.0.0.1" || warn["reason"] != "client" {
		t.Errorf("the warning = %v, want reason=client, client=127.0.0.1, setting=server.max_buffered_bytes_per_client", warn)
	}
}
