package badger

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// sizeTTL is how long a measurement of the files is reused: a scrape reads
// both gauges, and a store of many tables should not be listed twice.
const sizeTTL = 10 * time.Second

// sizeCache holds the last measurement of the data directory.
type sizeCache struct {
	mu        sync.Mutex
	at        time.Time
	lsm, vlog int64
}

// Sizes returns the LSM tree's size (the .sst files) and the value log's
// size (the .vlog files) on disk, in bytes, measured at most sizeTTL ago.
// Badger's own DB.Size reports 0, 0 while its metrics are off (they cost a
// lock on every operation), so the store lists the directories itself, as
// Badger does when its metrics are on. A directory that cannot be read
// counts as empty.
func (s *Store) Sizes() (lsm, vlog int64) {
	c := &s.sizes
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); c.at.IsZero() || now.Sub(c.at) >= sizeTTL {
		o := s.db.Opts()
		c.lsm, c.vlog = dirSizes(o.Dir, o.ValueDir)
		c.at = now
	}
	return c.lsm, c.vlog
}

// dirSizes sums the sizes of the .sst and .vlog files in the given
// directories (each directory once).
func dirSizes(dirs ...string) (lsm, vlog int64) {
	seen := map[string]bool{}
	for _, dir := range dirs {
		if dir == "" || seen[filepath.Clean(dir)] {
			continue
		}
		seen[filepath.Clean(dir)] = true
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			isSST, isVlog := strings.HasSuffix(name, ".sst"), strings.HasSuffix(name, ".vlog")
			if !e.Type().IsRegular() || (!isSST && !isVlog) {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // removed by a compaction since the listing
			}
			if isSST {
				lsm += info.Size()
			} else {
				vlog += info.Size()
			}
		}
	}
	return lsm, vlog
}
