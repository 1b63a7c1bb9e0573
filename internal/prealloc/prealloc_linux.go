//go:build linux && (amd64 || arm64)

package prealloc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's user-notification ABI (linux/seccomp.h), which x/sys/unix
// does not define.
type seccompData struct {
	nr   int32
	arch uint32
	ip   uint64
	args [6]uint64
}

type seccompNotif struct {
	id    uint64
	pid   uint32
	flags uint32
	data  seccompData
}

type seccompNotifResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// notifIDValid is SECCOMP_IOCTL_NOTIF_ID_VALID, _IOW('!', 2, __u64).
const notifIDValid = 0x40082102

// Offsets of struct seccomp_data's fields, for the filter.
const (
	offNr   = 0
	offArch = 4
)

var (
	once     sync.Once
	startErr error
	active   atomic.Bool
	// unprotected counts ftruncate calls let through because the file
	// system has no fallocate.
	unprotected atomic.Uint64
	// events carries what the supervisor wants logged to a goroutine that
	// logs it: the supervisor itself never waits on a log sink.
	events = make(chan string, 4)
	// waitFor is Start's waitForSpace.
	waitFor func(path string) bool
	// waiting counts the ftruncate calls waiting for space.
	waiting atomic.Int64
	// delegates holds the thread IDs of the goroutines calling ftruncate
	// for the supervisor (truncate): their calls are let through.
	delegates sync.Map // int → struct{}
	// testHook, set by tests only, is called at the named stages of a
	// call: "received" on the supervisor's thread before the descriptor
	// is resolved, "resolved" once its file is allocated, before it is
	// truncated.
	testHook atomic.Pointer[func(stage string)]
)

func hook(stage string) {
	if h := testHook.Load(); h != nil {
		(*h)(stage)
	}
}

// Active reports whether ftruncate calls of this process are preallocated.
func Active() bool { return active.Load() }

// Unprotected counts the ftruncate calls let through without preallocation
// because their file system has no fallocate.
func Unprotected() uint64 { return unprotected.Load() }

// Waiting is the number of ftruncate calls waiting for disk space (see
// Start's waitForSpace).
func Waiting() int64 { return waiting.Load() }

// Start installs the filter and starts the supervisor, once per process:
// later calls return the first call's result. A nil error means every
// ftruncate of the process, on every thread now and later, is preallocated
// from now on. Otherwise nothing is installed, the process runs as before,
// and the error says why (seccomp unavailable or refused), for the caller
// to log. Once installed, the first call logs so to log (nil: no logging),
// and later the first ftruncate on a file system without fallocate.
//
// waitForSpace reports whether an ftruncate of the file at path that does
// not fit on the disk waits until it fits (the allocation is tried again
// every 250 ms) instead of failing with ENOSPC: for a caller that would
// drop the error (Badger's compactions do); nil means that none waits.
// Only the first call's waitForSpace is used. It is called on the waiting
// call's own goroutine, never the supervisor's thread: it may be slow or
// block, holding up that call only; a panic in it means no.
func Start(log *slog.Logger, waitForSpace func(path string) bool) error {
	once.Do(func() {
		waitFor = waitForSpace
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		startErr = start()
		if startErr != nil {
			return // the caller says what it means: a warning, or no start
		}
		active.Store(true)
		log.Info("files grown with ftruncate are preallocated: a full disk is an error, not a crash")
		go func() {
			for e := range events {
				log.Warn(e)
			}
		}()
	})
	return startErr
}

// start runs the supervisor and waits until its filter is installed, or
// failed to be.
func start() error {
	if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(unix.Gettid())); err != nil {
		// Without /proc the supervisor cannot tell the process's own
		// threads from children that inherited the filter.
		return fmt.Errorf("prealloc: /proc: %w", err)
	}
	installed := make(chan error, 1)
	go supervise(installed)
	return <-installed
}

