package proxy_test

import (
	"github.com/idemproxy/idemproxy/internal/testenv/proxytest"

	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// thingsUpstream answers GET and HEAD /things/{id} with a body of 11 bytes
// (HEAD: its headers only), and announces the trailers X-Checksum and
// X-Debug when asked to (?trailers); ?huge makes X-Checksum 3 KiB, ?giant
// 64 KiB.
func thingsUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		q := r.URL.Query()
		if !q.Has("trailers") {
			w.Header().Set("Content-Length", "11")
			w.Write([]byte("hello world"))
			return
		}
		w.Header().Set("Trailer", "X-Checksum, X-Debug")
		w.Write([]byte("hello world"))
		sum := "sha256=b94d27"
		if q.Has("huge") {
			sum = strings.Repeat("x", 3<<10)
		}
		if q.Has("giant") {
			sum = strings.Repeat("x", 64<<10)
		}
		w.Header().Set("X-Checksum", sum)
		w.Header().Set("X-Debug", "not replayed")
	}))
	t.Cleanup(up.Close)
	return up
}

// TestHeadReplayCarriesTheOriginalsLength: a HEAD replay carries the
// Content-Length the original answer had (a HEAD's, or the length of the
// GET's body), not the 0 of the stored empty body; a GET replay of an
// answer to HEAD (fingerprints off) has the length of what it carries.
func TestHeadReplayCarriesTheOriginalsLength(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		first, retry  string
		fingerprintOn bool
		wantLength    string
		wantBody      string
	}{
		{"HEAD then HEAD", "HEAD", "HEAD", true, "11", ""},
		{"GET then HEAD", "GET", "HEAD", false, "11", ""},
		{"HEAD then GET", "HEAD", "GET", false, "0", ""},
		{"GET then GET", "GET", "GET", true, "11", "hello world"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &proxytest.Env{T: t}
			routes := `
  - name: things
    match: GET /things/{id}
    key: {path: id}
`
			if !tc.fingerprintOn {
				routes += "    fingerprint: {disabled: true}\n"
			}
			e.Start(thingsUpstream(t).URL, routes)
			first := e.Do(tc.first, "/things/1", "")
			proxytest.WantStatus(t, "first", first, 200, "")
			a := e.Do(tc.retry, "/things/1", "")
			if a.Status != 200 || !a.Replayed() || a.Header.Get("Content-Length") != tc.wantLength || string(a.Body) != tc.wantBody {
				t.Errorf("retry: %d replayed=%v, Content-Length %q, body %q; want the replay with Content-Length %q, body %q",
					a.Status, a.Replayed(), a.Header.Get("Content-Length"), a.Body, tc.wantLength, tc.wantBody)
			}
			if got, want := a.Header.Get("Content-Length"), first.Header.Get("Content-Length"); tc.first == tc.retry && got != want {
				t.Errorf("retry's Content-Length %q, the original's %q", got, want)
			}
		})
	}
}

// TestReplayCarriesTrailers: the trailers of an answer that replay_headers
// allows are stored and replayed as trailers; others are not. Trailers
// count in max_stored_body_bytes: an upstream that sends a large one makes
// its answer not replayable (the client still got it whole). Go's
// transport refuses trailers past 4 KiB: an answer with one is broken off,
// and its key in doubt.
func TestReplayCarriesTrailers(t *testing.T) {
	t.Parallel()
	e := &proxytest.Env{T: t}
	e.Start(thingsUpstream(t).URL, `
  - name: things
    match: GET /things/{id}
    key: {path: id}
    max_stored_body_bytes: 1024
    replay_headers: [Content-Type, X-Checksum]
`)
	get := func(path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := e.Server.Client().Get(e.Server.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body) // the trailers are read with the body
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	for i, what := range []string{"first", "retry"} {
		resp, b := get("/things/1?trailers")
		if resp.StatusCode != 200 || string(b) != "hello world" || resp.Trailer.Get("X-Checksum") != "sha256=b94d27" {
			t.Errorf("%s: %d %q, trailers %v; want 200, the body and X-Checksum", what, resp.StatusCode, b, resp.Trailer)
		}
		if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Errorf("%s: replayed = %v", what, replayed)
		}
		if i == 1 && resp.Trailer.Get("X-Debug") != "" {
			t.Errorf("the replay carries X-Debug, which replay_headers does not allow: %v", resp.Trailer)
		}
	}
	resp, b := get("/things/2?trailers&huge")
	if resp.StatusCode != 200 || string(b) != "hello world" || len(resp.Trailer.Get("X-Checksum")) != 3<<10 {
		t.Errorf("large trailer, first: %d %q, %d bytes of X-Checksum; want the whole answer", resp.StatusCode, b, len(resp.Trailer.Get("X-Checksum")))
	}
	proxytest.WantStatus(t, "large trailer, retry", e.Do("GET", "/things/2?trailers&huge", ""), 409, "response-not-replayable")
	proxytest.WantStatus(t, "giant trailer", e.Do("GET", "/things/3?trailers&giant", ""), 502, "upstream-reset")
	proxytest.WantStatus(t, "giant trailer, retry", e.Do("GET", "/things/3?trailers&giant", ""), 409, "outcome-in-doubt")
}

// TestHeadReplayWithoutLength: a HEAD whose original answer carried no
// Content-Length (the upstream did not know it: chunked) is replayed
// without one, not with the 0 of the stored empty body, which tells the
// client the resource is empty.
func TestHeadReplayWithoutLength(t *testing.T) {
	t.Parallel()
	e := &proxytest.Env{T: t}
	e.Start(thingsUpstream(t).URL, `
  - name: things
    match: GET /things/{id}
    key: {path: id}
`)
	first := e.Do("HEAD", "/things/1?trailers", "")
	proxytest.WantStatus(t, "first", first, 200, "")
	if cl := first.Header.Get("Content-Length"); cl != "" {
		t.Fatalf("the original HEAD answer has Content-Length %q; the test needs one without", cl)
	}
	a := e.Do("HEAD", "/things/1?trailers", "")
	if a.Status != 200 || !a.Replayed() || a.Header.Get("Content-Length") != "" {
		t.Errorf("retry: %d replayed=%v, Content-Length %q; want the replay without Content-Length",
			a.Status, a.Replayed(), a.Header.Get("Content-Length"))
	}
}

// TestHeadReplayOfALargeResource: the answer to a HEAD has no body,
// whatever its Content-Length says; Go's transport reports that length as
// the response's ContentLength. A HEAD of a resource larger than
// max_stored_body_bytes is stored and replayed with its length like any
// other, not refused 409 response-not-replayable.
func TestHeadReplayOfALargeResource(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "104857600")
		if r.Method != http.MethodHead {
			io.Copy(w, io.LimitReader(zeros{}, 104857600))
		}
	}))
	defer up.Close()
	e := &proxytest.Env{T: t}
	e.Start(up.URL, `
  - name: things
    match: GET /things/{id}
    key: {path: id}
`)
	proxytest.WantStatus(t, "first", e.Do("HEAD", "/things/big", ""), 200, "")
	a := e.Do("HEAD", "/things/big", "")
	if a.Status != 200 || !a.Replayed() || a.Header.Get("Content-Length") != "104857600" {
		t.Errorf("retry: %d replayed=%v, Content-Length %q; want the replay with Content-Length 104857600",
			a.Status, a.Replayed(), a.Header.Get("Content-Length"))
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
