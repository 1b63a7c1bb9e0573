// Package prealloc makes every file this process grows with ftruncate(2)
// take its disk space before its size changes, so that a full disk is an
// error returned by ftruncate instead of a SIGBUS later.
//
// Why: Badger (and ristretto's z.MmapFile under it) creates its memtable
// logs, value-log files, tables and discard file by sizing them with
// ftruncate and then writing into a shared mapping of them. ftruncate only
// sets the size: the blocks are allocated when a page is first written
// through the mapping, and when the disk is full then, the kernel cannot
// back the page and sends SIGBUS. The Go runtime turns a SIGBUS in a
// goroutine that did not ask for it (debug.SetPanicOnFault, which cannot
// be set on Badger's goroutines) into a fatal error: the process dies and
// every request in flight is left in doubt. Badger offers no hook to size
// its files, and checking the free space now and then (the store's
// min_free_bytes floor) only narrows the window: a burst between two
// checks still meets an unbacked page.
//
// How: Start installs a seccomp filter on every thread of the process
// that hands each ftruncate to a supervisor goroutine of this package,
// locked to its own thread (SECCOMP_RET_USER_NOTIF; every other system
// call is allowed by the filter without notice). For a call that grows a
// file, the supervisor first allocates the file's blocks up to the new
// size with fallocate(FALLOC_FL_KEEP_SIZE), and then lets the real
// ftruncate run (SECCOMP_USER_NOTIF_FLAG_CONTINUE), which only sets the
// size over blocks that exist. When fallocate fails with ENOSPC or EDQUOT,
// the ftruncate fails with that error and the file's size is unchanged:
// Badger returns the error, and the store answers 503 instead of crashing.
// Every page Badger later writes through its mappings lies within a size
// set by an ftruncate, so it is backed by construction, whatever the
// timing of the disk filling up.
//
// Installing the filter sets no_new_privs on every thread (the kernel
// requires it of a process without CAP_SYS_ADMIN): an execve can no longer
// gain privileges (setuid binaries, file capabilities). idemproxy execs
// nothing.
//
// A caller that would drop the error can wait instead (Start's
// waitForSpace): its ftruncate returns once the allocation fits, answered
// by a goroutine that tries again every 250 ms, while the supervisor goes
// on answering the others. The store makes Badger's tables wait: a
// compaction drops the error of a table it could not create.
//
// Why it cannot hang the process: the supervisor installs the filter
// itself, from its locked thread, once it runs, so there is never a
// filter without a reader; it and the goroutines that answer later never
// call ftruncate (nor log: a log sink could block; a separate goroutine
// logs for them); a caller waiting in ftruncate is in a system call, which
// the Go runtime (its scheduler, its garbage collector's stops) never
// waits for. Should the listener fail for good, the supervisor closes it:
// the kernel then fails every ftruncate with ENOSYS (errors, 503s) instead
// of leaving it waiting.
//
// What does not hold:
//   - On a file system without fallocate (EOPNOTSUPP: some network and
//     FUSE file systems) the ftruncate runs as before and is not
//     protected; Unprotected counts such calls and the first is logged.
//   - Where seccomp user notification is unavailable (kernels before 5.7,
//     container runtimes whose seccomp profile refuses seccomp(2) or the
//     listener, a process whose parent installed such a filter already:
//     the kernel allows one listener in a process's line, EBUSY;
//     architectures other than amd64 and arm64, other operating systems),
//     Start returns an error and nothing is installed: the process runs as
//     before, protected by the free-space floor alone.
//   - The filter is inherited by child processes and across execve; their
//     ftruncate calls are let through untouched while this process runs,
//     and fail with ENOSYS once it has exited. idemproxy starts no child
//     processes.
//
// The filter costs a few BPF instructions on each system call (the kernel
// caches its answer for every call but ftruncate), and each ftruncate a
// round trip to the supervisor: Badger calls it when it creates or grows a
// file, a few times a minute at most.
package prealloc
