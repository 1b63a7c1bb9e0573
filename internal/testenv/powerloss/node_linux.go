//go:build linux

package powerloss

import (
	"context"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node of the live tree that tells the FS about every
// change: name changes mark their directory, size changes their record.
type node struct {
	*fs.LoopbackNode
	fsys *FS
}

var (
	_ fs.NodeWrapChilder     = (*node)(nil)
	_ fs.NodeCreater         = (*node)(nil)
	_ fs.NodeOpener          = (*node)(nil)
	_ fs.NodeOpendirHandler  = (*node)(nil)
	_ fs.NodeSetattrer       = (*node)(nil)
	_ fs.NodeMkdirer         = (*node)(nil)
	_ fs.NodeMknoder         = (*node)(nil)
	_ fs.NodeSymlinker       = (*node)(nil)
	_ fs.NodeLinker          = (*node)(nil)
	_ fs.NodeUnlinker        = (*node)(nil)
	_ fs.NodeRmdirer         = (*node)(nil)
	_ fs.NodeRenamer         = (*node)(nil)
	_ fs.NodeCopyFileRanger  = (*node)(nil)
	_ fs.NodeFsyncer         = (*node)(nil)
	_ fs.FileWriter          = (*file)(nil)
	_ fs.FileFsyncer         = (*file)(nil)
	_ fs.FileAllocater       = (*file)(nil)
	_ fs.FilePassthroughFder = (*file)(nil)
	_ fs.FileFsyncdirer      = (*dir)(nil)
	_ fs.FileReaddirenter    = (*dir)(nil)
)

// WrapChild makes every node of the tree a node of this file system.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fsys: n.fsys}
}

func (n *node) livePath() string {
	return filepath.Join(n.fsys.live, n.Path(n.fsys.root.EmbeddedInode()))
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := n.fsys
	f.ns.Lock()
	defer f.ns.Unlock()
	var before unix.Stat_t
	existed := unix.Lstat(filepath.Join(n.livePath(), name), &before) == nil
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return ch, fh, fuseFlags, errno
	}
	var r *record
	if existed {
		// The kernel's name cache was stale: this opened an existing file.
		r = f.recordOf(ch.StableAttr().Ino)
		if flags&syscall.O_TRUNC != 0 {
			r.truncate(0)
			f.stats.truncates.Add(1)
		}
	} else {
		r = f.newRecord(ch.StableAttr().Ino)
		f.markDirty(n)
	}
	return ch, n.wrapFile(fh, r), fuseFlags | fuse.FOPEN_NOFLUSH, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return fh, fuseFlags, errno
	}
	r := n.fsys.lookup(n)
	if flags&syscall.O_TRUNC != 0 {
		r.truncate(0)
		n.fsys.stats.truncates.Add(1)
	}
	return n.wrapFile(fh, r), fuseFlags | fuse.FOPEN_NOFLUSH, 0
}

// wrapFile wraps an open file of the live tree. Open and Create return it
// with FOPEN_NOFLUSH: close(2) then neither writes dirty pages back nor
// waits for an answer (close is no durability event), so a process that
// serves the mount and exits with files of it open cannot hang in its own
// FLUSH.
func (n *node) wrapFile(fh fs.FileHandle, r *record) fs.FileHandle {
	return &file{LoopbackFile: fh.(*fs.LoopbackFile), fsys: n.fsys, rec: r}
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Setattr(ctx, fh, in, out)
	if errno != 0 {
		return errno
	}
	if size, ok := in.GetSize(); ok {
		n.fsys.lookup(n).truncate(int64(size))
		n.fsys.stats.truncates.Add(1)
	}
	return 0
}

// Fsync is the directory fsync the kernel sends for a directory opened
// without a handle of ours; open directories go through dir.Fsyncdir.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := fh.(*file); ok {
		return h.Fsync(ctx, flags)
	}
	if n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return syscall.EBADF
	}
	return n.fsys.fsyncDir(n)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return fh, fuseFlags, errno
	}
	return &dir{FileHandle: fh, n: n}, fuseFlags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

