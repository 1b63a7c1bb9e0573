//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/idemproxy/idemproxy/internal/testenv/powerloss"
)

// powerDisk is the Badger proxy's data directory on the power-loss file
// system (internal/testenv/powerloss): dir is the disk, mnt what the proxy opens.
// The run serves the mount; the proxy, a child process, maps its files.
type powerDisk struct {
	dir, mnt string
	opts     powerloss.Options
	fs       *powerloss.FS // nil while the power is off
}

// newPowerDisk mounts the power-loss file system over dir on mnt. It needs
// root and /dev/fuse.
// powerOptions are the power-loss file system's options of a run: -writeback
// and -harsh, the pages drawn from the seed.
func powerOptions(o options) powerloss.Options {
	return powerloss.Options{Writeback: o.writeback, Harsh: o.harsh, Seed: uint64(o.seed)}
}

func newPowerDisk(dir, mnt string, opts powerloss.Options) (*powerDisk, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("power-loss needs root (a FUSE mount)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("power-loss needs /dev/fuse: %w", err)
	}
	d := &powerDisk{dir: dir, mnt: mnt, opts: opts}
	return d, d.mount()
}

// mount mounts the disk again after a power cut; it does nothing if it is
// mounted.
func (d *powerDisk) mount() error {
	if d.fs != nil {
		return nil
	}
	d.opts.Seed++ // each mount draws its own pages
	fs, err := powerloss.Mount(d.dir, d.mnt, d.opts)
	if err != nil {
		return err
	}
	d.fs = fs
	return nil
}

// cut cuts the power: the mount's connection is aborted and the disk keeps
// only what was synced.
func (d *powerDisk) cut() error {
	if d.fs == nil {
		return nil
	}
	err := d.fs.PowerOff()
	d.fs = nil
	return err
}

// close unmounts cleanly (the proxy has stopped), or cuts the power if the
// mount is still busy.
func (d *powerDisk) close() error {
	if d.fs == nil {
		return nil
	}
	if err := d.fs.Unmount(); err != nil {
		return errors.Join(err, d.cut())
	}
	d.fs = nil
	return nil
}
