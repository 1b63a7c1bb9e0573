//go:build linux

package powerloss

import (
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Options tunes a mount. The zero value is the ext4-like default mode.
type Options struct {
	// Harsh makes only a directory's own fsync commit the names in it:
	// creates, renames and unlinks not followed by an fsync of their
	// directory are undone by a power cut, even when the file itself was
	// fsynced. False is the ext4-like default, where any fsync commits every
	// name change made before it.
	Harsh bool
	// Debug prints every FUSE request and answer (go-fuse's log) to stderr.
	Debug bool
	// Writeback is the share, from 0 to 1, of the pages written since
	// their file's last sync that reach the disk anyway at a power cut, as
	// the kernel's writeback may have sent them before the power went: each
	// such page (4 KiB, within the file's durable size) survives with this
	// probability, in no order, independently of the others. Zero, the
	// default, drops every unsynced page. Names and sizes are not affected.
	Writeback float64
	// Seed seeds the draw of the pages Writeback keeps.
	Seed uint64
}

// Stats counts what arrived through FUSE since the mount. The counts let a
// test check which durability events a program's calls became.
type Stats struct {
	Writes     int64 // FUSE WRITE requests (write(2), pwrite(2), written-back pages of a mapping)
	WriteBytes int64
	Fsyncs     int64 // FUSE FSYNC without the datasync flag (fsync(2))
	Fdatasyncs int64 // FUSE FSYNC with the datasync flag (fdatasync(2), msync(MS_SYNC))
	Fsyncdirs  int64 // FUSE FSYNCDIR (fsync(2) of a directory)
	Truncates  int64 // size changes: truncate, ftruncate, open with O_TRUNC
	Allocates  int64 // FUSE FALLOCATE
	Commits    int64 // directories whose names were made durable
}

// FS is a mounted power-loss file system. Its methods are safe for
// concurrent use.
type FS struct {
	dir, mnt string
	work     string // working copy: work/live is what the mount shows, work/objects the durable file contents
	live     string
	objects  string
	opts     Options

	server *fuse.Server
	root   *node
	conn   uint32 // the FUSE connection's id (the mount's device minor)

	// gate is held shared by every handler that makes something durable and
	// exclusively by PowerOff, so a power cut falls between two syncs.
	gate sync.RWMutex
	off  bool

	// ns guards the records by inode, the directories with name changes not
	// yet committed, and the durable names; name changes run under it.
	ns      sync.Mutex
	byIno   map[uint64]*record
	nextID  uint64
	dirty   map[*record]*fs.Inode
	durable map[uint64]*dentry
	rootID  uint64
	rootIno uint64

	stopped atomic.Bool
	stats   struct {
		writes, writeBytes, fsyncs, fdatasyncs, fsyncdirs, truncates, allocates, commits atomic.Int64
	}
}

// record is one inode of the live tree: its id names its durable content
// (objects/ID), and it holds what was changed since its last sync.
type record struct {
	id, ino uint64

	mu        sync.Mutex
	written   spans   // ranges written since the last sync
	truncated bool    // the size went down since the last sync...
	minSize   int64   // ...to this at the lowest
	allocs    []alloc // fallocate calls since the last sync
	whole     bool    // copy the whole file at the next sync (a range was shifted)
}

type alloc struct {
	mode      uint32
	off, size int64
}

// dentry is the durable state of one inode's metadata: its type and
// permissions, a symlink's target, a directory's names (name → record id).
type dentry struct {
	mode   uint32
	target string
	names  map[string]uint64
}

// Mount mounts a power-loss file system on mountpoint showing the contents of
// dir, which it takes as the durable state. dir and mountpoint must not
// contain each other. Nothing else may use dir until PowerOff or Unmount
// returns.
func Mount(dir, mountpoint string, opts Options) (*FS, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("powerloss: %w", err)
	}
	mnt, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, fmt.Errorf("powerloss: %w", err)
	}
	if within(dir, mnt) || within(mnt, dir) {
		return nil, fmt.Errorf("powerloss: data directory %s and mountpoint %s must not contain each other", dir, mnt)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("powerloss: data directory: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("powerloss: data directory %s is not a directory", dir)
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, fmt.Errorf("powerloss: mountpoint: %w", err)
	}
	work := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".powerloss")
	if err := os.RemoveAll(work); err != nil {
		return nil, fmt.Errorf("powerloss: remove a stale working copy: %w", err)
	}
	f := &FS{
		dir: dir, mnt: mnt, work: work,
		live:    filepath.Join(work, "live"),
		objects: filepath.Join(work, "objects"),
		opts:    opts,
		byIno:   map[uint64]*record{},
		dirty:   map[*record]*fs.Inode{},
		durable: map[uint64]*dentry{},
	}
	if err := f.seed(); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	if err := f.mount(); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	return f, nil
}

