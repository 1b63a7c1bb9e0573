// Package browsertest drives a real headless Chromium from Go tests, over
// the DevTools protocol (github.com/chromedp/chromedp): no Node, no browser
// downloaded by a test tool, Debian's own chromium package.
//
// New starts one browser for one test, in a temporary profile, and stops
// it when the test ends. Its helpers (Navigate, Fill, Click, Text, ...)
// fail the test with the page's address when a step fails, so that a test
// reads as the operator's path through the pages. Chromium is required:
// where it is missing the test fails saying how to install it, it never
// skips (CI installs it, see .ci/run).
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// DefaultPath is where Debian's chromium package installs the browser.
const DefaultPath = "/usr/bin/chromium"

// Viewport is the browser window's size: small enough for the docs'
// screenshots, wide enough for the console's tables.
const (
	ViewportWidth  = 1100
	ViewportHeight = 700
)

// stepTimeout bounds one step (a navigation, a click and the page it
// loads, a query): a page that never comes fails the test, it does not hang
// it.
const stepTimeout = 15 * time.Second

// Path returns the Chromium to run: $CHROMIUM when set, else DefaultPath.
// It returns an error that says how to install it when there is none.
func Path() (string, error) {
	p := os.Getenv("CHROMIUM")
	if p == "" {
		p = DefaultPath
	}
	if _, err := exec.LookPath(p); err != nil {
		return "", fmt.Errorf("no Chromium at %s (%w): install Debian's chromium package (apt-get install chromium), or set CHROMIUM to a Chromium binary; the browser tests need it and do not skip", p, err)
	}
	return p, nil
}

// Browser is one headless Chromium with one tab, for one test.
type Browser struct {
	t      testing.TB
	ctx    context.Context // the tab's context
	clicks int
}

// New starts Chromium for t, headless, with a new empty profile in a
// temporary directory, and stops it when t ends. The whole browser lives
// at most total (t fails when a step runs past it).
func New(t testing.TB, total time.Duration) *Browser {
	t.Helper()
	path, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	profile, err := os.MkdirTemp("", "browsertest-profile-*")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	// The flags that work on a machine without a display, a GPU or a way
	// out to the internet: without the background-networking flags,
	// Chromium keeps trying to reach Google's hosts.
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root, in a container
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter"),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(ViewportWidth, ViewportHeight),
		chromedp.CombinedOutput(&lockedWriter{b: &out}),
	}
	root, cancelRoot := context.WithTimeout(context.Background(), total)
	alloc, cancelAlloc := chromedp.NewExecAllocator(root, opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit
		cancelRoot()
		os.RemoveAll(profile)
	})
	// The first run starts the browser, with the whole lifetime's context.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(ViewportWidth, ViewportHeight)); err != nil {
		t.Fatalf("start %s: %v\n%s", path, err, out.String())
	}
	return &Browser{t: t, ctx: ctx}
}

// lockedWriter is a strings.Builder the browser's output goroutine and
// the test share.
type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Context returns the tab's context, for chromedp actions of a test's own
// (run them with a timeout derived from it).
func (b *Browser) Context() context.Context { return b.ctx }

// run runs steps within stepTimeout and fails the test, naming what and
// where, when one fails.
func (b *Browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s, at %s: %v", what, b.URL(), err)
	}
}

// Navigate loads url and returns its answer's HTTP status.
func (b *Browser) Navigate(url string) int {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(url))
	if err != nil {
		b.t.Fatalf("navigate to %s: %v", url, err)
	}
	return int(resp.Status)
}

// Fill types value into the field sel (a CSS selector), as a person does:
// key by key, after clearing what it held.
func (b *Browser) Fill(sel, value string) {
	b.t.Helper()
	b.run("fill "+sel, chromedp.WaitVisible(chromedp.CSS(sel)), setValue(sel, ""), typeInto(sel, value))
}

