package badger

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync makes f's data durable, and the metadata needed to read it
// back, with fdatasync(2): the reservation log's segments never change
// size, so that is one flush of the written pages.
func fdatasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
