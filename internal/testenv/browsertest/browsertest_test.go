package browsertest_test

import (
	"bytes"
	"fmt"
	"html"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/browsertest"
)

// TestPath: $CHROMIUM names the browser; one that is not there is an error
// that says to install Debian's chromium, never a skip.
func TestPath(t *testing.T) {
	tests := []struct {
		name, env string
		wantErr   string
	}{
		{"default", "", ""},
		{"missing", filepath.Join(t.TempDir(), "no-chromium"), "install Debian's chromium package"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CHROMIUM", tt.env)
			got, err := browsertest.Path()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Path() = %v, want %s (install Debian's chromium to run the browser tests)", err, browsertest.DefaultPath)
			case tt.wantErr == "" && got != browsertest.DefaultPath:
				t.Errorf("Path() = %q, want %q", got, browsertest.DefaultPath)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Path() error = %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestBrowser: the helpers drive a real page: a form filled key by key and
// submitted with a click, the next page's text and status, a hidden input
// changed, Enter submitting, cookies with their flags, a screenshot.
func TestBrowser(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "s", Value: "v", HttpOnly: true, SameSite: http.SameSiteStrictMode, Path: "/"})
		fmt.Fprint(w, `<!doctype html><title>form</title><form method="post" action="/echo">
<input name="name"><input type="hidden" name="secret" value="kept"><button id="go">Go</button></form>`)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `<!doctype html><title>echo</title><p id="out">%s/%s</p>`,
			html.EscapeString(r.FormValue("name")), html.EscapeString(r.FormValue("secret")))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	b := browsertest.New(t, 60*time.Second)
	if got := b.Navigate(srv.URL + "/"); got != http.StatusOK {
		t.Fatalf("GET / = %d, want 200", got)
	}
	b.Fill("input[name=name]", "<b>ann</b>")
	b.SetValue("input[name=secret]", "changed")
	if got := b.Click("button#go"); got != http.StatusAccepted {
		t.Errorf("the click's page = %d, want 202", got)
	}
	if got, want := b.Text("p#out"), "<b>ann</b>/changed"; got != want {
		t.Errorf("text after the click = %q, want %q", got, want)
	}
	if got := b.Clicks(); got != 1 {
		t.Errorf("Clicks() = %d, want 1", got)
	}
	if !strings.HasSuffix(b.URL(), "/echo") {
		t.Errorf("URL() = %q, want .../echo", b.URL())
	}

	b.Navigate(srv.URL + "/")
	if got := b.Press("input[name=name]", "bob\n"); got != http.StatusAccepted {
		t.Errorf("Enter's page = %d, want 202", got)
	}
	if got, want := b.Text("p#out"), "bob/kept"; got != want {
		t.Errorf("text after Enter = %q, want %q", got, want)
	}
	if got := b.Count("p"); got != 1 {
		t.Errorf("Count(p) = %d, want 1", got)
	}
	cs := b.Cookies()
	if len(cs) != 1 || cs[0].Name != "s" || !cs[0].HTTPOnly || cs[0].SameSite != "Strict" {
		t.Errorf("Cookies() = %+v, want s, HTTP-only, SameSite=Strict", cs)
	}
	if got := browsertest.Eval[string](b, "document.cookie"); got != "" {
		t.Errorf("document.cookie = %q, want the HTTP-only cookie hidden from scripts", got)
	}

	shot := filepath.Join(t.TempDir(), "shot.png")
	b.Screenshot(shot)
	img, err := png.Decode(bytes.NewReader(readFile(t, shot)))
	if err != nil {
		t.Fatalf("the screenshot is no PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w != browsertest.ViewportWidth {
		t.Errorf("screenshot width = %d, want %d", w, browsertest.ViewportWidth)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