func within(parent, p string) bool {
	return p == parent || strings.HasPrefix(p, parent+string(filepath.Separator))
}

func (f *FS) mount() error {
	var st unix.Stat_t
	if err := unix.Lstat(f.live, &st); err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	lroot := &fs.LoopbackRoot{Path: f.live, Dev: st.Dev}
	f.root = &node{LoopbackNode: &fs.LoopbackNode{RootData: lroot}, fsys: f}
	lroot.RootNode = f.root
	timeout := time.Second
	// go-fuse logs every answer it cannot deliver, as all are after a
	// power cut: quiet unless debugging.
	var logger *log.Logger
	if !f.opts.Debug {
		logger = log.New(io.Discard, "", 0)
	}
	server, err := fs.Mount(f.mnt, f.root, &fs.Options{
		Logger:       logger,
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			// As root, mount(2) directly; fusermount3 is the fallback.
			DirectMount: true,
			FsName:      f.dir,
			Name:        "powerloss",
			Debug:       f.opts.Debug,
			Logger:      logger,
		},
	})
	if err != nil {
		return fmt.Errorf("powerloss: mount %s: %w", f.mnt, err)
	}
	f.server = server
	var mst unix.Stat_t
	if err := unix.Stat(f.mnt, &mst); err != nil {
		f.abort()
		return fmt.Errorf("powerloss: stat the mount: %w", err)
	}
	f.conn = unix.Minor(mst.Dev)
	return nil
}

// Mountpoint is the directory the file system is mounted on.
func (f *FS) Mountpoint() string { return f.mnt }

// Dir is the data directory: the durable state once the file system is
// unmounted or powered off.
func (f *FS) Dir() string { return f.dir }

// Stats returns the counts of what arrived through FUSE since the mount.
func (f *FS) Stats() Stats {
	return Stats{
		Writes:     f.stats.writes.Load(),
		WriteBytes: f.stats.writeBytes.Load(),
		Fsyncs:     f.stats.fsyncs.Load(),
		Fdatasyncs: f.stats.fdatasyncs.Load(),
		Fsyncdirs:  f.stats.fsyncdirs.Load(),
		Truncates:  f.stats.truncates.Load(),
		Allocates:  f.stats.allocates.Load(),
		Commits:    f.stats.commits.Load(),
	}
}

// PowerOff cuts the power: nothing becomes durable after it starts, the FUSE
// connection is aborted (processes using the mount get errors such as EIO
// or ENOTCONN, and SIGBUS on mapped pages not in memory), the mount is
// detached, and the data directory is rewritten to hold only what was
// durable. Mount it again to see what survived. PowerOff after PowerOff or
// Unmount does nothing.
func (f *FS) PowerOff() error {
	if f.stopped.Swap(true) {
		return nil
	}
	f.gate.Lock()
	f.off = true
	f.gate.Unlock()
	if err := f.abort(); err != nil {
		return err
	}
	f.ns.Lock()
	defer f.ns.Unlock()
	if f.opts.Writeback > 0 {
		if err := f.writeBack(); err != nil {
			return err
		}
	}
	if err := f.materialize(); err != nil {
		return err
	}
	if err := os.RemoveAll(f.work); err != nil {
		return fmt.Errorf("powerloss: remove the working copy: %w", err)
	}
	return nil
}

// writeBack copies into the durable contents a random share
// (Options.Writeback) of the pages written since their file's last sync.
// Call with ns held, after the connection is gone.
func (f *FS) writeBack() error {
	rng := rand.New(rand.NewPCG(f.opts.Seed, uint64(f.conn)))
	return filepath.WalkDir(f.live, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		r := f.byIno[st.Ino]
		if r == nil {
			return nil
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.written) == 0 {
			return nil
		}
		obj, err := os.OpenFile(f.object(r.id), os.O_RDWR, 0)
		if err != nil {
			return nil // never synced: no durable content to write into
		}
		defer obj.Close()
		ost, err := obj.Stat()
		if err != nil {
			return fmt.Errorf("powerloss: %w", err)
		}
		live, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("powerloss: %w", err)
		}
		defer live.Close()
		size := min(ost.Size(), st.Size)
		const page = 4096
		for _, s := range r.written {
			for off := s.off &^ (page - 1); off < min(s.end, size); off += page {
				if rng.Float64() >= f.opts.Writeback {
					continue
				}
				if err := copyRange(int(live.Fd()), int(obj.Fd()), off, min(page, size-off)); err != nil {
					return fmt.Errorf("powerloss: write back %s: %w", p, err)
				}
			}
		}
		return nil
	})
}

