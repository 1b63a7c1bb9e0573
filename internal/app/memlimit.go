package app

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/idemproxy/idemproxy/config"
)

// cgroupMemoryMax is the cgroup v2 file holding the container's memory
// limit.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// envMemoryLimit is the soft memory limit the runtime took from GOMEMLIMIT
// at start (math.MaxInt64 without it), read before the program sets its
// own: once memory_limit was applied, the runtime's current limit is no
// longer GOMEMLIMIT's, and a reload back to memory_limit: 0 must restore it.
var envMemoryLimit = debug.SetMemoryLimit(-1)

// memoryLimit chooses the Go runtime's soft memory limit: the
// configuration's memory_limit, else GOMEMLIMIT (already applied by the
// runtime), else 80% of the cgroup limit in cgroupFile (the rest is left for
// what the runtime does not count: mapped files, Badger's tables), else
// config.DefaultMemoryLimit. It returns the limit (math.MaxInt64: none) and
// where it came from.
func memoryLimit(configured int64, getenv func(string) string, cgroupFile string) (int64, string) {
	switch {
	case configured == -1:
		return math.MaxInt64, "memory_limit: -1 (none)"
	case configured > 0:
		return configured, "memory_limit"
	case getenv("GOMEMLIMIT") != "":
		return envMemoryLimit, "GOMEMLIMIT"
	}
	if b, err := os.ReadFile(cgroupFile); err == nil {
		s := strings.TrimSpace(string(b))
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
			return max(n/10*8, config.MinMemoryLimit), "80% of the cgroup limit " + s
		}
	}
	return config.DefaultMemoryLimit, "default"
}

// applyMemoryLimit sets the soft memory limit for cfg and says which.
func (a *app) applyMemoryLimit(cfg *config.Config) {
	limit, from := memoryLimit(cfg.MemoryLimit, a.getenv, cgroupMemoryMax)
	debug.SetMemoryLimit(limit)
	// The admission's memory bound: the soft limit when it stands for a
	// real one (a container's, or the operator's), not the default,
	// which a large Badger store's live heap passes in normal operation.
	a.heapBound = 0
	if from != "default" && limit != math.MaxInt64 {
		a.heapBound = limit
	}
	a.conns.SetHeapBound(a.heapBound)
	v := "none"
	if limit != math.MaxInt64 {
		v = fmt.Sprintf("%d MiB", limit>>20)
	}
	a.log.Info("memory limit", "soft_limit", v, "from", from)
}
