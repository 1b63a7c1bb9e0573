package app

import (
	"context"
	"crypto/sha256"
	"os"
	"time"
)

// watchConfig applies config.watch until ctx ends: every interval, while
// the running configuration has it on, it reads the file and reloads when
// its content differs from the content last read (by the start or any
// reload). Reading the content, not watching the file's events, sees
// every way a file is replaced: written in place, renamed over, or a
// Kubernetes ConfigMap volume's swap of its ..data symlink, where the
// file's own path never changes. A file that does not load is logged and
// counted once per content, and the running configuration is kept.
func (a *app) watchConfig(ctx context.Context, interval time.Duration) {
	if b, err := os.ReadFile(a.path); err == nil {
		a.mu.Lock()
		a.loadedSum = sha256.Sum256(b)
		a.mu.Unlock()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var unreadable string // the last read error logged, to log it once
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		on, loaded := a.cfg.File.Watch, a.loadedSum
		a.mu.Unlock()
		if !on {
			continue
		}
		b, err := os.ReadFile(a.path)
		if err != nil {
			if err.Error() != unreadable {
				unreadable = err.Error()
				a.reloads.WithLabelValues(reloadByWatch, "failed").Inc()
				a.log.Error("config.watch: the configuration file cannot be read; the running configuration is kept",
					"config", a.path, "err", err)
			}
			continue
		}
		unreadable = ""
		if sha256.Sum256(b) != loaded {
			a.reload(reloadByWatch)
		}
	}
}