// abort aborts the FUSE connection, detaches the mount and waits, at most
// a minute, for the server to stop.
func (f *FS) abort() error {
	// The connection's abort file in fusectl; without it, a forced unmount
	// aborts a FUSE connection too (fuse_umount_begin).
	ctl := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, fmt.Sprint(f.conn), "abort")); err != nil {
		// Not mounted yet: mount fusectl (EBUSY if someone just did).
		_ = unix.Mount("fusectl", ctl, "fusectl", 0, "")
	}
	if err := os.WriteFile(filepath.Join(ctl, fmt.Sprint(f.conn), "abort"), []byte("1"), 0); err != nil {
		_ = unix.Unmount(f.mnt, unix.MNT_FORCE)
	}
	if err := unix.Unmount(f.mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("powerloss: detach %s: %w", f.mnt, err)
	}
	return f.wait()
}

func (f *FS) wait() error {
	done := make(chan struct{})
	go func() {
		f.server.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("powerloss: the FUSE server of %s did not stop within a minute", f.mnt)
	}
}

// Unmount shuts down cleanly, as a machine does before its power goes:
// the kernel writes back what it holds, everything becomes durable, and the
// data directory holds the state the mount showed. It fails if the mount is
// busy (open files, a process's working directory); PowerOff still works
// then.
func (f *FS) Unmount() error {
	if f.stopped.Load() {
		return nil
	}
	if err := f.server.Unmount(); err != nil {
		return fmt.Errorf("powerloss: unmount %s: %w", f.mnt, err)
	}
	if f.stopped.Swap(true) {
		return nil
	}
	f.gate.Lock()
	f.off = true
	f.gate.Unlock()
	if err := clearDir(f.dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(f.live)
	if err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(f.live, e.Name()), filepath.Join(f.dir, e.Name())); err != nil {
			return fmt.Errorf("powerloss: %w", err)
		}
	}
	if fi, err := os.Stat(f.live); err == nil {
		_ = os.Chmod(f.dir, fi.Mode().Perm())
	}
	if err := os.RemoveAll(f.work); err != nil {
		return fmt.Errorf("powerloss: remove the working copy: %w", err)
	}
	return nil
}

func (f *FS) powered() bool {
	return !f.off
}

// newRecord gives the live inode ino a fresh record (a new file, or an
// inode number the live file system reused). Call with ns held.
func (f *FS) newRecord(ino uint64) *record {
	f.nextID++
	r := &record{id: f.nextID, ino: ino}
	f.byIno[ino] = r
	return r
}

// recordOf is the record of a live inode number, created if unknown. Call
// with ns held.
func (f *FS) recordOf(ino uint64) *record {
	if r := f.byIno[ino]; r != nil {
		return r
	}
	return f.newRecord(ino)
}

func (f *FS) lookup(n *node) *record {
	f.ns.Lock()
	defer f.ns.Unlock()
	return f.recordOf(f.inoOf(n))
}

// inoOf is the live inode number of n. go-fuse numbers the root 1; the
// others carry the live file system's numbers (one device: nothing is mounted
// inside the working copy).
func (f *FS) inoOf(n *node) uint64 {
	if n.EmbeddedInode() == f.root.EmbeddedInode() {
		return f.rootIno
	}
	return n.StableAttr().Ino
}

// markDirty notes a name change in directory n. Call with ns held.
func (f *FS) markDirty(n *node) {
	r := f.recordOf(f.inoOf(n))
	f.dirty[r] = n.EmbeddedInode()
}

// commitDirty commits the names of every directory changed since its last
// commit. Call with gate (shared) and ns held.
func (f *FS) commitDirty() error {
	for r, in := range f.dirty {
		ok, err := f.commitDir(r, in)
		if err != nil {
			return err
		}
		if ok {
			delete(f.dirty, r)
		}
	}
	return nil
}

