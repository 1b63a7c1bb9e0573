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
//	upstream-stub [-listen 127.0.0.1:9000] [-addr-file PATH] [-shutdown-timeout 10s] [-log-level INFO]
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

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))

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
	logger.Info("listening", "addr", addr)
	if cfg.addrFile != "" {
		if err := writeAddrFile(cfg.addrFile, addr); err != nil {
			ln.Close()
			return err
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

	logger.Info("shutting down", "timeout", cfg.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// writeAddrFile writes addr to path atomically, so a reader polling for the
// file never sees it half written.
func writeAddrFile(path, addr string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".addr-*")
	if err != nil {
		return fmt.Errorf("write addr file: %w", err)
	}
	defer os.Remove(tmp.Name()) // A no-op once renamed.
	if _, err := tmp.WriteString(addr + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("write addr file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write addr file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write addr file: %w", err)
	}
	return nil
}