// supervise installs the filter from its own locked thread and then
// answers its notifications for as long as the process lives. Its thread
// never calls ftruncate (that would wait for itself), nor anything that
// can block for long: each call is handed to a goroutine of its own
// (perform), which answers it.
func supervise(installed chan<- error) {
	// Never unlocked: if this goroutine ended, its thread would end with
	// it, and with it the no_new_privs it set for a filter that failed.
	runtime.LockOSThread()
	fd, err := install()
	installed <- err
	if err != nil {
		return
	}
	self := os.Getpid()
	failures := 0
	for {
		var req seccompNotif
		if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)); err != nil {
			switch {
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT):
				// Interrupted, or the caller went away before it was
				// received (a signal restarts its call).
				continue
			}
			// Nothing else is expected. A listener nobody reads would
			// leave every ftruncate waiting forever; closed, the
			// kernel fails them with ENOSYS instead: the store reports
			// errors (503), the process goes on.
			if failures++; failures >= 100 {
				sendEvent(fmt.Sprintf("prealloc: the supervisor stopped: %v; ftruncate fails with ENOSYS from now on", err))
				active.Store(false)
				unix.Close(fd)
				select {} // keep the thread: it holds no_new_privs only, harmless
			}
			continue
		}
		failures = 0
		if resp, now := receive(fd, self, &req); now {
			// ENOENT: the caller was interrupted meanwhile and will
			// call again.
			_ = ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
		}
	}
}

// receive takes one notified call on the supervisor's thread. It lets
// through at once what is not this process's own ftruncate (a child's, or
// a delegate's: see truncate); otherwise it resolves the descriptor the
// call names to a reference of its own, once, and hands the call to a
// goroutine that answers it (now false). It only makes system calls that
// return at once.
//
// Why the reference: the number in the call is only a name. Another thread
// can close it and open another file, which takes the same number, while
// the call waits here. Resolved once, while the caller is known to be still
// in its call (the notification is still valid after the reference was
// taken), the call is made on that file and nothing else: perform grows it
// with its blocks and answers the caller, and the kernel never looks the
// number up again (the call is not continued). That is the call as if made
// at the instant the reference was taken, within the call: whatever the
// number holds before or after, no other file is allocated or grown.
func receive(fd, self int, req *seccompNotif) (resp seccompNotifResp, now bool) {
	cont := seccompNotifResp{id: req.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	defer func() {
		if p := recover(); p != nil {
			resp, now = cont, true
		}
	}()
	if req.data.nr != sysFtruncate || req.data.arch != auditArch {
		return cont, true
	}
	if _, ok := delegates.Load(int(req.pid)); ok {
		// perform's own call, on the reference it holds.
		return cont, true
	}
	if !ownThread(self, req.pid) {
		// A child that inherited the filter: its file descriptors are
		// not ours.
		return cont, true
	}
	hook("received")
	// The process's threads share one descriptor table (the Go runtime
	// never unshares it), so the caller's number is looked up here as
	// its own call would. pidfd_getfd(2) would take the same reference
	// from the same table, with more ways to fail (ENOSYS before Linux
	// 5.6, container profiles that refuse it).
	file, err := unix.FcntlInt(uintptr(uint32(req.data.args[0])), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		errno, ok := err.(unix.Errno)
		if !ok {
			errno = unix.EBADF
		}
		// EBADF: no file had that number at an instant within the
		// call, which is what the call itself answers. Otherwise
		// (EMFILE: no number free for the reference) the call cannot
		// be made safely, and fails.
		return seccompNotifResp{id: req.id, error: -int32(errno)}, true
	}
	id := req.id
	if ioctl(fd, notifIDValid, unsafe.Pointer(&id)) != nil {
		// The caller left its call (it is restarted with a new
		// notification, or the process is dying): the reference may
		// have been taken after it left.
		unix.Close(file)
		return resp, false
	}
	go perform(fd, req.id, file, int64(req.data.args[1]))
	return resp, false
}

// perform makes a notified ftruncate on file, the reference receive took,
// and answers its caller. It runs on a goroutine of its own, locked to its
// thread while it calls ftruncate, so that a slow file system, a full disk
// waited out or a slow waitFor callback holds up this call alone.
func perform(fd int, id uint64, file int, length int64) {
	defer unix.Close(file)
	errno, gone := unix.EIO, false
	defer func() {
		// Nothing here is expected to panic; should it, the caller gets
		// an error (EIO) rather than no answer, and the process goes on.
		recover()
		if gone {
			return
		}
		resp := seccompNotifResp{id: id, error: -int32(errno)}
		// ENOENT: the caller left meanwhile.
		_ = ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}()
	errno, gone = makeCall(fd, id, file, length)
}

// makeCall allocates file's blocks up to length when the call grows a
// regular file, then truncates it to length, and returns the call's errno
// (0: done). A disk without room fails it with ENOSPC or EDQUOT, the file
// unchanged, or makes it wait for room (waitFor). gone reports that the
// caller left its call meanwhile: nobody is answered, and the file was not
// truncated.
func makeCall(fd int, id uint64, file int, length int64) (errno unix.Errno, gone bool) {
	var st unix.Stat_t
	if length > 0 && unix.Fstat(file, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && length > st.Size {
		if err := fallocate(file, length); err != nil {
			var e unix.Errno
			switch {
			case errors.As(err, &e) && (e == unix.ENOSPC || e == unix.EDQUOT):
				if !shouldWait(file) {
					return e, false
				}
				if !waitForSpace(fd, id, file, length) {
					return 0, true
				}
			case errors.Is(err, unix.EOPNOTSUPP):
				if unprotected.Add(1) == 1 {
					sendEvent("prealloc: the file system has no fallocate: its files are not preallocated, and a full disk can crash the store")
				}
			}
			// Anything else (a descriptor not open for writing, ...):
			// ftruncate reports it as it would have.
		}
	}
	hook("resolved")
	valid := id
	if ioctl(fd, notifIDValid, unsafe.Pointer(&valid)) != nil {
		return 0, true
	}
	return truncate(file, length), false
}

// shouldWait asks waitFor whether the call on file waits for disk space.
// A callback that panics is taken for a no.
func shouldWait(file int) (wait bool) {
	if waitFor == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			wait = false
		}
	}()
	path, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(file))
	return err == nil && waitFor(path)
}