// commitDir makes the durable names of directory r what its live listing
// is now. It reports false when the directory is no longer where the tree
// says (removed, or moved a moment ago): nothing is committed then. Call with
// gate (shared) and ns held.
func (f *FS) commitDir(r *record, in *fs.Inode) (bool, error) {
	p := filepath.Join(f.live, in.Path(f.root.EmbeddedInode()))
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Ino != r.ino || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, nil
	}
	d, err := os.Open(p)
	if err != nil {
		return false, nil
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return false, fmt.Errorf("powerloss: list %s: %w", p, err)
	}
	committed := make(map[string]uint64, len(names))
	for _, name := range names {
		var cst unix.Stat_t
		cp := filepath.Join(p, name)
		if err := unix.Lstat(cp, &cst); err != nil {
			continue
		}
		c := f.recordOf(cst.Ino)
		e := f.durable[c.id]
		if e == nil {
			e = &dentry{}
			f.durable[c.id] = e
		}
		e.mode = cst.Mode
		switch cst.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if e.names == nil {
				e.names = map[string]uint64{}
			}
		case unix.S_IFLNK:
			if t, err := os.Readlink(cp); err == nil {
				e.target = t
			}
		}
		committed[name] = c.id
	}
	e := f.durable[r.id]
	if e == nil {
		e = &dentry{mode: st.Mode}
		f.durable[r.id] = e
	}
	e.names = committed
	f.stats.commits.Add(1)
	return true, nil
}

// syncData makes the data and size of r durable, reading the live file
// through fd (reopened for reading: the program may have opened it
// write-only, and fsync(2) of such a file is fine). Call with gate held
// (shared).
func (f *FS) syncData(r *record, wfd int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", wfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	obj, err := os.OpenFile(f.object(r.id), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer obj.Close()
	ofd := int(obj.Fd())
	if r.truncated {
		if err := unix.Ftruncate(ofd, r.minSize); err != nil {
			return err
		}
	}
	for _, a := range r.allocs {
		// Reserve what the program reserved; a file system that cannot is
		// no reason to fail the sync: the data copy below is what counts.
		_ = unix.Fallocate(ofd, a.mode, a.off, a.size)
	}
	written := r.written
	if r.whole {
		written = spans{{0, st.Size}}
	}
	for _, s := range written {
		end := min(s.end, st.Size)
		if s.off >= end {
			continue
		}
		if err := copyRange(fd, ofd, s.off, end-s.off); err != nil {
			return err
		}
	}
	if err := unix.Ftruncate(ofd, st.Size); err != nil {
		return err
	}
	r.written, r.truncated, r.minSize, r.allocs, r.whole = nil, false, 0, nil, false
	return nil
}

func (f *FS) object(id uint64) string {
	return filepath.Join(f.objects, fmt.Sprint(id))
}

// wrote notes that [off, end) of r's file was written.
func (r *record) wrote(off, end int64) {
	r.mu.Lock()
	r.written = r.written.add(off, end)
	r.mu.Unlock()
}

// truncate notes that r's file was cut or extended to size.
func (r *record) truncate(size int64) {
	r.mu.Lock()
	if !r.truncated || size < r.minSize {
		r.minSize = size
	}
	r.truncated = true
	r.mu.Unlock()
}

// allocated notes an fallocate call on r's file.
func (r *record) allocated(mode uint32, off, size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch mode &^ (unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE) {
	case 0:
		if len(r.allocs) < 1024 {
			r.allocs = append(r.allocs, alloc{mode, off, size})
		}
		// Punched or zeroed bytes read as zeros in the live file: copying
		// the range carries them over.
		if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
			r.written = r.written.add(off, off+size)
		}
	default:
		// Collapse or insert range shift the data after off.
		r.whole = true
	}
}

// copyRange copies n bytes at off from the live file to the object.
func copyRange(from, to int, off, n int64) error {
	in, out := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(from, &in, to, &out, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			return copyRangeSlow(from, to, in, n)
		}
		n -= int64(c)
	}
	return nil
}

