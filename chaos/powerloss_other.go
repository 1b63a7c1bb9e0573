//go:build !linux

package main

import "errors"

// powerDisk needs Linux's FUSE (internal/powerloss); elsewhere the
// power-loss fault is refused.
type powerDisk struct{}

type powerOpts struct{}

func powerOptions(o options) powerOpts { return powerOpts{} }

func newPowerDisk(dir, mnt string, opts powerOpts) (*powerDisk, error) {
	return nil, errors.New("power-loss needs Linux (a FUSE mount)")
}

func (d *powerDisk) mount() error { return errors.New("power-loss needs Linux") }
func (d *powerDisk) cut() error   { return nil }
func (d *powerDisk) close() error { return nil }
