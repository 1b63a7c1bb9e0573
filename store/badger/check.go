package badger

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Checking and quarantining a store that does not open.
//
// Open refuses a store whose reservation log is damaged (errLogDamaged)
// rather than start without the reservations the damaged records held.
// Check reports what is wrong without changing anything, and Quarantine
// moves the damaged log segments aside, after which the store opens with
// the records before the damage.

// errLogDamaged is wrapped by Open's error, and reported by Check, when a
// record of the reservation log fails its checksum and valid records
// follow it: damage, not a torn tail.
var errLogDamaged = errors.New("the reservation log is damaged")

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
	// SetAside counts the valid records after the first damage: those
	// Quarantine moves aside with the segments that hold them (zero when
	// there is no damage).
	SetAside int
	// Damage lists the damaged places; empty when the log is sound.
	Damage []Damage
}

// OK reports whether r found nothing wrong.
func (r Report) OK() bool { return len(r.Damage) == 0 }

// quarantineLockWait is how long Quarantine waits for the lock Badger
// takes on the store's directory: a proxy whose store does not open takes
// it for a moment each time it tries again.
var quarantineLockWait = 10 * time.Second

// checkLog reads the log in dir/idemproxy-wal without changing anything.
// Not opening Badger, it judges the log with the sequence number of the
// checkpoint file (walCheckpointName): it can report damage among records
// that Badger already holds, which Open passes over.
func checkLog(dir string) (rep Report, files []segmentFile, scan logScan, closeAll func(), err error) {
	rep = Report{Dir: dir}
	closeAll = func() {}
	walDir := filepath.Join(dir, walDirName)
	nums, err := walSegments(walDir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil, scan, closeAll, nil
	}
	if err != nil {
		return rep, nil, scan, closeAll, fmt.Errorf("read the reservation log: %w", err)
	}
	rep.Segments = len(nums)
	files, closeAll, err = openSegments(walDir, nums)
	if err != nil {
		return rep, nil, scan, func() {}, err
	}
	var floor uint64
	if c := readCheckpoint(walDir); c > 0 {
		floor = c - 1
	}
	scan, err = scanLog(files, floor)
	if err != nil {
		closeAll()
		return rep, nil, scan, func() {}, fmt.Errorf("read the reservation log: %w", err)
	}
	rep.Records, rep.SetAside, rep.Damage = scan.records, scan.after, scan.damage
	return rep, files, scan, closeAll, nil
}

// Check reads the reservation log of the store in dir and reports every
// damaged place in it. It changes nothing and does not open Badger, so it
// may run beside a store that failed to open. Its error is for a log it
// could not read at all (a permission error, say).
func Check(dir string) (Report, error) {
	rep, _, _, closeAll, err := checkLog(dir)
	closeAll()
	return rep, err
}

// Quarantined is what Quarantine moved aside.
type Quarantined struct {
	// Dir is the directory the segments were moved to.
	Dir string
	// Segments are the moved segments' original paths. The first is the
	// damaged one: in its place is a segment holding only its records
	// before the damage (none, and no file, when the damage is at its
	// start).
	Segments []string
	// Kept counts the valid records the log keeps, before the damage;
	// SetAside the valid records after it, moved aside.
	Kept, SetAside int
	// Resumed is set when Quarantine finished one that was interrupted
	// (a crash midway) instead of starting another.
	Resumed bool
}

// quarantinePlan is written, as quarantinePlanName, in the quarantine's
// directory before anything is moved, so that an interrupted quarantine
// is finished by the next run.
type quarantinePlan struct {
	// Damaged is the damaged segment's file name and Keep the bytes of it
	// kept (its records before the damage).
	Damaged string `json:"damaged"`
	Keep    int64  `json:"keep"`
	// Segments are the file names moved: Damaged (its original) first.
	Segments []string `json:"segments"`
	Kept     int      `json:"kept"`
	SetAside int      `json:"set_aside"`
	Damage   []Damage `json:"damage"`
}

const (
	quarantinePlanName = "quarantine.json"
	partialSuffix      = ".partial"
)

// quarantineStep, when set (tests), is called after each step of a
// quarantine; an error stops it there, as a crash would.
var quarantineStep func(step string) error

