// Command idemproxy is a sidecar reverse proxy that makes an unmodified HTTP
// service idempotent: the same request, delivered twice, is processed once.
//
// Usage:
//
//	idemproxy -config config.yaml          run the proxy
//	idemproxy -config config.yaml -check   validate the configuration and exit
//	idemproxy -healthcheck URL             exit 0 if URL answers 200 (container health checks)
//	idemproxy keys list ROUTE -state in_doubt   list keys through the admin API
//	idemproxy store accept-loss -config FILE    accept that the store lost its keys
//	idemproxy store check -config FILE          say why the Badger store does not open
//	idemproxy store quarantine -config FILE     move its damaged log segments aside
//	idemproxy -version                     print the version, the commit and its date
//
// What it does lives in packages named for their jobs: internal/app/cli
// parses the command line, internal/app runs the proxy; CONTRIBUTING.md
// has the map.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemproxy/idemproxy/internal/app"
	"github.com/idemproxy/idemproxy/internal/app/cli"
)

func main() {
	// A write to stderr after its reader went away (a log shipper that
	// died) would otherwise kill the process with SIGPIPE and cut every
	// request in flight; ignored, the write fails and the log sink drops
	// the line.
	signal.Ignore(syscall.SIGPIPE)
	ctx, _ := app.StopOnSignal(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	os.Exit(cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}
