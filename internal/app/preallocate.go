package app

import (
	"fmt"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/prealloc"
	"github.com/idemproxy/idemproxy/store/badger"
)

// notPreallocated is the warning of a Badger store whose files are not
// preallocated, for whatever reason.
const notPreallocated = "files are not preallocated: a disk that fills between two free-space checks can crash the store"

// preallocate applies store.badger.preallocate, before the store opens
// (and before anything could make a failure to open it less than fatal):
// off installs nothing, auto installs the supervisor where the kernel
// allows it and warns where it does not, required returns an error naming
// the field and why it could not be installed. With a Redis or PostgreSQL
// store it does nothing. It also warns when the data directory is on a
// copy-on-write file system, where preallocation does not hold.
func (a *app) preallocate() error {
	b := a.cfg.Store.Badger
	if b == nil {
		return nil
	}
	if b.Preallocate == config.PreallocateOff {
		a.log.Warn(notPreallocated, "reason", "store.badger.preallocate is off")
		return nil
	}
	if fs := prealloc.CopyOnWrite(b.Dir); fs != "" {
		a.log.Warn("the data directory is on a copy-on-write file system: preallocation does not reserve the space of overwrites there, and a disk that fills can still crash the store",
			"badger_dir", b.Dir, "fs", fs, "preallocate", b.Preallocate)
	}
	err := badger.Preallocate(a.log)
	switch {
	case err == nil:
		return nil
	case b.Preallocate == config.PreallocateRequired:
		return fmt.Errorf("store.badger.preallocate is required, but the files Badger grows cannot be preallocated here: %w", err)
	}
	a.log.Warn(notPreallocated, "err", err)
	return nil
}