func step(name string) error {
	if quarantineStep != nil {
		return quarantineStep(name)
	}
	return nil
}

// Quarantine moves the damaged segment of the store's reservation log in
// dir, and every later one, into a new directory under
// <dir>/idemproxy-wal-quarantine/, named for now (UTC), the originals byte
// for byte, and writes in the damaged segment's place one holding only
// its valid records before the damage: the store then opens with every
// record before the damage. Files and directories are fsynced. It refuses
// while a process has the store open (it takes the lock Badger takes,
// waiting up to quarantineLockWait: errInUse). It
// does nothing (and returns a zero Quarantined) when Check finds no
// damage. Interrupted (a crash), it is finished by the next run, which
// reports Resumed.
func Quarantine(dir string, now time.Time) (Quarantined, error) {
	unlock, err := LockDir(dir, quarantineLockWait)
	if err != nil {
		return Quarantined{}, fmt.Errorf("badger: quarantine: %w", err)
	}
	defer unlock()
	qRoot := filepath.Join(dir, quarantineDirName)
	partial, plan, err := findPartial(qRoot)
	if err != nil {
		return Quarantined{}, fmt.Errorf("badger: quarantine: %w", err)
	}
	resumed := plan != nil
	if plan == nil {
		rep, files, scan, closeAll, err := checkLog(dir)
		closeAll()
		if err != nil {
			return Quarantined{}, fmt.Errorf("badger: quarantine: %w", err)
		}
		if rep.OK() {
			return Quarantined{}, nil
		}
		plan = &quarantinePlan{Damaged: filepath.Base(files[scan.damageSeg].name), Keep: scan.damageOff,
			Kept: scan.records, SetAside: scan.after, Damage: scan.damage}
		for _, sf := range files[scan.damageSeg:] {
			plan.Segments = append(plan.Segments, filepath.Base(sf.name))
		}
		if partial, err = startQuarantine(qRoot, now, plan); err != nil {
			return Quarantined{}, fmt.Errorf("badger: quarantine: %w", err)
		}
	}
	final, err := finishQuarantine(dir, qRoot, partial, plan)
	if err != nil {
		return Quarantined{}, fmt.Errorf("badger: quarantine: %w", err)
	}
	q := Quarantined{Dir: final, Kept: plan.Kept, SetAside: plan.SetAside, Resumed: resumed}
	for _, name := range plan.Segments {
		q.Segments = append(q.Segments, filepath.Join(dir, walDirName, name))
	}
	return q, nil
}

// findPartial returns an interrupted quarantine's directory and plan, if
// there is one. A directory without a plan was interrupted before
// anything was moved: it is removed.
func findPartial(qRoot string) (string, *quarantinePlan, error) {
	ents, err := os.ReadDir(qRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), partialSuffix) {
			continue
		}
		p := filepath.Join(qRoot, e.Name())
		b, err := os.ReadFile(filepath.Join(p, quarantinePlanName))
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.RemoveAll(p); err != nil {
				return "", nil, err
			}
			continue
		}
		if err != nil {
			return "", nil, err
		}
		var plan quarantinePlan
		if err := json.Unmarshal(b, &plan); err != nil || plan.Damaged == "" || len(plan.Segments) == 0 {
			return "", nil, fmt.Errorf("the plan of the interrupted quarantine %s does not read (%v): move it away", p, err)
		}
		return p, &plan, nil
	}
	return "", nil, nil
}

// checkQuarantineDone refuses to open a store whose quarantine was
// interrupted after its plan was written: segments may have been moved
// aside but the damaged one not yet cut back, so that the damage can read
// as a torn tail, and a log begun then would take the numbers of the
// segments moved aside, which finishing the quarantine moves again (over
// the originals). The quarantine is finished first (`idemproxy store
// quarantine` resumes it). A partial quarantine without a plan moved
// nothing.
func checkQuarantineDone(dir string) error {
	qRoot := filepath.Join(dir, quarantineDirName)
	ents, err := os.ReadDir(qRoot)
	if err != nil {
		return nil // none, or Quarantine reports it
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), partialSuffix) {
			continue
		}
		if _, err := os.Stat(filepath.Join(qRoot, e.Name(), quarantinePlanName)); err == nil {
			return fmt.Errorf("badger: open %s: the quarantine %s was interrupted: run idemproxy store quarantine again to finish it", dir, filepath.Join(qRoot, e.Name()))
		}
	}
	return nil
}

