package admin

import (
	"bytes"
	"crypto/subtle"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/internal/admission"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/tracing"
)

// The console is the admin listener's pages for operators, under /ui/:
// the routes' keys by state, the keys in doubt, a key's record, and the
// acts on it (reconcile, release, a bulk release). It is off (403, the
// key API's disabled problem) unless an admin token is configured, and
// logging in takes that token, checked as the key API checks it. Every act
// goes through releaseKey or reconcileKeyAct, as the key API's do.
//
// Pages are rendered by html/template from console/*.html, with one style
// sheet, console/static/console.css, and no script: the
// Content-Security-Policy allows none.

//go:embed console
var consoleFiles embed.FS

// consoleCSP is the Content-Security-Policy of every console answer: no
// script, no inline style, nothing from elsewhere, never in a frame.
const consoleCSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// sessionCookie is the name of the console's session cookie.
const sessionCookie = "idemproxy_console"

// maxFormBytes bounds a console form's body.
const maxFormBytes = 1 << 20

// RouteNamer is implemented by a Routes that can list the routes' names
// (the program's does): the console's overview lists them, and its
// listing offers them. Without it the overview lists none, and the
// listing asks for a route's name.
type RouteNamer interface {
	// RouteNames returns the names of the running routes, in the
	// configuration's order.
	RouteNames() []string
}

// console serves /ui/.
type console struct {
	h        *Handler
	sessions *sessions
	pages    map[string]*template.Template
	serve    http.Handler // the pages, behind cross-origin protection
}

// consolePages are the console's page templates, each rendered inside
// console/layout.html.
var consolePages = []string{"login", "error", "overview", "keys", "key", "bulk"}

// newConsole returns the console of h.
func newConsole(h *Handler) *console {
	c := &console{h: h, sessions: newSessions(), pages: map[string]*template.Template{}}
	for _, name := range consolePages {
		c.pages[name] = template.Must(template.ParseFS(consoleFiles, "console/layout.html", "console/"+name+".html"))
	}
	static, err := fs.Sub(consoleFiles, "console/static")
	if err != nil {
		panic(err) // the embedded tree is the binary's own
	}
	files := http.StripPrefix("/ui/static/", http.FileServerFS(static))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui/static/", func(w http.ResponseWriter, r *http.Request) {
		// The style sheet holds no answer: it may be cached.
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /ui/login", c.loginPage)
	mux.HandleFunc("POST /ui/login", c.login)
	mux.HandleFunc("POST /ui/logout", c.act(c.logout))
	mux.HandleFunc("GET /ui/{$}", c.page(c.overview))
	mux.HandleFunc("GET /ui/keys", c.page(c.keys))
	mux.HandleFunc("GET /ui/keys/{route}/{key...}", c.page(c.key))
	mux.HandleFunc("POST /ui/reconcile", c.act(c.reconcile))
	mux.HandleFunc("POST /ui/release", c.act(c.release))
	mux.HandleFunc("POST /ui/bulk-release", c.act(c.bulkRelease))
	mux.HandleFunc("GET /ui/bulk-release", c.page(c.bulkResult))
	mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, c.current(r), http.StatusNotFound, "there is no such console page")
	})
	// Defense in depth behind the CSRF token and SameSite=Strict: a POST
	// that the browser says came from another site is refused, before
	// anything is done.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusForbidden, "cross-origin request refused: nothing was done")
	}))
	c.serve = cop.Handler(mux)
	return c
}

// ServeHTTP serves /ui/: every answer carries the security headers; none
// but the 403 disabled problem while no token is configured.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setConsoleHeaders(w.Header())
	if c.h.opts.Token == "" {
		problem.Write(w, r, probDisabled, c.h.disabledDetail(), 0, nil)
		return
	}
	c.serve.ServeHTTP(w, r)
}

// setConsoleHeaders sets the security headers of every console answer
// in hd.
func setConsoleHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", consoleCSP)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
}

// isConsolePath reports whether p, once cleaned, is under /ui/: then the
// admin listener's router answers a redirect to the cleaned path (/ui,
// /ui//keys, /ui/keys/../) before the console is asked, and that answer
// needs the console's headers too.
func isConsolePath(p string) bool {
	p = path.Clean("/" + p)
	return p == "/ui" || strings.HasPrefix(p, "/ui/")
}

// sessionView is what a page shows of its session.
type sessionView struct {
	Operator, CSRF string
}

// resultView is the outcome of an act, in div#result.
type resultView struct {
	OK      bool
	Message string
	Lines   []string
}

// pageView is what every page template gets.
type pageView struct {
	Title   string
	Session *sessionView
	Error   string
	Result  *resultView
	Data    any
}

