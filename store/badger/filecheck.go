package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	bdg "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/badger/v4/y"
)

// Checks of Badger's own files, made without opening Badger: before Open
// (checkManifest), and by `idemproxy store check` (CheckFiles), next to
// Check's reading of the reservation log.
//
// What Badger v4.9.6 does with a directory whose MANIFEST is missing
// (manifest.go, helpOpenOrCreateManifestFile): it writes a new, empty
// MANIFEST, and then (levels.go, revertToManifest) deletes every table
// file (*.sst) the new MANIFEST does not name, that is all of them; the
// value-log files (*.vlog) are kept but nothing in the tree points into
// them any more. The store would start empty and every retry of a request
// it had answered would be forwarded again. Badger writes the MANIFEST
// (renamed into place and its directory synced) before it creates any
// table or value-log file, so these files without a MANIFEST are never
// the trace of a crash: a partial copy or restore, or a MANIFEST deleted.

// errInUse is returned (wrapped) by LockDir while another process holds
// the store's directory (a running idemproxy).
var errInUse = errors.New("the store's directory is in use by another process")

// checkManifest refuses a directory that holds table or value-log files but
// no MANIFEST (see above): Badger would open it as a new store, delete the
// tables and forget every key they and the value log hold. It also refuses
// a table the MANIFEST names whose footer or index is damaged
// (checkTable): Badger reads those in goroutines of its own, where the
// damage is a panic that takes the process down, before the Guard can
// say why. A MANIFEST that cannot be read is left to Badger, which
// refuses it with an error.
func checkManifest(dir string) error {
	files := dataFiles(dir)
	if len(files) == 0 {
		return nil
	}
	manifest := filepath.Join(dir, "MANIFEST")
	if _, err := os.Stat(manifest); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("badger: open %s: %s but no MANIFEST: refusing to start empty and delete them (restore the MANIFEST, or move the directory away to start empty)", dir, countFiles(files))
	}
	ids, err := manifestTables(manifest)
	if err != nil {
		return nil
	}
	for _, id := range ids {
		if err := checkTable(tableName(dir, id)); err != nil {
			return fmt.Errorf("badger: open %s: %w: refusing to open (restore the directory from a backup)", dir, err)
		}
	}
	return nil
}

// tableName is the path of table id in dir, as Badger names it.
func tableName(dir string, id uint64) string { return filepath.Join(dir, fmt.Sprintf("%06d.sst", id)) }

// checkTable reads the footer of the table file at path as Badger v4.9.6
// does when it opens it (table.initIndex: from the end, the checksum's
// length, the checksum, the index's length, the index) and verifies the
// index's checksum. A missing file is not its to report (Badger refuses
// it with an error). The checksum is a protobuf message of two varints:
// 1, the algorithm; 2, the sum.
func checkTable(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	damaged := func(what string) error {
		return fmt.Errorf("table %s is damaged: %s", path, what)
	}
	read := func(off, n int64) ([]byte, error) {
		if off < 0 || n < 0 || off+n > size {
			return nil, damaged("its footer points outside the file")
		}
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil {
			return nil, fmt.Errorf("read table %s: %w", path, err)
		}
		return b, nil
	}
	pos := size - 4
	b, err := read(pos, 4)
	if err != nil {
		return err
	}
	chkLen := int64(binary.BigEndian.Uint32(b))
	pos -= chkLen
	chkBytes, err := read(pos, chkLen)
	if err != nil {
		return err
	}
	var algo, sum uint64
	for rest := chkBytes; len(rest) > 0; {
		tag, n := binary.Uvarint(rest)
		if n <= 0 || tag&7 != 0 {
			return damaged("its checksum cannot be read")
		}
		v, m := binary.Uvarint(rest[n:])
		if m <= 0 {
			return damaged("its checksum cannot be read")
		}
		switch tag >> 3 {
		case 1:
			algo = v
		case 2:
			sum = v
		}
		rest = rest[n+m:]
	}
	pos -= 4
	if b, err = read(pos, 4); err != nil {
		return err
	}
	indexLen := int64(binary.BigEndian.Uint32(b))
	pos -= indexLen
	index, err := read(pos, indexLen)
	if err != nil {
		return err
	}
	if y.CalculateChecksum(index, pb.Checksum_Algorithm(algo)) != sum {
		return damaged("its index fails its checksum")
	}
	return nil
}

// dataFiles lists the table and value-log files in dir.
func dataFiles(dir string) []string {
	var files []string
	for _, pat := range []string{"*.sst", "*.vlog"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		files = append(files, m...)
	}
	return files
}

// countFiles says how many table and value-log files files holds.
func countFiles(files []string) string {
	var sst, vlog int
	for _, f := range files {
		if strings.HasSuffix(f, ".sst") {
			sst++
		} else {
			vlog++
		}
	}
	return fmt.Sprintf("%d table files (*.sst) and %d value-log files (*.vlog)", sst, vlog)
}

