package app

import (
	"log/slog"

	"github.com/idemproxy/idemproxy/config"
)

// fdReserve is the part of the open files limit kept for what is neither
// a client nor an upstream connection: the store's files (Badger's tables
// and logs) or its pool (Redis, PostgreSQL), the listeners, the process's
// own files.
const fdReserve = 256

// descriptorsNeeded is how many descriptors the configured bounds may take
// at once: each client connection of server.max_connections with an
// upstream connection of its own, the admin listener's
// admin.max_connections, the one connection each listener holds while it
// waits for a slot, and fdReserve. A limit below it lets load on one side
// take descriptors the other needs ("too many open files" on accept, or
// towards the upstream: a 502).
func descriptorsNeeded(cfg *config.Config) uint64 {
	n := uint64(2*cfg.Server.MaxConnections) + 1 + fdReserve
	if cfg.Admin.Listen != "" {
		n += uint64(cfg.Admin.MaxConnections) + 1
	}
	return n
}

// checkDescriptors warns when the open files limit is below what the
// configured bounds may take (descriptorsNeeded).
func checkDescriptors(log *slog.Logger, cfg *config.Config, limit uint64, known bool) {
	if !known {
		return
	}
	if need := descriptorsNeeded(cfg); limit < need {
		log.Warn("the open files limit is below what the connection limits may take: lower server.max_connections "+
			"(each client connection may hold an upstream connection too) or raise the limit (ulimit -n, the container's nofile)",
			"limit", limit, "needed", need, "server.max_connections", cfg.Server.MaxConnections,
			"admin.max_connections", cfg.Admin.MaxConnections, "reserve", fdReserve)
	}
}
