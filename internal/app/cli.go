package app

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemproxy/idemproxy/config"
)

// warnUnresolvedHosts logs a warning for each host of cfg that does not
// resolve (config.HostWarnings: the upstream's), as -check prints them: a
// name that does not resolve yet is no reason not to start, but the
// operator learns why the upstream's requests fail.
func warnUnresolvedHosts(ctx context.Context, log *slog.Logger, cfg *config.Config) {
	for _, w := range cfg.HostWarnings(ctx, nil) {
		log.Warn("a host of the configuration does not resolve", "warning", w)
	}
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
