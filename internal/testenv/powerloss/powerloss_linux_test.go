//go:build linux

package powerloss

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// newDisk returns an empty data directory holding the given files.
func newDisk(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// powerOff cuts the power and fails the test if that fails.
func powerOff(t *testing.T, f *FS) {
	t.Helper()
	if err := f.PowerOff(); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
}

// names lists the names in dir, sorted.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// content reads a file, "<absent>" if it does not exist.
func content(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func fsyncPath(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	must(t, f.Sync())
}

// TestOnlySyncedDataSurvivesAPowerCut writes to a file that is already
// durable ("0123456789") and checks what a power cut leaves of it.
func TestOnlySyncedDataSurvivesAPowerCut(t *testing.T) {
	tests := []struct {
		name string
		do   func(t *testing.T, f *os.File)
		want string
	}{
		{"write, no sync", func(t *testing.T, f *os.File) {
			_, err := f.WriteAt([]byte("abc"), 0)
			must(t, err)
		}, "0123456789"},
		{"write then fsync", func(t *testing.T, f *os.File) {
			_, err := f.WriteAt([]byte("abc"), 0)
			must(t, err)
			must(t, f.Sync())
		}, "abc3456789"},
		{"write then fdatasync", func(t *testing.T, f *os.File) {
			_, err := f.WriteAt([]byte("abc"), 2)
			must(t, err)
			must(t, unix.Fdatasync(int(f.Fd())))
		}, "01abc56789"},
		{"pwrites at offsets, fsync, more pwrites", func(t *testing.T, f *os.File) {
			_, err := f.WriteAt([]byte("A"), 1)
			must(t, err)
			_, err = f.WriteAt([]byte("B"), 8)
			must(t, err)
			_, err = f.WriteAt([]byte("CD"), 12) // past the end: a gap of zeros
			must(t, err)
			must(t, f.Sync())
			_, err = f.WriteAt([]byte("lost"), 3)
			must(t, err)
			_, err = f.WriteAt([]byte("lost"), 20)
			must(t, err)
		}, "0A234567B9\x00\x00CD"},
		{"append then fsync", func(t *testing.T, f *os.File) {
			_, err := f.Seek(0, 2)
			must(t, err)
			_, err = f.Write([]byte("xyz"))
			must(t, err)
			must(t, f.Sync())
		}, "0123456789xyz"},
		{"truncate shorter, no sync", func(t *testing.T, f *os.File) {
			must(t, f.Truncate(4))
		}, "0123456789"},
		{"truncate shorter then fsync", func(t *testing.T, f *os.File) {
			must(t, f.Truncate(4))
			must(t, f.Sync())
		}, "0123"},
		{"extend then fsync reads zeros", func(t *testing.T, f *os.File) {
			must(t, f.Truncate(12))
			must(t, f.Sync())
		}, "0123456789\x00\x00"},
		{"cut, extend, write, fsync: the cut part reads zeros", func(t *testing.T, f *os.File) {
			must(t, f.Truncate(2))
			must(t, f.Truncate(10))
			_, err := f.WriteAt([]byte("Z"), 9)
			must(t, err)
			must(t, f.Sync())
		}, "01\x00\x00\x00\x00\x00\x00\x00Z"},
		{"fsync, then truncate without sync", func(t *testing.T, f *os.File) {
			_, err := f.WriteAt([]byte("kept"), 0)
			must(t, err)
			must(t, f.Sync())
			must(t, f.Truncate(0))
		}, "kept456789"},
		{"fallocate past the end then fsync", func(t *testing.T, f *os.File) {
			must(t, unix.Fallocate(int(f.Fd()), 0, 0, 16))
			must(t, f.Sync())
		}, "0123456789\x00\x00\x00\x00\x00\x00"},
		{"punch a hole then fsync", func(t *testing.T, f *os.File) {
			must(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 2, 3))
			must(t, f.Sync())
		}, "01\x00\x00\x0056789"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newDisk(t, map[string]string{"f": "0123456789"})
			fsys := MountT(t, dir, Options{})
			f, err := os.OpenFile(filepath.Join(fsys.Mountpoint(), "f"), os.O_RDWR, 0)
			must(t, err)
			defer f.Close()
			tt.do(t, f)
			powerOff(t, fsys)
			if got := content(t, filepath.Join(dir, "f")); got != tt.want {
				t.Errorf("after the power cut: got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestFsyncOfAWriteOnlyFile: fsync(2) of a file opened write-only makes
// its data durable, as on a disk (it failed with EBADF: the layer read the
// data to keep through the program's own descriptor).
func TestFsyncOfAWriteOnlyFile(t *testing.T) {
	dir := newDisk(t, map[string]string{"f": "0123456789"})
	fsys := MountT(t, dir, Options{})
	f, err := os.OpenFile(filepath.Join(fsys.Mountpoint(), "f"), os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("abc"), 0)
	must(t, err)
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync of a write-only file: %v", err)
	}
	powerOff(t, fsys)
	if got, want := content(t, filepath.Join(dir, "f")), "abc3456789"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestOpenWithTruncIsUndoneWithoutSync: O_TRUNC is a size change like any.
func TestOpenWithTruncIsUndoneWithoutSync(t *testing.T) {
	dir := newDisk(t, map[string]string{"f": "0123456789"})
	fsys := MountT(t, dir, Options{})
	f, err := os.OpenFile(filepath.Join(fsys.Mountpoint(), "f"), os.O_RDWR|os.O_TRUNC, 0)
	must(t, err)
	defer f.Close()
	_, err = f.Write([]byte("new"))
	must(t, err)
	powerOff(t, fsys)
	if got, want := content(t, filepath.Join(dir, "f")), "0123456789"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestRemountShowsTheDurableState reads the survivors through a new mount,
// and checks a clean Unmount keeps everything.
func TestRemountShowsTheDurableState(t *testing.T) {
	dir := newDisk(t, map[string]string{"sub/kept": "old"})
	fsys := MountT(t, dir, Options{})
	mnt := fsys.Mountpoint()
	must(t, os.WriteFile(filepath.Join(mnt, "sub/kept"), []byte("new"), 0o644))
	fsyncPath(t, filepath.Join(mnt, "sub/kept"))
	must(t, os.WriteFile(filepath.Join(mnt, "sub/kept"), []byte("lost"), 0o644))
	powerOff(t, fsys)

	fsys = MountT(t, dir, Options{})
	mnt = fsys.Mountpoint()
	if got, want := content(t, filepath.Join(mnt, "sub/kept")), "new"; got != want {
		t.Errorf("through the new mount: got %q, want %q", got, want)
	}
	// A clean shutdown keeps what was never synced.
	must(t, os.WriteFile(filepath.Join(mnt, "sub/unsynced"), []byte("written"), 0o600))
	must(t, os.Symlink("kept", filepath.Join(mnt, "sub/link")))
	if err := fsys.Unmount(); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	if got, want := names(t, filepath.Join(dir, "sub")), []string{"kept", "link", "unsynced"}; !slices.Equal(got, want) {
		t.Errorf("after Unmount: got %q, want %q", got, want)
	}
	if got, want := content(t, filepath.Join(dir, "sub/unsynced")), "written"; got != want {
		t.Errorf("after Unmount: got %q, want %q", got, want)
	}
	if got, want := content(t, filepath.Join(dir, "sub/link")), "new"; got != want {
		t.Errorf("the symlink after Unmount: got %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), ".disk.powerloss")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the working copy is left behind: %v", err)
	}
}

// TestNamesNeedADirectoryCommit pins what happens to creates, renames and
// unlinks not followed by an fsync of their directory, in both modes.
func TestNamesNeedADirectoryCommit(t *testing.T) {
	tests := []struct {
		name  string
		harsh bool
		do    func(t *testing.T, mnt string)
		want  map[string]string // name → content after the cut; only these names exist
	}{
		{"created and fsynced, directory not fsynced: default keeps it (ext4-like)", false, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "new"))
		}, map[string]string{"old": "old", "new": "data"}},
		{"created and fsynced, directory not fsynced: harsh drops it", true, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "new"))
		}, map[string]string{"old": "old"}},
		{"created, fsynced, directory fsynced: harsh keeps it", true, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "new"))
			fsyncPath(t, mnt)
		}, map[string]string{"old": "old", "new": "data"}},
		{"created, directory fsynced, data never synced: the name stays, empty", true, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
			fsyncPath(t, mnt)
		}, map[string]string{"old": "old", "new": ""}},
		{"default: another file's fsync commits the names, not that file's data", false, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
			must(t, os.WriteFile(filepath.Join(mnt, "other"), []byte("synced"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "other"))
		}, map[string]string{"old": "old", "new": "", "other": "synced"}},
		{"created, nothing synced: gone", false, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "new"), []byte("data"), 0o644))
		}, map[string]string{"old": "old"}},
		{"rename, nothing synced: the old name comes back", false, func(t *testing.T, mnt string) {
			must(t, os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "renamed")))
		}, map[string]string{"old": "old"}},
		{"rename, file fsynced: harsh brings the old name back", true, func(t *testing.T, mnt string) {
			must(t, os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "renamed")))
			fsyncPath(t, filepath.Join(mnt, "renamed"))
		}, map[string]string{"old": "old"}},
		{"rename, file fsynced: default commits it", false, func(t *testing.T, mnt string) {
			must(t, os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "renamed")))
			fsyncPath(t, filepath.Join(mnt, "renamed"))
		}, map[string]string{"renamed": "old"}},
		{"rename, directory fsynced: harsh commits it", true, func(t *testing.T, mnt string) {
			must(t, os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "renamed")))
			fsyncPath(t, mnt)
		}, map[string]string{"renamed": "old"}},
		{"atomic replace without the directory fsync: harsh keeps the old content", true, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "old.tmp"), []byte("replacement"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "old.tmp"))
			must(t, os.Rename(filepath.Join(mnt, "old.tmp"), filepath.Join(mnt, "old")))
		}, map[string]string{"old": "old"}},
		{"atomic replace with the directory fsync: harsh keeps the new content", true, func(t *testing.T, mnt string) {
			must(t, os.WriteFile(filepath.Join(mnt, "old.tmp"), []byte("replacement"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "old.tmp"))
			must(t, os.Rename(filepath.Join(mnt, "old.tmp"), filepath.Join(mnt, "old")))
			fsyncPath(t, mnt)
		}, map[string]string{"old": "replacement"}},
		{"unlink without the directory fsync: harsh brings it back", true, func(t *testing.T, mnt string) {
			must(t, os.Remove(filepath.Join(mnt, "old")))
			must(t, os.WriteFile(filepath.Join(mnt, "x"), []byte("x"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "x"))
		}, map[string]string{"old": "old"}},
		{"unlink, directory fsynced: gone", true, func(t *testing.T, mnt string) {
			must(t, os.Remove(filepath.Join(mnt, "old")))
			fsyncPath(t, mnt)
		}, map[string]string{}},
		{"mkdir and a file in it, only the file's directory fsynced: harsh loses both", true, func(t *testing.T, mnt string) {
			must(t, os.Mkdir(filepath.Join(mnt, "d"), 0o755))
			must(t, os.WriteFile(filepath.Join(mnt, "d/f"), []byte("f"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "d/f"))
			fsyncPath(t, filepath.Join(mnt, "d"))
		}, map[string]string{"old": "old"}},
		{"mkdir and a file in it, both directories fsynced: harsh keeps both", true, func(t *testing.T, mnt string) {
			must(t, os.Mkdir(filepath.Join(mnt, "d"), 0o755))
			must(t, os.WriteFile(filepath.Join(mnt, "d/f"), []byte("f"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "d/f"))
			fsyncPath(t, filepath.Join(mnt, "d"))
			fsyncPath(t, mnt)
		}, map[string]string{"old": "old", "d/f": "f"}},
		{"mkdir and a file in it, the file fsynced: default keeps both", false, func(t *testing.T, mnt string) {
			must(t, os.Mkdir(filepath.Join(mnt, "d"), 0o755))
			must(t, os.WriteFile(filepath.Join(mnt, "d/f"), []byte("f"), 0o644))
			fsyncPath(t, filepath.Join(mnt, "d/f"))
		}, map[string]string{"old": "old", "d/f": "f"}},
		{"directory moved, only its new parent fsynced: harsh keeps it once, under the old name", true, func(t *testing.T, mnt string) {
			for _, d := range []string{"a", "b", "a/d"} {
				must(t, os.Mkdir(filepath.Join(mnt, d), 0o755))
			}
			must(t, os.WriteFile(filepath.Join(mnt, "a/d/f"), []byte("f"), 0o644))
			for _, p := range []string{"a/d/f", "a/d", "a", "b", "."} {
				fsyncPath(t, filepath.Join(mnt, p))
			}
			must(t, os.Rename(filepath.Join(mnt, "a/d"), filepath.Join(mnt, "b/d")))
			fsyncPath(t, filepath.Join(mnt, "b"))
		}, map[string]string{"old": "old", "a/d/f": "f"}},
		{"hard link, directory fsynced: both names, one content", true, func(t *testing.T, mnt string) {
			must(t, os.Link(filepath.Join(mnt, "old"), filepath.Join(mnt, "link")))
			fsyncPath(t, mnt)
		}, map[string]string{"old": "old", "link": "old"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newDisk(t, map[string]string{"old": "old"})
			fsys := MountT(t, dir, Options{Harsh: tt.harsh})
			tt.do(t, fsys.Mountpoint())
			powerOff(t, fsys)
			got := map[string]string{}
			must(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(dir, p)
				got[rel] = content(t, p)
				return nil
			}))
			if !maps.Equal(got, tt.want) {
				t.Errorf("after the power cut: got %q, want %q", got, tt.want)
			}
		})
	}
}
