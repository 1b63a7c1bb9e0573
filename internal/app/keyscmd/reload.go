package keyscmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/config"
)

const reloadUsage = `Usage:
  idemproxy reload [-admin URL] [-token-env VARIABLE]

reload asks a running idemproxy to read its configuration file again and
apply it (POST /-/reload on its admin listener), as SIGHUP does: a file that
does not load, or that changes what only a restart applies, keeps the
running configuration, and reload says why. In a container without a shell
or curl: kubectl exec POD -c idemproxy -- /usr/local/bin/idemproxy reload.

It calls the admin API at -admin (default $` + adminURLEnv + `, else
http:// and $` + config.AdminListenEnv + `, else ` + defaultAdminURL + `) with the
bearer token of $` + config.DefaultAdminTokenEnv + ` (or of the variable -token-env
names, as admin.token_env does).
Exit status: 0 reloaded, 1 the reload failed or the API could not be
reached, 2 bad usage.

Flags:
`

// adminURLOf is the admin API's URL when -admin is not given: the
// variable that names it, else the admin listener's address that the
// proxy itself takes from its variable, else config.example.yaml's.
func adminURLOf(getenv func(string) string) string {
	if u := getenv(adminURLEnv); u != "" {
		return u
	}
	if addr := getenv(config.AdminListenEnv); addr != "" {
		return "http://" + addr
	}
	return defaultAdminURL
}

// newCmd returns the flag set of a command of the admin API, name
// ("idemproxy keys"), whose -h prints usage, and the command its -admin
// flag fills, with its -token-env flag (connect completes the command once
// the flags are parsed).
func newCmd(name, usage string, stdout, stderr io.Writer, getenv func(string) string) (*flag.FlagSet, *keysCmd, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	c := &keysCmd{name: name, stdout: stdout, stderr: stderr, client: &http.Client{Timeout: 30 * time.Second}}
	fs.StringVar(&c.admin, "admin", adminURLOf(getenv), "admin API `URL`")
	tokenEnv := fs.String("token-env", config.DefaultAdminTokenEnv, "environment `variable` holding the admin token")
	return fs, c, tokenEnv
}

// connect completes c once its flags are parsed: the admin URL with a
// scheme, and the token of the variable tokenEnv. It returns what is
// wrong, for a usage error, or "".
func (c *keysCmd) connect(tokenEnv string, getenv func(string) string) string {
	if !strings.Contains(c.admin, "://") {
		c.admin = "http://" + c.admin
	}
	c.admin = strings.TrimRight(c.admin, "/")
	if c.token = getenv(tokenEnv); c.token == "" {
		return tokenEnv + " is not set: export the admin token the proxy reads (admin.token_env)"
	}
	return ""
}

// RunReload runs "idemproxy reload" with args (after "reload") and returns
// the exit status: 0 on success, 1 on a failure, 2 on bad usage.
func RunReload(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs, c, tokenEnv := newCmd("idemproxy reload", reloadUsage, stdout, stderr, getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemproxy reload: unexpected arguments: %v (see idemproxy reload -h)\n", fs.Args())
		return 2
	}
	if msg := c.connect(*tokenEnv, getenv); msg != "" {
		fmt.Fprintf(stderr, "idemproxy reload: %s (see idemproxy reload -h)\n", msg)
		return 2
	}
	c.output = "table"
	return c.call(ctx, http.MethodPost, "/-/reload", nil, func(body []byte) error {
		_, err := fmt.Fprintln(c.stdout, strings.TrimSpace(string(body)))
		return err
	})
}