func copyRangeSlow(from, to int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		c, err := unix.Pread(from, buf[:min(n, int64(len(buf)))], off)
		if err != nil {
			return err
		}
		if c == 0 {
			return nil
		}
		if _, err := unix.Pwrite(to, buf[:c], off); err != nil {
			return err
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// seed copies dir into the live tree, links its files into objects, and
// records its names as the durable state.
func (f *FS) seed() error {
	for _, d := range []string{f.live, f.objects} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("powerloss: %w", err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(f.dir, &st); err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	if err := os.Chmod(f.live, os.FileMode(st.Mode&0o7777)); err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	var lst unix.Stat_t
	if err := unix.Lstat(f.live, &lst); err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	f.rootIno = lst.Ino
	rootRec := f.newRecord(lst.Ino)
	f.rootID = rootRec.id
	f.durable[rootRec.id] = &dentry{mode: st.Mode, names: map[string]uint64{}}
	links := map[uint64]string{} // inode in dir → its first live path, for hard links
	if err := f.seedDir(f.dir, f.live, rootRec.id, links); err != nil {
		return fmt.Errorf("powerloss: copy %s: %w", f.dir, err)
	}
	return nil
}

func (f *FS) seedDir(src, dst string, id uint64, links map[uint64]string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		sp, dp := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(sp, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(dp, os.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
		case unix.S_IFREG:
			if first, ok := links[st.Ino]; ok {
				if err := os.Link(first, dp); err != nil {
					return err
				}
			} else {
				if err := copySparse(sp, dp, st.Mode&0o7777); err != nil {
					return err
				}
				links[st.Ino] = dp
			}
		case unix.S_IFLNK:
			t, err := os.Readlink(sp)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, dp); err != nil {
				return err
			}
		default:
			continue // sockets, fifos, devices: not modelled
		}
		var lst unix.Stat_t
		if err := unix.Lstat(dp, &lst); err != nil {
			return err
		}
		r := f.byIno[lst.Ino]
		if r == nil {
			r = f.newRecord(lst.Ino)
			e := &dentry{mode: st.Mode}
			f.durable[r.id] = e
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				if err := os.Link(sp, f.object(r.id)); err != nil {
					return fmt.Errorf("the working copy must be on the data directory's file system: %w", err)
				}
			case unix.S_IFLNK:
				e.target, _ = os.Readlink(sp)
			case unix.S_IFDIR:
				e.names = map[string]uint64{}
			}
		}
		f.durable[id].names[e.Name()] = r.id
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := f.seedDir(sp, dp, r.id, links); err != nil {
				return err
			}
		}
	}
	return nil
}

// copySparse copies a regular file, leaving its holes holes (the store's
// files are large and mostly unwritten).
func copySparse(src, dst string, perm uint32) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(perm))
	if err != nil {
		return err
	}
	defer out.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			data = off // no SEEK_DATA: copy everything
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if err := copyRange(ifd, ofd, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	return os.Chmod(dst, os.FileMode(perm))
}

// materialize rewrites the data directory to hold the durable state. Call
// with ns held, after the connection is gone.
func (f *FS) materialize() error {
	if err := clearDir(f.dir); err != nil {
		return err
	}
	if e := f.durable[f.rootID]; e != nil {
		_ = os.Chmod(f.dir, os.FileMode(e.mode&0o7777))
	}
	seen := map[uint64]bool{f.rootID: true}
	if err := f.build(f.rootID, f.dir, seen); err != nil {
		return fmt.Errorf("powerloss: write the durable state to %s: %w", f.dir, err)
	}
	return nil
}

func (f *FS) build(id uint64, path string, seen map[uint64]bool) error {
	names := make([]string, 0, len(f.durable[id].names))
	for name := range f.durable[id].names {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cid := f.durable[id].names[name]
		e := f.durable[cid]
		p := filepath.Join(path, name)
		perm := os.FileMode(e.mode & 0o777)
		switch e.mode & unix.S_IFMT {
		case unix.S_IFDIR:
			// A directory renamed with only its new parent synced has two
			// names; the first one (in name order) keeps it.
			if seen[cid] {
				continue
			}
			seen[cid] = true
			if err := os.Mkdir(p, perm); err != nil {
				return err
			}
			if err := f.build(cid, p, seen); err != nil {
				return err
			}
		case unix.S_IFREG:
			obj := f.object(cid)
			if _, err := os.Lstat(obj); errors.Is(err, os.ErrNotExist) {
				// Its name was committed, its data never synced: empty.
				if err := os.WriteFile(obj, nil, 0o600); err != nil {
					return err
				}
			}
			if err := os.Link(obj, p); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(e.mode&0o7777)); err != nil {
				return err
			}
		case unix.S_IFLNK:
			if err := os.Symlink(e.target, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// clearDir removes everything inside dir.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("powerloss: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("powerloss: %w", err)
		}
	}
	return nil
}

// errnoOf turns an error of the host file system into the errno a FUSE
// answer carries.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}