// FileProblem is one thing wrong with a store directory's files that keeps
// the store from opening, or would lose keys if it did.
type FileProblem struct {
	// Path is the file or directory concerned.
	Path string
	// Detail says what is wrong, and what to do, for a person.
	Detail string
	// InUse is set when the problem is that another process holds the
	// directory (errInUse).
	InUse bool
}

func (p FileProblem) String() string { return p.Path + ": " + p.Detail }

// CheckFiles reports what is wrong with the Badger files of the store in
// dir, without opening it and without changing anything: a directory that
// cannot be read or written by this process, a MANIFEST that is missing
// beside data files or that cannot be read, tables the MANIFEST names
// that are missing, files this process cannot read or write, and the
// directory held by another process (a running idemproxy: errInUse). A
// directory that does not exist is no problem (a new store is created
// there). The reservation log is Check's. Off Unix (Windows) its one
// problem is that the store is not supported there (platform_other.go).
func CheckFiles(dir string) []FileProblem {
	var probs []FileProblem
	add := func(path, format string, args ...any) {
		probs = append(probs, FileProblem{Path: path, Detail: fmt.Sprintf(format, args...)})
	}
	if err := supported(); err != nil {
		add(dir, "%v", err)
		return probs
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		add(dir, "cannot be read: %v (check the permissions of the directory and its parents)", err)
		return probs
	case !fi.IsDir():
		add(dir, "is not a directory")
		return probs
	}
	if err := accessible(dir, true); err != nil {
		add(dir, "%v: the store's directory must be readable, writable and searchable by the user idemproxy runs as", err)
		return probs
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		add(dir, "cannot be listed: %v", err)
		return probs
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if e.Name() == walDirName || e.Name() == quarantineDirName {
			if err := accessible(p, true); err != nil {
				add(p, "%v: it must be readable, writable and searchable by the user idemproxy runs as", err)
			}
			continue
		}
		if !e.Type().IsRegular() {
			continue
		}
		if err := accessible(p, false); err != nil {
			add(p, "%v: Badger's files must be readable and writable by the user idemproxy runs as", err)
		}
	}
	manifest := filepath.Join(dir, "MANIFEST")
	if _, err := os.Stat(manifest); errors.Is(err, fs.ErrNotExist) && len(dataFiles(dir)) > 0 {
		add(manifest, "is missing beside %s: Badger would start an empty store and delete the tables, forgetting every key; restore the MANIFEST from where the directory came from, or move the directory away to start empty (every key lost)", countFiles(dataFiles(dir)))
	} else if tables, err := manifestTables(manifest); err != nil && !errors.Is(err, fs.ErrNotExist) {
		add(manifest, "cannot be read: %v; Badger refuses to open the store: restore the directory from a backup, or move it away to start empty (every key lost)", err)
	} else {
		var missing []string
		for _, id := range tables {
			name := tableName(dir, id)
			if _, err := os.Stat(name); errors.Is(err, fs.ErrNotExist) {
				missing = append(missing, filepath.Base(name))
			} else if err := checkTable(name); err != nil {
				add(name, "%v: Badger refuses to open the store; restore the directory from a backup", err)
			}
		}
		if len(missing) > 0 {
			add(manifest, "names %d table files that are missing (%s): Badger refuses to open the store; restore them, or the directory from a backup", len(missing), strings.Join(missing, ", "))
		}
	}
	if err := probeLock(dir); err != nil {
		add(dir, "%v", err)
		probs[len(probs)-1].InUse = errors.Is(err, errInUse)
	}
	return probs
}

// manifestTables reads the MANIFEST at path as Badger does at open and
// returns the IDs of the tables it names.
func manifestTables(path string) ([]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, _, err := bdg.ReplayManifestFile(f, 0, bdg.DefaultOptions(filepath.Dir(path)))
	if err != nil {
		return nil, err
	}
	ids := make([]uint64, 0, len(m.Tables))
	for id := range m.Tables {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// probeLock reports errInUse when another process holds the directory's
// lock (Badger's flock of the directory), and nil when it is free. It
// waits up to probeLockWait: a proxy whose store does not open holds the
// lock for a moment each time it tries again.
func probeLock(dir string) error {
	unlock, err := LockDir(dir, probeLockWait)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// probeLockWait is how long CheckFiles waits for the directory's lock.
const probeLockWait = 2 * time.Second

// LockDir takes the lock Badger takes on the store's directory, so that no
// idemproxy opens the store meanwhile, and returns the function that
// releases it. A process that holds it (a running idemproxy) makes it fail
// with errInUse once wait has passed: a proxy whose store does not open
// takes the lock for a moment each time it tries again. Off Unix
// (Windows) it refuses, naming the system (platform_other.go).
func LockDir(dir string, wait time.Duration) (unlock func(), err error) {
	if err := supported(); err != nil {
		return nil, err
	}
	for end := time.Now().Add(wait); ; time.Sleep(100 * time.Millisecond) {
		unlock, err = lockStoreDir(dir)
		if !errors.Is(err, errInUse) || time.Now().After(end) {
			return unlock, err
		}
	}
}
