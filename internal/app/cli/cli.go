// Package cli is idemproxy's command line: it parses the flags, runs a
// subcommand (keys, store) or the proxy, and returns the exit status.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/app"
	"github.com/idemproxy/idemproxy/internal/app/buildinfo"
	"github.com/idemproxy/idemproxy/internal/app/keyscmd"
	"github.com/idemproxy/idemproxy/internal/app/logsink"
	"github.com/idemproxy/idemproxy/internal/lograte"
	"github.com/idemproxy/idemproxy/internal/tracing"
	"github.com/idemproxy/idemproxy/proxy"
)

// Run is the whole program; it returns the exit status: 0 after a clean
// stop, 1 on a failure, 2 on bad usage.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 && args[0] == "keys" {
		return keyscmd.Run(ctx, args[1:], stdout, stderr, getenv)
	}
	if len(args) > 0 && args[0] == "reload" {
		return keyscmd.RunReload(ctx, args[1:], stdout, stderr, getenv)
	}
	if len(args) > 0 && args[0] == "store" {
		return app.RunStore(ctx, args[1:], stdout, stderr, getenv)
	}
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs) }
	configFlag := fs.String("config", "", "configuration `file` (default $"+config.PathEnv+", else ./config.yaml)")
	check := fs.Bool("check", false, "validate the configuration, print every problem, and exit")
	healthURL := fs.String("healthcheck", "", "probe `URL` (e.g. http://127.0.0.1:9091/livez) and exit 0 if it answers 200, 1 otherwise")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version, the commit and its date, and exit")
	listen := fs.String("listen", "", "the `address` clients connect to, in place of the file's listen (default $"+config.ListenEnv+", else the file's)")
	adminListen := fs.String("admin-listen", "", "the admin listener's `address`, in place of the file's admin.listen (default $"+config.AdminListenEnv+", else the file's)")
	upstream := fs.String("upstream", "", "the protected service's base `URL`, in place of the file's upstream (default $"+config.UpstreamEnv+", else the file's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemproxy: unexpected arguments: %v (see idemproxy -h)\n", fs.Args())
		return 2
	}
	switch {
	case *showVersion:
		buildinfo.Print(stdout)
		return 0
	case *healthURL != "":
		return healthcheck(*healthURL, stderr)
	}
	sink := logsink.New(stderr)
	defer sink.Flush()
	log, err := newLogger(sink, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy: %v\n", err)
		return 2
	}
	defer log.Handler().(*lograte.Handler).Flush() // the counts of the last interval, before the sink's last lines
	var access *proxy.AccessLog
	if log.Enabled(ctx, slog.LevelInfo) {
		access, _ = proxy.NewAccessLog(sink.Lines(), *logFormat) // the format was checked by newLogger
	}
	configPath, from := config.PathOf(*configFlag, getenv)
	overrides := config.OverridesOf(*listen, *adminListen, *upstream, getenv)
	cfg, err := config.LoadWith(configPath, overrides)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy: %s: %v\n", configPath, err)
		if errors.Is(err, iofs.ErrNotExist) {
			fmt.Fprintf(stderr, "idemproxy: the configuration path comes from %s. Start from config.example.yaml, "+
				"the reference of every option (in the repository, %s, and in the container image, "+
				"/etc/idemproxy/config.example.yaml): copy it to config.yaml and edit it, or name a file with -config\n",
				from, exampleConfigURL)
		}
		return 1
	}
	if *check {
		// Warnings, not problems: a host that does not resolve yet may
		// (DNS in a container can come after the proxy).
		for _, w := range cfg.HostWarnings(ctx, nil) {
			fmt.Fprintf(stderr, "idemproxy: %s: warning: %s\n", configPath, w)
		}
		if cfg.Tracing.Enabled {
			// The proxy would refuse to start with them.
			if err := tracing.CheckEnv(); err != nil {
				fmt.Fprintf(stderr, "idemproxy: %s: tracing.enabled: the environment: %v\n", configPath,
					strings.ReplaceAll(err.Error(), "\n", "; "))
				return 1
			}
		}
		// The store, when it can be reached: would a route start its
		// keyspace anew while the store holds live keys made before?
		if !app.CheckKeyspaces(ctx, cfg, configPath, getenv, stderr) {
			return 1
		}
		if given := overrides.Given(); len(given) > 0 {
			fmt.Fprintf(stdout, "%s: ok (%d routes) with %s\n", configPath, len(cfg.Routes), strings.Join(given, ", "))
			return 0
		}
		fmt.Fprintf(stdout, "%s: ok (%d routes)\n", configPath, len(cfg.Routes))
		return 0
	}
	if err := app.Serve(ctx, app.Options{Log: log, Access: access, Path: configPath, Config: cfg, Overrides: overrides, Getenv: getenv}); err != nil {
		log.Error("idemproxy failed", "err", err)
		return 1
	}
	return 0
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationsAsText}
	var h slog.Handler
	switch format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("-log-format: %q is not json or text", format)
	}
	// A failure that hits every request (a full disk, a store that is
	// down) must not write a line per request: repeated warnings and
	// errors are logged at a bounded rate, with the count of those left
	// out. The access log is written apart and never limited.
	return slog.New(lograte.New(h, lograte.Options{})), nil
}

// durationsAsText logs a duration as Go writes it ("30s", "1.5ms") instead
// of slog's JSON default, a number of nanoseconds.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// healthcheck probes url, for container health checks in images without a
// shell.
func healthcheck(url string, stderr io.Writer) int {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintf(stderr, "idemproxy: healthcheck: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "idemproxy: healthcheck: %s answered %s\n", url, resp.Status)
		return 1
	}
	return 0
}