// render answers status with the page name.
func (c *console) render(w http.ResponseWriter, status int, name string, v pageView) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", v); err != nil {
		http.Error(w, "render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// fail answers an error page: the message in div#error; se nil for a page
// without the session's navigation.
func (c *console) fail(w http.ResponseWriter, r *http.Request, se *session, status int, msg string) {
	c.render(w, status, "error", pageView{Title: http.StatusText(status), Session: viewOf(se), Error: msg})
}

func viewOf(se *session) *sessionView {
	if se == nil {
		return nil
	}
	return &sessionView{Operator: se.operator, CSRF: se.csrf}
}

// current returns the request's live session, nil when it has none.
func (c *console) current(r *http.Request) *session {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

// page serves a GET of a logged-in operator; without a session, the
// login page instead.
func (c *console) page(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		se := c.current(r)
		if se == nil {
			// Back to this page once logged in: the alert's link to a
			// route's keys in doubt leads there through the login.
			// Only the Location: the page's path, which may hold a key, is
			// not echoed in a body.
			to := "/ui/login"
			if next := nextPage(r.URL.RequestURI()); next != "/ui/" {
				to += "?next=" + url.QueryEscape(next)
			}
			w.Header().Set("Location", to)
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		next(w, r, se)
	}
}

// act serves a POST of a logged-in operator whose form carries the
// session's CSRF token; anything else is refused 403 with nothing done.
func (c *console) act(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		se := c.current(r)
		if se == nil {
			c.fail(w, r, nil, http.StatusForbidden, "you are not logged in, or your session ended: nothing was done; log in again")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, se, http.StatusBadRequest, "the form could not be read: nothing was done")
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(se.csrf)) != 1 {
			c.fail(w, r, se, http.StatusForbidden,
				"the form's CSRF token is missing or wrong (a form of another session, or not from this console): nothing was done; reload the page and try again")
			return
		}
		// The act's span (admin/tracing.go), when traced, names the
		// session's operator, as the audit line does.
		trace.SpanFromContext(r.Context()).SetAttributes(tracing.AttrOperator.String(tracing.Text(se.operator)))
		next(w, r, se)
	}
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, http.StatusOK, "login", pageView{Title: "Log in", Data: loginView{Next: nextPage(r.URL.Query().Get("next"))}})
}

// loginView is what the login form shows again: the operator's name, and
// the console page to go to once logged in.
type loginView struct{ Operator, Next string }

// nextPage returns next when it is a page of this console ("/ui/…", a
// path and query only), "/ui/" otherwise: a login never sends the browser
// elsewhere (no open redirect through "//host", "/\\host" or a scheme).
func nextPage(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Fragment != "" ||
		!strings.HasPrefix(next, "/ui/") || strings.ContainsAny(next, "\\\r\n\t") || strings.HasPrefix(next, "//") {
		return "/ui/"
	}
	// A dot segment, escaped (%2e) or not, would leave /ui/ once the
	// redirect or the browser removes it; no console link has one.
	for seg := range strings.SplitSeq(u.EscapedPath(), "/") {
		if seg, err := url.PathUnescape(seg); err != nil || seg == "." || seg == ".." {
			return "/ui/"
		}
	}
	return next
}

// login checks the token as the key API does (constant time, the same
// failure limiter, metrics and log line) and starts a session of the
// operator named: the operator of every act of it in the audit log.
func (c *console) login(w http.ResponseWriter, r *http.Request) {
	h := c.h
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.render(w, http.StatusBadRequest, "login", pageView{Title: "Log in", Error: "the form could not be read"})
		return
	}
	operator := strings.TrimSpace(r.PostForm.Get("operator"))
	next := nextPage(r.PostForm.Get("next"))
	again := func(status int, msg string) {
		c.render(w, status, "login", pageView{Title: "Log in", Error: msg, Data: loginView{Operator: operator, Next: next}})
	}
	client := admission.ClientOf(r.RemoteAddr)
	if wait := h.authWait(client); wait > 0 {
		secs := retrySeconds(wait)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		again(http.StatusTooManyRequests, "too many failed authentications from this address: retry in "+strconv.Itoa(secs)+
			" s; until then every login is refused, a correct one included")
		return
	}
	if msg := checkOperator(operator); msg != "" {
		again(http.StatusBadRequest, msg)
		return
	}
	token := r.PostForm.Get("token")
	if !h.checkToken(r, client, token, true, token != "") {
		again(http.StatusUnauthorized, "wrong token")
		return
	}
	id, _ := c.sessions.create(operator)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	h.opts.Logger.Info("console login", "operator", operator, "remote_addr", r.RemoteAddr, "user_agent", r.UserAgent())
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// checkOperator says what is wrong with an operator name, "" when
// nothing is.
func checkOperator(name string) string {
	switch {
	case name == "":
		return "your name is required: it is the operator of your actions in the audit log"
	case len(name) > 128:
		return "your name is longer than 128 bytes"
	case !utf8.ValidString(name):
		return "your name is not UTF-8 text"
	case strings.ContainsFunc(name, isControl):
		return "your name holds a control character"
	}
	return ""
}

// maxReason bounds an act's reason, in bytes: the audit log has it once
// per key, a thousand times for a bulk release of a thousand keys.
const maxReason = 1000

// checkReason says what is wrong with an act's reason, "" when nothing
// is: it is required, at most maxReason bytes of UTF-8 text without a
// control character.
func checkReason(reason string) string {
	switch {
	case reason == "":
		return "a reason is required"
	case len(reason) > maxReason:
		return "the reason is longer than " + thousands(maxReason) + " bytes"
	case !utf8.ValidString(reason):
		return "the reason is not UTF-8 text"
	case strings.ContainsFunc(reason, isControl):
		return "the reason holds a control character"
	}
	return ""
}

// isControl reports whether r is a control character, or a bidirectional
// control, which would show an audit line, or the operator's name on a
// page, other than it is.
func isControl(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }

func (c *console) logout(w http.ResponseWriter, r *http.Request, se *session) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.sessions.end(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: -1})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}