// created runs an operation that makes a new inode in directory n.
func (n *node) created(op func() (*fs.Inode, syscall.Errno)) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.ns.Lock()
	defer f.ns.Unlock()
	ch, errno := op()
	if errno != 0 {
		return ch, errno
	}
	f.newRecord(ch.StableAttr().Ino)
	f.markDirty(n)
	return ch, 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.ns.Lock()
	defer f.ns.Unlock()
	ch, errno := n.LoopbackNode.Link(ctx, target, name, out)
	if errno == 0 {
		f.markDirty(n)
	}
	return ch, errno
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.renamed(func() syscall.Errno { return n.LoopbackNode.Unlink(ctx, name) })
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.renamed(func() syscall.Errno { return n.LoopbackNode.Rmdir(ctx, name) })
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return n.renamed(func() syscall.Errno { return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags) }, newParent)
}

// renamed runs an operation that changes names in directory n (and in
// others).
func (n *node) renamed(op func() syscall.Errno, others ...fs.InodeEmbedder) syscall.Errno {
	f := n.fsys
	f.ns.Lock()
	defer f.ns.Unlock()
	errno := op()
	if errno != 0 {
		return errno
	}
	f.markDirty(n)
	for _, o := range others {
		if on, ok := o.(*node); ok {
			f.markDirty(on)
		}
	}
	return 0
}

// CopyFileRange says it is not supported: the kernel then copies with reads
// and writes, which the file system sees.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, size uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// file is an open file of the live tree: writes are noted, fsync makes
// them durable.
type file struct {
	*fs.LoopbackFile
	fsys *FS
	rec  *record
}

// PassthroughFd refuses FUSE passthrough: the kernel would write to the
// live file without the file system seeing it.
func (h *file) PassthroughFd() (int, bool) { return -1, false }

// Ioctl refuses ioctls: some (FICLONE and friends) change data unseen.
func (h *file) Ioctl(ctx context.Context, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

func (h *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := h.LoopbackFile.Write(ctx, data, off)
	if n > 0 {
		h.rec.wrote(off, off+int64(n))
		h.fsys.stats.writes.Add(1)
		h.fsys.stats.writeBytes.Add(int64(n))
	}
	return n, errno
}

func (h *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	errno := h.LoopbackFile.Allocate(ctx, off, size, mode)
	if errno == 0 {
		h.rec.allocated(mode, int64(off), int64(size))
		h.fsys.stats.allocates.Add(1)
	}
	return errno
}

func (h *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f := h.fsys
	if flags&fsyncFdatasync != 0 {
		f.stats.fdatasyncs.Add(1)
	} else {
		f.stats.fsyncs.Add(1)
	}
	f.gate.RLock()
	defer f.gate.RUnlock()
	if !f.powered() {
		return syscall.EIO
	}
	fd, ok := h.LoopbackFile.PassthroughFd()
	if !ok {
		return syscall.EBADF
	}
	if err := f.syncData(h.rec, fd); err != nil {
		return errnoOf(err)
	}
	if f.opts.Harsh {
		return 0
	}
	f.ns.Lock()
	defer f.ns.Unlock()
	return errnoOf(f.commitDirty())
}

// dir is an open directory of the live tree: its fsync commits names.
type dir struct {
	fs.FileHandle // the loopback's directory stream
	n             *node
}

func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.FileHandle.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.FileHandle.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dir) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.FileHandle.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
	}
}

func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.fsys.fsyncDir(d.n)
}

// fsyncDir commits the names of directory n: only n's in the harsh mode,
// every changed directory's otherwise.
func (f *FS) fsyncDir(n *node) syscall.Errno {
	f.stats.fsyncdirs.Add(1)
	f.gate.RLock()
	defer f.gate.RUnlock()
	if !f.powered() {
		return syscall.EIO
	}
	f.ns.Lock()
	defer f.ns.Unlock()
	if !f.opts.Harsh {
		return errnoOf(f.commitDirty())
	}
	r := f.recordOf(n.fsys.inoOf(n))
	ok, err := f.commitDir(r, n.EmbeddedInode())
	if err != nil {
		return errnoOf(err)
	}
	if ok {
		delete(f.dirty, r)
	}
	return 0
}

// fsyncFdatasync is the datasync bit of FUSE FSYNC's flags
// (FUSE_FSYNC_FDATASYNC in the kernel's fuse.h).
const fsyncFdatasync = 1 << 0
