package app

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// configEnv names the environment variable that gives the configuration
// path when -config is not given.
const configEnv = "IDEMPROXY_CONFIG"

// exampleConfigURL is where a user without the repository finds the
// documented example configuration.
const exampleConfigURL = "https://github.com/idemproxy/idemproxy/blob/main/config.example.yaml"

// configPathOf returns the configuration path, from -config, else from
// IDEMPROXY_CONFIG, else ./config.yaml, and says where it came from.
func configPathOf(flagValue string, getenv func(string) string) (path, from string) {
	switch {
	case flagValue != "":
		return flagValue, "-config"
	case getenv(configEnv) != "":
		return getenv(configEnv), "$" + configEnv
	}
	return "config.yaml", "the default, ./config.yaml (neither -config nor $" + configEnv + " is set)"
}

// usage writes -h's answer: what the binary does, examples, where the
// example configuration is, then the subcommands and the flags.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, `idemproxy is a sidecar reverse proxy that makes an HTTP service idempotent: a
request retried with the same idempotency key reaches the service once, and the
retry gets the stored answer.

Examples:
  idemproxy -config config.yaml           run the proxy
  idemproxy -config config.yaml -check    validate the configuration and exit
  IDEMPROXY_ADMIN_TOKEN=... idemproxy keys list charges -state in_doubt

Configuration: -config, else $%s, else ./config.yaml. Start from
config.example.yaml, the reference of every option: at the root of the
repository (%s)
and at /etc/idemproxy/config.example.yaml in the container image.

Usage:
  idemproxy [flags]
  idemproxy keys list|show|release|reconcile ...   keys through the admin API (idemproxy keys -h)
  idemproxy store accept-loss -config FILE ...     accept that the store lost its keys (idemproxy store -h)
  idemproxy store check -config FILE              say why the Badger store does not open
  idemproxy store quarantine -config FILE ...      move its damaged log segments aside (idemproxy store -h)

Flags:
`, configEnv, exampleConfigURL)
	fs.PrintDefaults()
}

// stopSignal is the cause of the context StopOnSignal cancels: the signal
// that asked the program to stop.
type stopSignal struct{ sig os.Signal }

func (s stopSignal) Error() string { return signalName(s.sig) + " received" }

// StopOnSignal returns a context cancelled, with a stopSignal as its cause
// (context.Cause), when one of sigs arrives. Later signals are ignored
// until stop is called, as with signal.NotifyContext.
func StopOnSignal(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case s := <-ch:
			cancel(stopSignal{s})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel(nil) }
}

// signalName names a signal as kill(1) does: SIGTERM, SIGINT.
func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return s.String()
}

// stopReason names why ctx ended, for the shutdown log: the signal, or
// the context's error.
func stopReason(ctx context.Context) string {
	if s, ok := context.Cause(ctx).(stopSignal); ok {
		return signalName(s.sig)
	}
	if err := context.Cause(ctx); err != nil {
		return err.Error()
	}
	return ""
}
