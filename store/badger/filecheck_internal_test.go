package badger

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenRefusesValueLogWithoutManifest: with no MANIFEST Badger v4.9.6
// writes a new, empty one and opens an empty store; the value log it
// finds is kept but nothing points into it, so the answers it holds are
// forgotten, and every retry charged again. A directory with value-log
// files but no MANIFEST (and no tables: a copy that skipped them too) is
// refused, like one with tables, and nothing is deleted.
func TestOpenRefusesValueLogWithoutManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	closedWithRecords(t, dir, 3)
	for _, pat := range []string{"MANIFEST", "*.sst"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, f := range m {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	vlogs, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if len(vlogs) == 0 {
		t.Fatal("no value-log file: the test proves nothing")
	}
	s, err := Open(Options{Dir: dir})
	if err == nil {
		s.Close()
		t.Fatal("Open without a MANIFEST beside value-log files succeeded; want it refused")
	}
	if !strings.Contains(err.Error(), "no MANIFEST") || !strings.Contains(err.Error(), "value-log files") {
		t.Errorf("Open error = %v; want it to name the missing MANIFEST and the value-log files", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "MANIFEST")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a MANIFEST was written by the refused Open (%v); want the directory left as it was", err)
	}
	// A new directory, and a sound store, still open.
	for _, d := range []string{filepath.Join(t.TempDir(), "new"), func() string { d := t.TempDir(); closedWithRecords(t, d, 1); return d }()} {
		s, err := Open(Options{Dir: d})
		if err != nil {
			t.Errorf("Open(%s) = %v; want it opened", d, err)
			continue
		}
		s.Close()
	}
}

// TestCheckFiles: what `idemproxy store check` reports about Badger's own
// files, without opening the store or changing it.
func TestCheckFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string // in the one problem reported; "" for none
	}{
		{"sound", func(*testing.T, string) {}, ""},
		{"new directory", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"MANIFEST missing", func(t *testing.T, dir string) {
			moveAside(t, filepath.Join(dir, "MANIFEST"))
		}, "MANIFEST: is missing beside 1 table files"},
		{"MANIFEST damaged", func(t *testing.T, dir string) {
			flipFile(t, filepath.Join(dir, "MANIFEST"), -3)
		}, "MANIFEST: cannot be read: manifest has checksum mismatch"},
		{"MANIFEST empty", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "MANIFEST"), 0); err != nil {
				t.Fatal(err)
			}
		}, "MANIFEST: cannot be read"},
		{"table missing", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "000001.sst")); err != nil {
				t.Fatal(err)
			}
		}, "names 1 table files that are missing (000001.sst)"},
		{"not a directory", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is not a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			closedWithRecords(t, dir, 3)
			c.damage(t, dir)
			probs := CheckFiles(dir)
			var got []string
			for _, p := range probs {
				got = append(got, p.String())
			}
			switch {
			case c.want == "" && len(probs) != 0:
				t.Errorf("CheckFiles = %q; want nothing wrong", got)
			case c.want != "" && (len(probs) != 1 || !strings.Contains(got[0], c.want)):
				t.Errorf("CheckFiles = %q; want one problem saying %q", got, c.want)
			}
		})
	}
}

// TestCheckFilesInUse: a directory a running store holds is reported in
// use, and LockDir waits for it no longer than it is told; once the
// store is closed the lock is taken, and keeps a store from opening until
// it is released.
func TestCheckFilesInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	probs := CheckFiles(dir)
	if len(probs) != 1 || !probs[0].InUse || !strings.Contains(probs[0].Detail, errInUse.Error()) {
		t.Errorf("CheckFiles of a store in use = %v; want it reported in use", probs)
	}
	start := time.Now()
	if _, err := LockDir(dir, 300*time.Millisecond); !errors.Is(err, errInUse) {
		t.Errorf("LockDir = %v; want ErrInUse", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("LockDir gave up after %v; want it to wait 300ms for the lock", d)
	}
	s.Close()
	unlock, err := LockDir(dir, 0)
	if err != nil {
		t.Fatalf("LockDir of a closed store = %v", err)
	}
	if s, err := Open(Options{Dir: dir}); err == nil {
		s.Close()
		t.Error("Open while the directory is locked succeeded; want it refused")
	}
	unlock()
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open after unlock = %v", err)
	}
	s.Close()
}

// TestOpenRefusesDamagedTable: a table whose footer or index is damaged
// (a flipped byte, a file cut short) made Badger panic in a goroutine of
// its own while opening (table.initIndex), which no recover catches: the
// process died at every start. Open refuses it with an error naming the
// table, so that the Guard starts degraded, and CheckFiles reports it.
func TestOpenRefusesDamagedTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		damage func(t *testing.T, table string)
	}{
		{"footer flipped", func(t *testing.T, table string) { flipFile(t, table, -2) }},
		{"index flipped", func(t *testing.T, table string) { flipFile(t, table, -40) }},
		{"cut short", func(t *testing.T, table string) {
			fi, err := os.Stat(table)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(table, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"emptied", func(t *testing.T, table string) {
			if err := os.Truncate(table, 0); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			closedWithRecords(t, dir, 50)
			table := filepath.Join(dir, "000001.sst")
			c.damage(t, table)
			s, err := Open(Options{Dir: dir})
			if err == nil {
				s.Close()
				t.Fatal("Open over a damaged table succeeded; want it refused")
			}
			if !strings.Contains(err.Error(), "000001.sst is damaged") {
				t.Errorf("Open error = %v; want it to name the damaged table", err)
			}
			probs := CheckFiles(dir)
			if len(probs) != 1 || !strings.Contains(probs[0].Detail, "is damaged") {
				t.Errorf("CheckFiles = %v; want the damaged table reported", probs)
			}
		})
	}
}