// truncate calls ftruncate on file from a thread the supervisor knows
// (delegates), which lets the call through at once: on the reference,
// the call has the kernel's own semantics, checks and errors.
func truncate(file int, length int64) unix.Errno {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	delegates.Store(tid, struct{}{})
	defer delegates.Delete(tid)
	for {
		err := unix.Ftruncate(file, length)
		if err == nil {
			return 0
		}
		if e, ok := err.(unix.Errno); ok && e != unix.EINTR {
			return e
		} else if !ok {
			return unix.EIO
		}
	}
}

// waitForSpace tries the allocation of a call that did not fit again
// every 250 ms, for as long as its caller waits, and reports whether it
// now fits (or failed otherwise: ftruncate then reports it); false means
// the caller left.
func waitForSpace(fd int, id uint64, file int, length int64) bool {
	waiting.Add(1)
	// No longer waiting before the caller is answered: once its
	// ftruncate returns, Waiting does not count it.
	defer waiting.Add(-1)
	for {
		time.Sleep(250 * time.Millisecond)
		valid := id
		if ioctl(fd, notifIDValid, unsafe.Pointer(&valid)) != nil {
			return false // the caller is gone, or its call was restarted
		}
		err := fallocate(file, length)
		if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
			return true
		}
	}
}

// fallocate allocates file's blocks up to length without changing its
// size, so that a failure leaves the file as it was. Blocks already there
// cost nothing.
func fallocate(file int, length int64) error {
	for {
		err := unix.Fallocate(file, unix.FALLOC_FL_KEEP_SIZE, 0, length)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// ownThread reports whether tid, in this process's pid namespace, is a
// thread of this process (it is alive: it waits for the answer).
func ownThread(self int, tid uint32) bool {
	if int(tid) == self {
		return true
	}
	var st unix.Stat_t
	return unix.Stat("/proc/self/task/"+strconv.FormatUint(uint64(tid), 10), &st) == nil
}

func sendEvent(e string) {
	select {
	case events <- e:
	default:
	}
}

// install sets no_new_privs and installs the filter on every thread,
// returning the listener. It runs on the supervisor's locked thread.
func install() (int, error) {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("prealloc: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: offArch},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: auditArch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: offNr},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: sysFtruncate},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC |
		unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH)
	// A caller whose ftruncate was received ignores signals other than
	// SIGKILL until answered (Linux 5.19): its call is not restarted,
	// and preallocated again, by every signal meanwhile. Older kernels
	// refuse the flag; the calls are then restarted, which is correct.
	for _, extra := range []uintptr{unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, 0} {
		fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags|extra, uintptr(unsafe.Pointer(&prog)))
		runtime.KeepAlive(filter)
		if errno == 0 {
			return int(fd), nil
		}
		if errno != unix.EINVAL || extra == 0 {
			return -1, fmt.Errorf("prealloc: seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER|TSYNC): %w", errno)
		}
	}
	panic("unreachable")
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}