// startQuarantine makes the quarantine's directory (named for now, with
// the partial suffix until it is done) and writes plan in it, synced.
func startQuarantine(qRoot string, now time.Time, plan *quarantinePlan) (string, error) {
	if err := os.MkdirAll(qRoot, 0o700); err != nil {
		return "", err
	}
	if err := syncDir(filepath.Dir(qRoot)); err != nil {
		return "", err
	}
	base := now.UTC().Format("20060102T150405Z")
	name := base
	for i := 2; ; i++ {
		_, err1 := os.Stat(filepath.Join(qRoot, name))
		_, err2 := os.Stat(filepath.Join(qRoot, name+partialSuffix))
		if errors.Is(err1, fs.ErrNotExist) && errors.Is(err2, fs.ErrNotExist) {
			break
		}
		name = fmt.Sprintf("%s-%d", base, i)
	}
	partial := filepath.Join(qRoot, name+partialSuffix)
	if err := os.Mkdir(partial, 0o700); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(plan, "", "  ")
	if err != nil {
		return "", err
	}
	if err := writeSynced(filepath.Join(partial, quarantinePlanName), b); err != nil {
		return "", err
	}
	if err := syncDir(partial); err != nil {
		return "", err
	}
	if err := syncDir(qRoot); err != nil {
		return "", err
	}
	return partial, step("planned")
}

// finishQuarantine carries out plan, each step done again harmlessly
// after a crash: the damaged segment's original is linked (or copied)
// into partial and the later segments moved there; the records before the
// damage are written in the damaged segment's place; partial is renamed
// to its final name, which it returns.
func finishQuarantine(dir, qRoot, partial string, plan *quarantinePlan) (string, error) {
	walDir := filepath.Join(dir, walDirName)
	orig := filepath.Join(partial, plan.Damaged)
	if _, err := os.Stat(orig); errors.Is(err, fs.ErrNotExist) {
		if err := linkOrCopy(filepath.Join(walDir, plan.Damaged), orig); err != nil {
			return "", err
		}
	}
	for _, name := range plan.Segments[1:] {
		src, dst := filepath.Join(walDir, name), filepath.Join(partial, name)
		if err := os.Rename(src, dst); err != nil {
			if _, serr := os.Stat(dst); errors.Is(err, fs.ErrNotExist) && serr == nil {
				continue // moved before an interruption
			}
			return "", err
		}
		if err := step("moved " + name); err != nil {
			return "", err
		}
	}
	if err := syncDir(partial); err != nil {
		return "", err
	}
	if err := syncDir(walDir); err != nil {
		return "", err
	}
	if err := step("moved"); err != nil {
		return "", err
	}
	// The records before the damage, in the damaged segment's place.
	target := filepath.Join(walDir, plan.Damaged)
	if plan.Keep > 0 {
		f, err := os.Open(orig)
		if err != nil {
			return "", err
		}
		kept := make([]byte, plan.Keep+walHeader) // an end mark after them
		_, err = io.ReadFull(f, kept[:plan.Keep])
		f.Close()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", orig, err)
		}
		tmp := target + ".quarantine.tmp"
		if err := writeSynced(tmp, kept); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, target); err != nil {
			return "", err
		}
	} else if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := syncDir(walDir); err != nil {
		return "", err
	}
	if err := step("kept"); err != nil {
		return "", err
	}
	final := strings.TrimSuffix(partial, partialSuffix)
	if err := os.Rename(partial, final); err != nil {
		return "", err
	}
	if err := syncDir(qRoot); err != nil {
		return "", err
	}
	return final, nil
}

// linkOrCopy makes dst a hard link to src or, where links are not to be
// had, a synced copy.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeSynced(dst, b)
}

// writeSynced writes b as the file name, fsynced.
func writeSynced(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