// setValue sets the value property of the element sel, found by the page's
// document.querySelector, and fails when there is none.
func setValue(sel, value string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%s); if (!e) return false; e.value = %s; return true })()`,
		jsString(sel), jsString(value))
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		ok, err := chromedp.Evaluate[bool](js)(ctx, t)
		if err == nil && !ok {
			err = fmt.Errorf("no element matches %s", sel)
		}
		return err
	})
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// typeInto focuses the element sel and types keys into it. It is
// chromedp.SendKeys without its read of the node's attributes outside the
// node's lock (chromedp v0.23.1, query.go), a data race with the
// attribute changes the browser reports meanwhile that the race detector
// finds.
func typeInto(sel, keys string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Focus(chromedp.CSS(sel), chromedp.NodeVisible), chromedp.KeyEvent(keys))
}

// SetValue sets the value of the element sel directly, as a script could:
// for a hidden input a person cannot type into.
func (b *Browser) SetValue(sel, value string) {
	b.t.Helper()
	b.run("set the value of "+sel, chromedp.WaitReady(chromedp.CSS(sel)), setValue(sel, value))
}

// Click clicks the element sel (a link or a button) with the mouse, waits
// for the page it loads and returns that page's HTTP status. Every Click
// is counted (Clicks).
func (b *Browser) Click(sel string) int {
	b.t.Helper()
	b.clicks++
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("click %s, at %s: %v", sel, b.URL(), err)
	}
	if resp == nil {
		return 0
	}
	return int(resp.Status)
}

// Tick clicks the element sel, a checkbox or a radio button, with the
// mouse: it loads no page, so nothing is waited for. It is counted as a
// click (Clicks).
func (b *Browser) Tick(sel string) {
	b.t.Helper()
	b.clicks++
	b.run("tick "+sel, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
}

// Press types keys into the field sel and waits for the page that loads:
// "\n" at the end of keys submits the field's form, as Enter does. It
// returns the page's HTTP status.
func (b *Browser) Press(sel, keys string) int {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, typeInto(sel, keys))
	if err != nil {
		b.t.Fatalf("type %q into %s, at %s: %v", keys, sel, b.URL(), err)
	}
	if resp == nil {
		return 0
	}
	return int(resp.Status)
}

// Clicks returns how many times Click clicked.
func (b *Browser) Clicks() int { return b.clicks }

// Text returns the text content of the element sel, which must be on the
// page.
func (b *Browser) Text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel), chromedp.NodeReady))
	if err != nil {
		b.t.Fatalf("read the text of %s, at %s: %v\n%s", sel, b.URL(), err, b.bodyText())
	}
	return s
}

// Attr returns the attribute name of the element sel, and whether the
// element has it.
func (b *Browser) Attr(sel, name string) (string, bool) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	r, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
	if err != nil {
		b.t.Fatalf("read %s of %s, at %s: %v", name, sel, b.URL(), err)
	}
	return r.Value, r.Exists
}

// Count returns how many elements match sel now, without waiting for one.
func (b *Browser) Count(sel string) int {
	b.t.Helper()
	return Eval[int](b, "document.querySelectorAll("+jsString(sel)+").length")
}

// Has says whether an element matches sel now.
func (b *Browser) Has(sel string) bool {
	b.t.Helper()
	return b.Count(sel) > 0
}

// URL returns the address of the page the tab shows ("" when it cannot
// tell).
func (b *Browser) URL() string {
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	u, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		return ""
	}
	return u
}

// bodyText returns the page's text, for a failure's message.
func (b *Browser) bodyText() string {
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string]("document.body ? document.body.innerText : ''"))
	if err != nil {
		return fmt.Sprintf("(the page's text could not be read: %v)", err)
	}
	return "page text:\n" + s
}

// Eval evaluates a JavaScript expression in the page, as DevTools does
// (the page's Content-Security-Policy does not apply to it), and returns
// its value.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s, at %s: %v", expr, b.URL(), err)
	}
	return v
}

// Screenshot saves the whole page as a PNG file at path, creating its
// directory.
func (b *Browser) Screenshot(path string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot of %s: %v", b.URL(), err)
	}
	if ct := http.DetectContentType(png); ct != "image/png" {
		b.t.Fatalf("screenshot of %s is %s, want image/png", b.URL(), ct)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// Cookies returns the tab's cookies for the page's site, HTTP-only ones
// included, as name=value pairs with their flags.
func (b *Browser) Cookies() []Cookie {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	res, err := chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) (*network.GetCookiesResult, error) {
		r, err := cdp.Call(ctx, t, network.GetCookies, network.GetCookiesParams{})
		return &r, err
	})
	if err != nil {
		b.t.Fatalf("read the cookies, at %s: %v", b.URL(), err)
	}
	out := make([]Cookie, 0, len(res.Cookies))
	for _, c := range res.Cookies {
		out = append(out, Cookie{Name: c.Name, Value: c.Value, HTTPOnly: c.HTTPOnly, SameSite: string(c.SameSite), Path: c.Path})
	}
	return out
}

// Cookie is what a test checks of a cookie.
type Cookie struct {
	Name, Value string
	HTTPOnly    bool
	SameSite    string // "Strict", "Lax", "None" or ""
	Path        string
}
