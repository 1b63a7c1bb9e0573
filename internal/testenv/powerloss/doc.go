// Package powerloss is a FUSE file system for tests that simulates a power
// cut: it passes every operation through to a directory, keeps what was not
// made durable apart, and on [FS.PowerOff] aborts the FUSE connection and
// leaves behind only what was synced, as a disk would after the power went.
// It plays the part Jepsen's LazyFS plays for databases (Linux only, root).
//
// # Use
//
//	fsys, err := powerloss.Mount(dataDir, mountpoint, powerloss.Options{})
//	// run the program under test on mountpoint (a child process: a power cut
//	// kills it with EIO, ENOTCONN or SIGBUS on its mappings)
//	err = fsys.PowerOff()          // dataDir now holds only the durable state
//	fsys, err = powerloss.Mount(dataDir, mountpoint, powerloss.Options{})
//
// In a test, [MountT] does the same with a forced power cut on cleanup. The
// process that mounts serves the file system: programs that map files of the
// mount (Badger) must run in a child process, because a page fault on such a
// mapping waits for the FUSE server, and the Go runtime's stop-the-world in
// the serving process waits for the faulting thread (a deadlock); plain
// system calls from the test itself are fine. The data
// directory is "the disk": Mount reads it, PowerOff and Unmount write it, and
// nothing else may use it while it is mounted. Mount keeps its working copy in
// a sibling directory (".NAME.powerloss"), which must be on the same file
// system (hard links).
//
// # The model
//
// The mount shows the live state (the page cache): a plain loopback of a
// working copy, so reads, shared writable mappings and directory listings
// behave exactly as the kernel makes them. Beside it the package keeps the
// durable state: per file, the content as of its last sync; per directory, the
// names as of its last commit. These events make things durable:
//
//   - fsync and fdatasync (FUSE FSYNC) of a file: its data and size (both
//     calls alike). msync(MS_SYNC) of a shared mapping arrives as FUSE WRITEs
//     of the dirty pages followed by FSYNC with the datasync flag, so it
//     counts as fdatasync.
//   - fsync of a directory (FUSE FSYNCDIR): the names in that directory
//     (creates, renames in and out, unlinks, mkdir, rmdir) as they are now.
//   - In the default mode (ext4-like, one journal) any fsync, of a file or a
//     directory, also commits every name change made so far in any
//     directory: a file created and fsynced survives without a directory
//     fsync, and a file created and never synced may survive with a length
//     of zero. In [Options.Harsh] mode only a directory's own fsync commits
//     its names: a created and fsynced file whose directory was not fsynced
//     is gone after a power cut, and a rename not followed by an fsync of
//     both directories comes back under its old name (or under both).
//
// Not durability events: close, sync_file_range (the kernel sends only the
// WRITEs of the range, no FSYNC, and the man page promises nothing after a
// crash), msync(MS_ASYNC), and writes that stayed in the kernel's page cache
// (stores to a mapping never written back). With [Options.Writeback] a
// random share of the pages written and not synced survives the cut
// anyway, in no order (what the kernel's writeback may have put on the
// disk before the power went); by default none does. Permissions are taken
// as they were at the commit of a file's name; owners, times and extended attributes
// are not modelled. The durable copy is not itself fsynced to the host disk:
// the simulation survives a crash of the test, not of the machine.
package powerloss
