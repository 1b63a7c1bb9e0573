package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Checking and quarantining a store that does not open.
//
// Open refuses a store whose reservation log is damaged (ErrLogDamaged)
// rather than start without the reservations the damaged records held.
// Check reports what is wrong without changing anything, and Quarantine
// moves the damaged log segments aside, after which the store opens with
// the records before the damage.

// ErrLogDamaged is wrapped by Open's error, and reported by Check, when a
// record of the reservation log fails its checksum and valid records
// follow it: damage, not a torn tail.
var ErrLogDamaged = errors.New("the reservation log is damaged")

// quarantineDirName is where Quarantine moves segments, inside the store's
// directory.
const quarantineDirName = "idemproxy-wal-quarantine"

// Damage is one damaged place in the reservation log.
type Damage struct {
	// Segment is the damaged segment's path.
	Segment string
	// Offset is the byte offset of the first bad record in it.
	Offset int64
	// Seq is the sequence number the bad record should have carried.
	Seq uint64
	// Detail says what is wrong, for a person.
	Detail string
}

// Report is what Check found in a store directory.
type Report struct {
	// Dir is the store's directory.
	Dir string
	// Segments and Records count the log's segments and the valid records
	// before any damage.
	Segments, Records int
	// Damage lists the damaged places; empty when the log is sound.
	Damage []Damage
}

// OK reports whether r found nothing wrong.
func (r Report) OK() bool { return len(r.Damage) == 0 }

// Check reads the reservation log of the store in dir and reports damage.
// It changes nothing and does not open Badger. Its error is for a log it
// could not read at all (a permission error, say).
func Check(dir string) (Report, error) {
	rep := Report{Dir: dir}
	walDir := filepath.Join(dir, walDirName)
	nums, err := walSegments(walDir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("read the reservation log: %w", err)
	}
	rep.Segments = len(nums)
	files := make([]segmentFile, len(nums))
	for i, n := range nums {
		name := filepath.Join(walDir, segmentName(n))
		f, err := os.Open(name)
		if err != nil {
			return rep, fmt.Errorf("read the reservation log: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return rep, fmt.Errorf("read the reservation log: %w", err)
		}
		files[i] = segmentFile{name: name, r: f, size: fi.Size()}
	}
	if err := checkSegments(files); err != nil {
		rep.Damage = append(rep.Damage, Damage{Detail: err.Error()})
	}
	return rep, nil
}

// Quarantined is what Quarantine moved aside.
type Quarantined struct {
	// Dir is the directory the segments were moved to.
	Dir string
	// Segments are the moved segments' original paths.
	Segments []string
}

// Quarantine moves the damaged segments of the store's reservation log in
// dir, and every later one, into a new directory under
// <dir>/idemproxy-wal-quarantine/, named for now. It does nothing (and
// returns a zero Quarantined) when Check finds no damage. The store must
// not be open.
func Quarantine(dir string, now time.Time) (Quarantined, error) {
	return Quarantined{}, errors.New("badger: quarantine is not implemented yet")
}
