// Command upstream-stub is a deliberately non-idempotent charge service for
// idemproxy's README, tests and benchmarks.
//
// Every POST /charges records a new charge with a new chargeId, even for an
// order it has already charged, so a repeated request is a double charge.
// Faults can be injected from outside (POST /faults or the X-Stub-Fault
// header) to reproduce the failures idemproxy has to survive: a failure
// before or after the charge, a late answer, a dropped connection and a 429.
//
// Usage:
//
//	upstream-stub [-listen 127.0.0.1:9000] [-addr-file PATH] [-pid-file PATH] [-shutdown-timeout 10s]
//	              [-log-format json|text] [-log-level INFO]
//
// It logs as idemproxy does (JSON lines from log/slog by default), so the
// two can share a terminal. From a script, stop it with
// kill $(cat PID-FILE): under go run, $! and %1 name the go command, not
// the stub.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/upstream-stub/stub"
)

// Server timeouts. The delay fault extends the read and write deadlines of
// its own connection, so a long injected delay is not cut short by them.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 120 * time.Second
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// config is the parsed command line.
type config struct {
	listen          string
	addrFile        string
	pidFile         string
	logFormat       string
	shutdownTimeout time.Duration
	logLevel        slog.Level
}

// run parses args, serves until ctx is done or the process gets SIGTERM or
// SIGINT, shuts down gracefully and returns the exit code: 0 on a clean stop,
// 1 on a runtime failure and 2 on a usage error. Help goes to stdout; logs and
// usage errors go to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "upstream-stub: %v\n", err)
		return 2
	}

	logger := newLogger(stderr, cfg.logFormat, cfg.logLevel)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := serve(ctx, logger, cfg); err != nil {
		logger.Error("upstream-stub failed", "err", err)
		return 1
	}
	return 0
}

// parseFlags parses the command line. On -h it prints the usage to stdout and
// returns flag.ErrHelp.
func parseFlags(args []string, stdout io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("upstream-stub", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:9000", "address to listen on (port 0 picks a free port)")
	fs.StringVar(&cfg.addrFile, "addr-file", "", "if set, write the actual listen address to this file once listening")
	fs.StringVar(&cfg.pidFile, "pid-file", "", "if set, write the process ID to this file once listening (for kill $(cat FILE)), and remove it on a clean stop")
	fs.StringVar(&cfg.logFormat, "log-format", "json", "log format: json (as idemproxy's) or text")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown waits for in-flight requests")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")

	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fmt.Fprintln(stdout, "Usage: upstream-stub [flags]")
		fs.PrintDefaults()
		return cfg, err
	}
	if err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.logFormat != "json" && cfg.logFormat != "text" {
		return cfg, fmt.Errorf("-log-format: %q is not json or text", cfg.logFormat)
	}
	if cfg.shutdownTimeout <= 0 {
		return cfg, fmt.Errorf("-shutdown-timeout must be positive, got %v", cfg.shutdownTimeout)
	}
	return cfg, nil
}

// newHTTPServer returns the HTTP server for handler, with its timeouts set.
func newHTTPServer(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// serve listens on cfg.listen, logs the actual address, serves until ctx is
// done and then shuts the server down within cfg.shutdownTimeout.
func serve(ctx context.Context, logger *slog.Logger, cfg config) error {
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().String()
	// The log line comes before the address file: whoever waits for the
	// file (a test, a script) finds the line already written.
	logger.Info("upstream-stub listening", "addr", addr, "pid", os.Getpid())
	if cfg.pidFile != "" {
		if err := writeFileAtomic(cfg.pidFile, strconv.Itoa(os.Getpid())); err != nil {
			ln.Close()
			return fmt.Errorf("write pid file: %w", err)
		}
	}
	if cfg.addrFile != "" {
		if err := writeFileAtomic(cfg.addrFile, addr); err != nil {
			ln.Close()
			return fmt.Errorf("write addr file: %w", err)
		}
	}

	srv := newHTTPServer(stub.New(logger), logger)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	logger.Info("upstream-stub shutting down", "timeout", cfg.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	if cfg.pidFile != "" {
		os.Remove(cfg.pidFile)
	}
	logger.Info("upstream-stub stopped")
	return nil
}

// newLogger returns the stub's logger: JSON lines by default, as
// idemproxy's, with durations written as Go writes them ("10s").
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// writeFileAtomic writes a line to path atomically, so a reader polling
// for the file never sees it half written.
func writeFileAtomic(path, line string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // A no-op once renamed.
	if _, err := tmp.WriteString(line + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
