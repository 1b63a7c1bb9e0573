package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// plain is the answer the encoding tests' upstreams send, encoded or not.
var plain = []byte(strings.Repeat(`{"status":"charged","amount":100}`, 64))

func gzipped(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// noDecode is a client that sends Accept-Encoding only when told and never
// decodes: a client library that does not know content codings.
var noDecode = &http.Client{Transport: &http.Transport{DisableCompression: true}}

// TestAnswerAskedUnencoded: a client that accepts gzip sends the first
// charge; an upstream that honours Accept-Encoding would gzip it, and the
// stored gzip was replayed to a retry that does not accept it. A route asks
// the upstream for identity, so every retry can read the replay.
func TestAnswerAskedUnencoded(t *testing.T) {
	t.Parallel()
	var asked []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gzipped(t, plain))
			return
		}
		w.Write(plain)
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, chargesByHeader)
	first := proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1", "Accept-Encoding", "gzip")
	retry := proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1")
	for _, a := range []proxytest.Answer{first, retry} {
		if a.Status != 200 || !bytes.Equal(a.Body, plain) || a.Header.Get("Content-Encoding") != "" {
			t.Errorf("got %d Content-Encoding %q, %d bytes; want 200 and the unencoded answer",
				a.Status, a.Header.Get("Content-Encoding"), len(a.Body))
		}
	}
	if !retry.Replayed() {
		t.Error("the retry was not replayed")
	}
	if len(asked) != 1 || asked[0] != "identity" {
		t.Errorf("the upstream was asked with Accept-Encoding %q, want one request asking for identity", asked)
	}
}

// TestReplayFitsAcceptEncoding: an upstream that encodes whatever it is
// asked (or an answer stored before the proxy asked for identity) is stored
// encoded. A retry gets it encoded only if it accepts the coding, else
// decoded, with the decoded length and no Content-Encoding; both vary on
// Accept-Encoding.
func TestReplayFitsAcceptEncoding(t *testing.T) {
	t.Parallel()
	deflated := func(b []byte) []byte {
		var buf bytes.Buffer
		w := zlib.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	rawDeflated := func(b []byte) []byte {
		var buf bytes.Buffer
		w, _ := flate.NewWriter(&buf, flate.DefaultCompression)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	for _, enc := range []struct {
		coding string
		body   []byte
	}{
		{"gzip", gzipped(t, plain)},
		{"x-gzip", gzipped(t, plain)},
		{"deflate", deflated(plain)},
		{"deflate", rawDeflated(plain)}, // raw, as some servers send it
	} {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", enc.coding)
			w.Header().Set("ETag", `"v1"`)
			w.Write(enc.body)
		}))
		e := &proxytest.Env{T: t}
		e.Start(up.URL, chargesByHeader)
		proxytest.WantStatus(t, "first", proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1", "Accept-Encoding", "gzip, deflate"), 200, "")
		for _, tc := range []struct {
			accept  string // "-": none sent
			decoded bool
		}{
			{"-", true},
			{"identity", true},
			{"gzip, deflate, br", false},
			{"GZIP;q=0.5, Deflate;q=0.5", false},
			{"*", false},
			{"*;q=0", true},
			{"br", true},
			{enc.coding + ";q=0, *", true},
			{"gzip;q=0, deflate;q=0", true},
		} {
			hdr := []string{"Idempotency-Key", "k1"}
			if tc.accept != "-" {
				hdr = append(hdr, "Accept-Encoding", tc.accept)
			}
			a := proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", hdr...)
			want, wantCE, wantETag := enc.body, enc.coding, `"v1"`
			if tc.decoded {
				want, wantCE, wantETag = plain, "", `W/"v1"`
			}
			if a.Status != 200 || !a.Replayed() || !bytes.Equal(a.Body, want) || a.Header.Get("Content-Encoding") != wantCE ||
				a.Header.Get("Content-Length") != strconv.Itoa(len(want)) || a.Header.Get("ETag") != wantETag ||
				a.Header.Get("Vary") != "Accept-Encoding" {
				t.Errorf("%s stored, Accept-Encoding %q: got %d replayed=%v, %d bytes, Content-Encoding %q, Content-Length %q, ETag %q, Vary %q; "+
					"want %d bytes, Content-Encoding %q, ETag %q, Vary Accept-Encoding", enc.coding, tc.accept, a.Status, a.Replayed(),
					len(a.Body), a.Header.Get("Content-Encoding"), a.Header.Get("Content-Length"), a.Header.Get("ETag"),
					a.Header.Get("Vary"), len(want), wantCE, wantETag)
			}
		}
		up.Close()
	}
}

// TestReplayOfAGzipBomb: a stored gzip body that decodes to far more than
// max_stored_body_bytes (a bomb, or a corrupt body) is never decoded into
// memory: a retry that does not accept gzip gets it as stored, and the
// proxy keeps serving.
func TestReplayOfAGzipBomb(t *testing.T) {
	t.Parallel()
	bomb := gzipped(t, make([]byte, 64<<20)) // about 64 KiB
	corrupt := gzipped(t, plain)
	corrupt[len(corrupt)-5] ^= 0xff // the CRC
	for name, body := range map[string][]byte{"bomb": bomb, "corrupt": corrupt} {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(body)
		}))
		e := &proxytest.Env{T: t}
		e.Start(up.URL, chargesByHeader)
		proxytest.WantStatus(t, name+": first", proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1", "Accept-Encoding", "gzip"), 200, "")
		a := proxytest.Send(noDecode, "POST", e.Server.URL+"/charges", "{}", "Idempotency-Key", "k1")
		if a.Status != 200 || !a.Replayed() || !bytes.Equal(a.Body, body) || a.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("%s: got %d replayed=%v, %d bytes, Content-Encoding %q; want the stored gzip body as stored",
				name, a.Status, a.Replayed(), len(a.Body), a.Header.Get("Content-Encoding"))
		}
		up.Close()
	}
}

// chargesByHeader is a route keyed by the Idempotency-Key header, with
// answers of up to 1 MiB stored.
const chargesByHeader = `
  - name: charges
    match: POST /charges
    key: {header: Idempotency-Key}
`
