//go:build !linux

package badger

import "time"

// trimmer does nothing where there is no MADV_PAGEOUT: the kernel keeps
// the mapped tables' pages until it needs the memory.
type trimmer struct{}

func newTrimmer(string) *trimmer { return &trimmer{} }

func (*trimmer) trim() (int64, error) { return 0, nil }

func (*trimmer) poll(time.Time) error { return nil }

func (*trimmer) close() {}
