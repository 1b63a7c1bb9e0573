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
// call is allowed by the filter without notice). For a call of one of
// the process's own threads, the supervisor takes a reference of its own
// to the file the call's descriptor number holds (a dup of it: the
// threads share one descriptor table), checks that the caller is still
// in that very call (SECCOMP_IOCTL_NOTIF_ID_VALID), and hands the call to
// a goroutine of its own. That goroutine, for a call that grows a regular
// file, first allocates the file's blocks up to the new size with
// fallocate(FALLOC_FL_KEEP_SIZE), then calls ftruncate itself on its
// reference (from a thread the supervisor knows and lets through at
// once) and answers the caller with that call's result. When fallocate
// fails with ENOSPC or EDQUOT, the ftruncate fails with that error and
// the file's size is unchanged: Badger returns the error, and the store
// answers 503 instead of crashing. Every page Badger later writes through
// its mappings lies within a size set by an ftruncate, so it is backed by
// construction, whatever the timing of the disk filling up.
//
// The descriptor number is looked up once. A number is only a name:
// another thread can close it and open another file, which takes the same
// number, while the call waits for the supervisor. Letting the kernel
// carry on with the caller's own call (SECCOMP_USER_NOTIF_FLAG_CONTINUE)
// would make it look the number up again, so that the file allocated and
// the file grown could differ: blocks allocated to the closed file, and
// the new one grown sparse. Instead the call is made on the reference,
// taken while the caller was known to be in its call: it acts as if made
// at that instant, which is what the application could observe anyway.
// Guaranteed: the file allocated and truncated is the one the number held
// at one instant inside the call, and no other; a number that held no file
// then fails the call with EBADF, as the call itself would; a file is never
// grown without its blocks, nor given blocks by a call that did not grow
// it, unless that call then failed (an append-only file: EPERM) and left
// them past the end. Not guaranteed: a caller that leaves its call after
// the supervisor's last check (a fatal signal; before Linux 5.19 any
// signal, after which Go makes the call again with the same arguments)
// may still see it take effect; a thread that unshared its descriptor
// table (unshare(CLONE_FILES): the Go runtime never does, C code could)
// has its number looked up in the process's table; the call runs with the
// helper thread's credentials, which in a Go program every thread shares
// (syscall.Setuid applies to all), and an RLIMIT_FSIZE signal goes to that
// thread.
//
// The supervisor's thread only makes system calls that return at once:
// the allocation, the waitFor callback (Start's waitForSpace, which may be
// slow or block) and the ftruncate run on the call's own goroutine, so
// that whatever holds up one call holds up that call alone.
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
// filter without a reader; it never calls ftruncate, and lets the calls
// of the goroutines that answer for it through before anything else;
// neither it nor they log (a log sink could block; a separate goroutine
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
// caches its answer for every call but ftruncate), and each ftruncate two
// round trips to the supervisor (about 0.2 ms where an unfiltered one takes
// 3 µs: BenchmarkFilter): Badger calls it when it creates or grows a file,
// a few times a minute at most.
package prealloc
