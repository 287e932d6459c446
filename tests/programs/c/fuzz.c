/*
 * fuzz: a system-call fuzzer for the Perch runtime, one source for both ABIs.
 *
 *   fuzz CALLS [SEED [forge]]
 *
 * Built as x86-64 (`gcc -static`: raw `syscall`) and as i386 (`gcc -m32
 * -static`: raw `int 0x80`). A seeded xorshift picks a system-call number
 * and six arguments per call, each argument from a class: small integers,
 * random 32/64-bit values, single bits, bad pointers (0, 8, the runtime's
 * half at 0xffffffff80100000, non-canonical, unmapped, a guard page), huge
 * lengths, and valid pointers into a scratch buffer (random bytes, a few
 * path strings). It makes CALLS calls and prints only what is the same on
 * every kernel: the number of calls made, then "fuzz done". With `forge`
 * it then calls rt_sigreturn over a forged frame (x86-64: good but for one
 * thing, by SEED modulo 6: a non-canonical RIP, a RIP in the runtime's half,
 * a bad code or stack segment selector, reserved MXCSR bits, an unreadable
 * FPU state), which must end it.
 *
 * The runtime must survive every call. So that the *fuzzer* survives too
 * and never blocks, a short deny-list (see build_table) skips the calls that
 * end or replace the process, block or sleep on a caller's timeout, make
 * blocking descriptors (pipes, eventfds), or reach other processes; and a
 * few calls are steered:
 *   - sockets are IPv4 and always non-blocking (socket and accept4 get
 *     SOCK_NONBLOCK, F_SETFL keeps O_NONBLOCK, FIONBIO and accept are
 *     denied), and only under the runtime (PERCH_FUZZ_GUEST=1): on a host
 *     they would reach the network; a sockaddr_in of 127.0.0.1:7000 lies in
 *     the scratch buffer for address arguments to hit;
 *   - clone, clone3, futex, kill, tkill, tgkill and rt_sigaction as said
 *     above spawn(): threads that exit at once (over corrupt robust lists),
 *     futex waits that end at once, only signals that are ignored;
 *   - under the runtime only, fork, vfork and clone without CLONE_VM make
 *     children that try an execve (see fork_child) or set a robust list,
 *     and exit at once; wait4, waitpid and waitid always get WNOHANG, and
 *     half the time wait for any child, which reaps them;
 *   - munmap/mprotect/madvise/mremap/mlock/munlock/msync/mseal act only on a
 *     sacrificial "victim" mapping (the fuzzer never touches it);
 *   - mmap never gets MAP_FIXED (it would replace the fuzzer's own pages),
 *     and what it maps is unmapped again at once; mremap never MREMAP_FIXED;
 *   - brk never shrinks below the break the fuzzer started with, and grows
 *     by at most 16 MiB (a heap up to a bad pointer would make it good);
 *   - the console is kept as a high descriptor (100 where the fd table
 *     allows) and no call that has an argument equal to it is made, so
 *     nothing can write, truncate, duplicate or close it; pidfd_getfd is
 *     denied (it could duplicate it too); fds 0-2 are /dev/null while
 *     fuzzing and close/dup2/dup3 never target them;
 *   - poll gets a zero timeout; prlimit64 never sets limits; fcntl never
 *     waits for a lock (F_SETLKW, F_OFD_SETLKW: two of the fuzzer's own
 *     descriptors of one file can conflict, as with flock, which is denied).
 * The scratch buffer sits between two PROT_NONE guard pages, so a call that
 * writes through a valid pointer with a huge length stops at a guard.
 *
 * Do not run it on a host as root: it makes random calls with whatever
 * privileges it has. It refuses to start as root unless PERCH_FUZZ_GUEST=1
 * is set, which the end-to-end test sets in the appliance's manifest.
 */
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define ABI_NAME "x86_64"
typedef uint64_t word;
#define USER_END 0x800000000000ull
#elif defined(__i386__)
#define ABI_NAME "i386"
typedef uint32_t word;
#define USER_END 0xffffe000u
#else
#error "fuzz.c is for x86-64 and i386"
#endif

/* Linux constants, spelled out so the fuzzer needs no libc headers. */
#define O_RDONLY 0
#define O_RDWR 2
#define PROT_NONE 0
#define PROT_READ 1
#define PROT_WRITE 2
#define MAP_PRIVATE 0x02
#define MAP_FIXED 0x10
#define MAP_ANONYMOUS 0x20
#define MREMAP_FIXED 2
#define F_SETLKW 7
#define F_SETLKW64 14 /* i386 */
#define F_OFD_SETLKW 38
#define AT_FDCWD (-100)
#define PAGE 4096u
#define SCRATCH_BYTES (16 * PAGE)
#define VICTIM_BYTES (16 * PAGE)
#define BRK_SPAN (16u << 20)
#define NR_SPAN 512 /* numbers 0..511 cover both tables today */

static long raw(word nr, word a, word b, word c, word d, word e, word f)
{
#if defined(__x86_64__)
	register word r10 __asm__("r10") = d;
	register word r8 __asm__("r8") = e;
	register word r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
#else
	/* ebp (the sixth argument) may be the frame pointer and ebx the PIC
	 * register, so both are saved by hand and every argument is loaded from
	 * an array whose address is in esi. */
	word args[6] = {a, b, c, d, e, f};
	word *p = args;
	long ret;
	__asm__ volatile("push %%ebp\n\t"
			 "push %%ebx\n\t"
			 "mov 0(%%esi), %%ebx\n\t"
			 "mov 4(%%esi), %%ecx\n\t"
			 "mov 8(%%esi), %%edx\n\t"
			 "mov 16(%%esi), %%edi\n\t"
			 "mov 20(%%esi), %%ebp\n\t"
			 "mov 12(%%esi), %%esi\n\t"
			 "int $0x80\n\t"
			 "pop %%ebx\n\t"
			 "pop %%ebp"
			 : "=a"(ret), "+S"(p)
			 : "a"(nr), "m"(args)
			 : "ecx", "edx", "edi", "memory");
	return ret;
#endif
}

#define SYS0(n) raw((n), 0, 0, 0, 0, 0, 0)
#define SYS3(n, a, b, c) raw((n), (word)(a), (word)(b), (word)(c), 0, 0, 0)

static size_t len_of(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

static void put(int fd, const char *s)
{
	SYS3(SYS_write, fd, s, len_of(s));
}

static char *utoa(char *end, uint64_t v)
{
	*--end = 0;
	do
		*--end = (char)('0' + v % 10);
	while (v /= 10);
	return end;
}

static uint64_t parse_u64(const char *s)
{
	uint64_t v = 0;
	while (*s >= '0' && *s <= '9')
		v = v * 10 + (uint64_t)(*s++ - '0');
	return v;
}

static __attribute__((noreturn)) void finish(int status)
{
	for (;;)
		SYS3(SYS_exit_group, status, 0, 0);
}

static uint64_t rng;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static unsigned char *scratch; /* SCRATCH_BYTES between guard pages */
static unsigned char *victim;  /* the only target of munmap & co */
static word initial_brk;
static int console = -1;       /* saved stdout */

/* Path strings placed in the scratch buffer at these offsets. */
static const char *const paths[] = {
	"data/input.txt", "/dev/null", "/dev/zero", "/dev/urandom", ".",
	"data", "/", "fuzz-new-file", "/proc/self/exe", "bin",
};
#define NPATHS (sizeof paths / sizeof paths[0])
#define PATH_SLOT 64

static word bad_pointer(void)
{
	static const uint64_t bad[] = {
		0, 8, 0xfff, 0xffffffff80100000ull, 0xffff800000000000ull,
		0x0000800000000000ull, 0x00007ffffffff000ull, 0x8000000000000000ull,
		0xdead0000ull, 0xfffff000ull, 0xffffffffffffffffull, 0xc0000000ull,
	};
	unsigned k = (unsigned)(next() % (sizeof bad / sizeof bad[0]) + 2);
	if (k == sizeof bad / sizeof bad[0])
		return (word)(uintptr_t)(scratch - PAGE + (next() % PAGE)); /* guard */
	if (k == sizeof bad / sizeof bad[0] + 1)
		return (word)(uintptr_t)(scratch + SCRATCH_BYTES); /* guard after */
	return (word)bad[k];
}

static word arg(void)
{
	uint64_t r = next();
	switch (r % 16) {
	case 0: case 1: case 2: case 3:
		return (word)(next() % 16);                  /* small: fds, flags */
	case 4:
		return (word)(0 - (next() % 4));             /* -1, -2, -3, 0 */
	case 5: case 6:
		return (word)next();                         /* random bits */
	case 7:
		return (word)(1ull << (next() % 64));        /* a single bit */
	case 8: case 9:
		return bad_pointer();
	case 10: {                                       /* huge or odd lengths */
		static const uint64_t lens[] = {
			0x7fffffff, 0xffffffff, 0x80000000, 1ull << 40,
			0xffffffffffffffffull, 1u << 20, 4096, 4097,
		};
		return (word)lens[next() % (sizeof lens / sizeof lens[0])];
	}
	case 11: case 12: case 13:                       /* into the scratch buffer */
		return (word)(uintptr_t)(scratch + next() % SCRATCH_BYTES);
	case 14:                                         /* aligned, with room */
		return (word)(uintptr_t)(scratch + (next() % (SCRATCH_BYTES / 64)) * 64);
	default:                                         /* a path string */
		return (word)(uintptr_t)(scratch + (next() % NPATHS) * PATH_SLOT);
	}
}

static word syscall_number(void)
{
	uint64_t r = next();
	if (r % 64)
		return (word)(next() % NR_SPAN);
	static const uint64_t odd[] = {
		NR_SPAN, 1000, 0x40000000 | 1, 0x40000000 | 39, 0x7fffffff,
		0xffffffff, 0xffffffffffffffffull, (1ull << 32) | 39,
	};
	return (word)odd[next() % (sizeof odd / sizeof odd[0])];
}

enum action {
	ALLOW = 0, DENY, MEMORY, MMAP, MREMAP, BRK, FD_TARGET0, FD_TARGET1, FCNTL, POLL, PRLIMIT,
	CLONE, CLONE3, FUTEX, KILL, TKILL, TGKILL, SIGACTION, SIGNAL, SOCKET, ACCEPT4, IOCTL,
	FORK, WAIT,
};
static unsigned char table[NR_SPAN];
/* Whether the environment says the calls reach only the runtime. */
static int in_guest;

static void mark(long nr, enum action a)
{
	if (nr >= 0 && nr < NR_SPAN)
		table[nr] = (unsigned char)a;
}

/* The deny-list and the steered calls, by name so one list serves both ABIs
 * (a name the ABI lacks is skipped by its #ifdef). */
static void build_table(void)
{
#define D(name) mark(SYS_##name, DENY)
	/* end or replace the process, or signal anything */
	D(exit); D(exit_group); D(execve); D(execveat);
	/* under the runtime, children that try an execve and exit at once */
	mark(SYS_fork, in_guest ? FORK : DENY);
	mark(SYS_vfork, in_guest ? FORK : DENY);
	D(rt_sigqueueinfo); D(rt_tgsigqueueinfo); D(rt_sigreturn);
#ifdef SYS_pidfd_send_signal
	D(pidfd_send_signal);
#endif
#ifdef SYS_sigreturn
	D(sigreturn);
#endif
	/* a bad argument here kills the caller later (seccomp strict mode,
	 * death signals, CPU-time limits, an rseq area) or arms a signal */
	D(prctl); D(seccomp); D(setrlimit); D(alarm); D(setitimer); D(timer_create);
#ifdef SYS_rseq
	D(rseq);
#endif
	/* block or sleep for as long as an argument says */
	D(pause); D(nanosleep); D(clock_nanosleep); D(pselect6); D(ppoll);
	D(rt_sigsuspend); D(rt_sigtimedwait); D(epoll_wait); D(epoll_pwait);
	D(io_getevents); D(msgrcv); D(mq_timedreceive); D(mq_timedsend);
	D(sync); D(syncfs); D(flock);
	/* waits never block (WNOHANG) */
	mark(SYS_wait4, WAIT);
	mark(SYS_waitid, WAIT);
#ifdef SYS_select
	D(select);
#endif
#ifdef SYS__newselect
	D(_newselect);
#endif
#ifdef SYS_sigsuspend
	D(sigsuspend);
#endif
#ifdef SYS_waitpid
	mark(SYS_waitpid, WAIT);
#endif
#ifdef SYS_semop
	D(semop);
#endif
#ifdef SYS_semtimedop
	D(semtimedop);
#endif
#ifdef SYS_ipc
	D(ipc); /* i386 multiplexer: msgrcv, semop, shmat */
#endif
#ifdef SYS_epoll_pwait2
	D(epoll_pwait2);
#endif
#ifdef SYS_futex_waitv
	D(futex_waitv);
#endif
#ifdef SYS_io_pgetevents
	D(io_pgetevents);
#endif
#ifdef SYS_io_uring_enter
	D(io_uring_enter);
#endif
#ifdef SYS_clock_nanosleep_time64
	D(clock_nanosleep_time64); D(pselect6_time64); D(ppoll_time64);
	D(rt_sigtimedwait_time64); D(semtimedop_time64);
	D(mq_timedreceive_time64); D(mq_timedsend_time64); D(io_pgetevents_time64);
#endif
	/* descriptors whose reads block (sockets are steered: below) */
	D(pipe); D(pipe2); D(socketpair); D(eventfd); D(eventfd2);
	D(signalfd); D(signalfd4); D(timerfd_create); D(inotify_init); D(inotify_init1);
	D(userfaultfd); D(perf_event_open); D(fanotify_init);
#ifdef SYS_socketcall
	D(socketcall);
#endif
	/* other processes, the machine, or mappings at arbitrary addresses */
	D(ptrace); D(process_vm_writev); D(reboot); D(iopl); D(ioperm); D(shmat);
	D(close_range); D(io_uring_setup);
	D(fallocate); /* reserves real disk space on a host */
#ifdef SYS_pidfd_getfd
	D(pidfd_getfd);
#endif
#ifdef SYS_process_madvise
	D(process_madvise);
#endif
#ifdef SYS_remap_file_pages
	D(remap_file_pages);
#endif
#if defined(__x86_64__)
	/* uretprobe and uprobe: SIGILL unless called from their trampolines */
	mark(335, DENY);
	mark(336, DENY);
#endif
#if defined(__i386__)
	D(mmap); /* i386 old_mmap: its arguments (MAP_FIXED too) come from memory */
#endif
#undef D
	mark(SYS_munmap, MEMORY); mark(SYS_mprotect, MEMORY); mark(SYS_madvise, MEMORY);
	mark(SYS_mlock, MEMORY); mark(SYS_munlock, MEMORY); mark(SYS_msync, MEMORY);
#ifdef SYS_mlock2
	mark(SYS_mlock2, MEMORY);
#endif
#ifdef SYS_pkey_mprotect
	mark(SYS_pkey_mprotect, MEMORY);
#endif
#ifdef SYS_mseal
	mark(SYS_mseal, MEMORY);
#endif
#if defined(__x86_64__)
	mark(SYS_mmap, MMAP);
#else
	mark(SYS_mmap2, MMAP);
#endif
	mark(SYS_mremap, MREMAP);
	mark(SYS_brk, BRK);
	mark(SYS_close, FD_TARGET0);
	mark(SYS_dup2, FD_TARGET1);
	mark(SYS_dup3, FD_TARGET1);
	mark(SYS_fcntl, FCNTL);
#ifdef SYS_fcntl64
	mark(SYS_fcntl64, FCNTL);
#endif
	mark(SYS_poll, POLL);
	mark(SYS_prlimit64, PRLIMIT);
	/* sockets: IPv4, always non-blocking, so no read or accept waits; a
	 * plain accept would make a blocking one */
	mark(SYS_socket, in_guest ? SOCKET : DENY);
	mark(SYS_accept4, ACCEPT4);
#ifdef SYS_accept
	mark(SYS_accept, DENY);
#endif
	mark(SYS_ioctl, IOCTL);
	mark(SYS_clone, CLONE);
#ifdef SYS_clone3
	mark(SYS_clone3, CLONE3);
#endif
	mark(SYS_futex, FUTEX);
#ifdef SYS_futex_time64
	mark(SYS_futex_time64, FUTEX);
#endif
	mark(SYS_kill, KILL);
	mark(SYS_tkill, TKILL);
	mark(SYS_tgkill, TGKILL);
	mark(SYS_rt_sigaction, SIGACTION);
#ifdef SYS_sigaction
	mark(SYS_sigaction, SIGACTION);
#endif
#ifdef SYS_signal
	mark(SYS_signal, SIGNAL);
#endif
}

/* ---- threads, futexes and signals ----
 *
 * clone and clone3 get flags that are mostly a thread's (with every extra
 * Linux allows, and sometimes a bad combination or random bits) and random
 * stacks, TLS and tid pointers; the child never touches memory: it sets a
 * robust list (often a corrupt one: cycles, wild pointers, wild offsets)
 * and exits at once, so the runtime walks that list. Without CLONE_THREAD
 * the exit signal is SIGCHLD or none. Futex waits always get a zero
 * timeout (relative or absolute: they end at once) or an unreadable one.
 * kill, tkill and tgkill send only signals whose action is to be ignored
 * (SIGCHLD, SIGCONT, SIGURG, SIGWINCH), probes (0) and invalid numbers, to
 * random pids and tids, the fuzzer's own, and threads it made (alive or
 * gone); rt_sigaction (and i386 sigaction, signal) never installs a
 * handler, only SIG_DFL or SIG_IGN. */
#define CLONE_VM 0x100
#define CLONE_FS 0x200
#define CLONE_FILES 0x400
#define CLONE_SIGHAND 0x800
#define CLONE_PIDFD 0x1000
#define CLONE_VFORK 0x4000
#define CLONE_PARENT 0x8000
#define CLONE_THREAD 0x10000
#define CLONE_SYSVSEM 0x40000
#define CLONE_SETTLS 0x80000
#define CLONE_PARENT_SETTID 0x100000
#define CLONE_CHILD_CLEARTID 0x200000
#define CLONE_DETACHED 0x400000
#define CLONE_CHILD_SETTID 0x1000000
#define THREAD_SET (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD)
#define SIGCHLD 17
#define FUTEX_CMD_MASK (~(word)(128 | 256)) /* FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME */

static const uint64_t zero_timespec[2]; /* read-only: a wait ends at once */
static long self_pid, self_tid;
static word children[8]; /* tids clone returned, alive or gone */
static unsigned nchildren, nextchild;

static int in_scratch(word p, size_t n)
{
	uintptr_t s = (uintptr_t)scratch;
	return p >= s && p - s <= SCRATCH_BYTES - n;
}

static uint64_t clone_flags64(void)
{
	static const uint64_t extras[] = {
		CLONE_SYSVSEM, CLONE_SETTLS, CLONE_PARENT_SETTID, CLONE_CHILD_CLEARTID,
		CLONE_DETACHED, CLONE_CHILD_SETTID, CLONE_VFORK, CLONE_PIDFD, CLONE_PARENT,
	};
	uint64_t f;
	switch (next() % 8) {
	case 0: /* random bits */
		f = next();
		break;
	case 1: /* a thread without CLONE_SIGHAND, or CLONE_SIGHAND without CLONE_VM */
		f = next() % 2 ? THREAD_SET & ~(uint64_t)CLONE_SIGHAND
			       : CLONE_SIGHAND | CLONE_FS | CLONE_FILES;
		break;
	case 2: /* a copy of the process sharing its memory */
		f = CLONE_VM;
		break;
	default: /* a thread, with some of what may come with one */
		f = THREAD_SET;
		for (int i = (int)(next() % 5); i > 0; i--)
			f |= extras[next() % (sizeof extras / sizeof extras[0])];
		break;
	}
	/* A copy of the process that does not share its memory is a real fork:
	 * its child exits at once (see spawn) under the runtime; on a host it
	 * gets CLONE_VM, unless CLONE_SIGHAND makes it EINVAL first. */
	if (!(f & (CLONE_VM | CLONE_SIGHAND)) && !in_guest)
		f |= CLONE_VM;
	if (!(f & CLONE_THREAD))
		f = (f & ~(uint64_t)0xff) | (next() % 2 ? SIGCHLD : 0);
	return f;
}

static word clone_flags(void)
{
	return (word)clone_flags64();
}

/* A struct clone_args (88 bytes) at an aligned place near the end of the
 * scratch buffer, or `bad` as it is (a bad pointer, half the time). */
static word clone3_args(word bad)
{
	if (next() % 4 == 0)
		return bad;
	uint64_t *c = (uint64_t *)(uintptr_t)(scratch + SCRATCH_BYTES - 256);
	uint64_t f = clone_flags64();
	c[0] = f & ~(uint64_t)0xff;               /* flags */
	c[1] = (uint64_t)arg();                    /* pidfd */
	c[2] = (uint64_t)arg();                    /* child_tid */
	c[3] = (uint64_t)arg();                    /* parent_tid */
	c[4] = next() % 8 ? (f & 0xff) : next();   /* exit_signal */
	c[5] = (uint64_t)arg();                    /* stack */
	c[6] = next() % 2 ? 0 : (uint64_t)arg();   /* stack_size */
	c[7] = (uint64_t)arg();                    /* tls */
	c[8] = next() % 8 ? 0 : (uint64_t)arg();   /* set_tid */
	c[9] = next() % 8 ? 0 : next() % 40;       /* set_tid_size */
	c[10] = next() % 8 ? 0 : next() % 8;       /* cgroup */
	c[11] = next() % 8 ? 0 : next();           /* past what Linux knows */
	return (word)(uintptr_t)c;
}

static word clone3_size(void)
{
	static const word sizes[] = {64, 80, 88, 96, 0, 8, 4096, 4097};
	return sizes[next() % (sizeof sizes / sizeof sizes[0])];
}

/* A pointer no kernel can read through (or NULL): a random one might
 * reach the fuzzer's own memory and the top of its stack is mapped. */
static word unreadable_pointer(void)
{
	static const uint64_t bad[] = {
		0, 8, 0xfff,
#if defined(__x86_64__)
		0xffffffff80100000ull, 0xffff800000000000ull, 0x0000800000000000ull,
		0x8000000000000000ull,
#else
		0xfffff000u,
#endif
	};
	unsigned k = (unsigned)(next() % (sizeof bad / sizeof bad[0] + 1));
	if (k == sizeof bad / sizeof bad[0])
		return (word)(uintptr_t)(scratch - PAGE + (next() % PAGE)); /* guard */
	return (word)bad[k];
}

static void steer_futex(word *a)
{
	switch (next() % 4) {
	case 0:
		break; /* a random op */
	case 1:
		a[1] = (word)(next() % 16) | (word)(next() % 4) * 128;
		break;
	default: /* a futex word in the scratch buffer, aligned */
		a[1] = (word)(next() % 16) | (word)(next() % 4) * 128;
		a[0] = (word)(uintptr_t)(scratch + (next() % (SCRATCH_BYTES / 4 - 64)) * 4);
		if (next() % 2)
			a[2] = *(uint32_t *)(uintptr_t)a[0]; /* the value there: a wait would wait */
		break;
	}
	switch ((uint32_t)a[1] & (uint32_t)FUTEX_CMD_MASK) { /* the kernel takes an int */
	case 0: case 6: case 9: case 11: case 13: /* WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2 */
		a[3] = next() % 8 ? (word)(uintptr_t)zero_timespec : unreadable_pointer();
		if (a[3] == 0) /* no timeout: a wait for ever */
			a[3] = (word)(uintptr_t)zero_timespec;
		break;
	}
	if (next() % 2)
		a[4] = (word)(uintptr_t)(scratch + (next() % (SCRATCH_BYTES / 4 - 64)) * 4);
}

static word pid_arg(void)
{
	switch (next() % 4) {
	case 0: return (word)self_pid;
	case 1: return 0;
	default: return arg();
	}
}

static word tid_arg(void)
{
	switch (next() % 4) {
	case 0: return (word)self_tid;
	case 1: return nchildren ? children[next() % nchildren] : (word)self_tid;
	default: return arg();
	}
}

static word harmless_signal(void)
{
	static const word sigs[] = {
		0, 0, SIGCHLD, 18 /* SIGCONT */, 23 /* SIGURG */, 28 /* SIGWINCH */,
		65, 1000, (word)-1, (word)0x80000011u, (word)0x7fffffff,
	};
	return sigs[next() % (sizeof sigs / sizeof sigs[0])];
}

/* Robust lists for the children: struct robust_list_head is {next,
 * futex_offset, list_op_pending}; entries are {next, pad, futex word}. */
static word robust[4][4];
static word robust_head[3];

static word robust_list(void)
{
	word *h = robust_head;
	word off = 2 * sizeof(word);
	for (int i = 0; i < 4; i++) {
		robust[i][0] = (word)(uintptr_t)robust[(i + 1) % 4];
		robust[i][2] = (word)(next() % 2 ? next() : 0);
	}
	h[0] = (word)(uintptr_t)robust[0];
	h[1] = off;
	h[2] = 0;
	switch (next() % 8) {
	case 0: /* a cycle that never comes back to the head */
		break;
	case 1: /* an entry that is its own successor */
		robust[1][0] = (word)(uintptr_t)robust[1];
		break;
	case 2: /* a wild pointer in the chain */
		robust[2][0] = bad_pointer();
		break;
	case 3: /* a wild futex offset */
		h[1] = (word)next();
		break;
	case 4: /* a pending entry, wild or in the cycle, PI or not */
		h[2] = next() % 2 ? bad_pointer() : (word)(uintptr_t)robust[3] | (word)(next() % 2);
		break;
	case 5: /* a random list in the scratch buffer */
		return (word)(uintptr_t)(scratch + (next() % (SCRATCH_BYTES / 8 - 8)) * 8);
	case 6: /* the head itself unreadable */
		return bad_pointer();
	default: /* a proper list: back to the head after two entries */
		robust[1][0] = (word)(uintptr_t)h;
		break;
	}
	return (word)(uintptr_t)h;
}

/* clone or clone3: the child sets robust list `head` and exits at once,
 * touching no memory (its stack and TLS are whatever the call gave it). */
static long spawn(word nr, const word *a, word head)
{
#if defined(__x86_64__)
	register word r10 __asm__("r10") = a[3];
	register word r8 __asm__("r8") = a[4];
	register word r9 __asm__("r9") = a[5];
	register word r12 __asm__("r12") = head;
	long ret;
	__asm__ volatile("syscall\n\t"
			 "test %%rax, %%rax\n\t"
			 "jnz 1f\n\t"
			 "mov %%r12, %%rdi\n\t"
			 "mov $24, %%esi\n\t"
			 "mov %[srl], %%eax\n\t"
			 "syscall\n\t"
			 "mov %[exit], %%eax\n\t"
			 "xor %%edi, %%edi\n\t"
			 "syscall\n\t"
			 "ud2\n"
			 "1:"
			 : "=a"(ret)
			 : "a"(nr), "D"(a[0]), "S"(a[1]), "d"(a[2]), "r"(r10), "r"(r8), "r"(r9),
			   "r"(r12), [srl] "i"(SYS_set_robust_list), [exit] "i"(SYS_exit)
			 : "rcx", "r11", "memory");
	return ret;
#else
	word args[7] = {a[0], a[1], a[2], a[3], a[4], a[5], head};
	word *p = args;
	long ret;
	__asm__ volatile("push %%ebp\n\t"
			 "push %%ebx\n\t"
			 "mov 24(%%esi), %%ebp\n\t"
			 "mov 0(%%esi), %%ebx\n\t"
			 "mov 4(%%esi), %%ecx\n\t"
			 "mov 8(%%esi), %%edx\n\t"
			 "mov 16(%%esi), %%edi\n\t"
			 "mov 12(%%esi), %%esi\n\t"
			 "int $0x80\n\t"
			 "test %%eax, %%eax\n\t"
			 "jnz 1f\n\t"
			 "mov %%ebp, %%ebx\n\t"
			 "mov $12, %%ecx\n\t"
			 "mov %[srl], %%eax\n\t"
			 "int $0x80\n\t"
			 "mov %[exit], %%eax\n\t"
			 "xor %%ebx, %%ebx\n\t"
			 "int $0x80\n\t"
			 "ud2\n"
			 "1:\n\t"
			 "pop %%ebx\n\t"
			 "pop %%ebp"
			 : "=a"(ret), "+S"(p)
			 : "a"(nr), "m"(args), [srl] "i"(SYS_set_robust_list), [exit] "i"(SYS_exit)
			 : "ecx", "edx", "edi", "memory");
	return ret;
#endif
}

/* fork or vfork (a copy either way under the runtime): the child tries an
 * execve of the fuzzer itself with no arguments (it prints its usage and
 * exits 2), of a missing file, a directory, a device or a random pointer,
 * with a NULL, fixed or random environment, then exits with a random
 * status. The parent gets the pid. */
static long fork_child(word nr)
{
	long pid = raw(nr, 0, 0, 0, 0, 0, 0);
	if (pid != 0)
		return pid;
	static const char *const targets[] = {"/proc/self/exe", "/no/such/program", "/", "/dev/null"};
	static char *const argv[] = {"fuzz", 0};
	word path = next() % 5 ? (word)(uintptr_t)targets[next() % 4] : arg();
	word args = next() % 2 ? (word)(uintptr_t)argv : 0;
	word env = next() % 3 == 0 ? arg() : 0;
	raw(SYS_execve, path, args, env, 0, 0, 0);
	raw(SYS_exit_group, (word)(next() & 0xff), 0, 0, 0, 0, 0);
	for (;;)
		;
}

static int protected_fd(word fd)
{
	return fd <= 2;
}

/* Applies the table to one drawn call; returns 0 to skip it. */
static int steer(word nr, word *a)
{
	for (int i = 0; i < 6; i++)
		if (a[i] == (word)console)
			return 0;
	if (nr >= NR_SPAN)
		return 1;
	switch ((enum action)table[nr]) {
	case ALLOW:
		return 1;
	case DENY:
		return 0;
	case MEMORY:
		a[0] = (word)(uintptr_t)(victim + (next() % (VICTIM_BYTES / PAGE)) * PAGE);
		if (next() % 2)
			a[1] = (word)((next() % (VICTIM_BYTES / PAGE)) * PAGE);
		if ((uintptr_t)a[0] + a[1] > (uintptr_t)victim + VICTIM_BYTES ||
		    (uintptr_t)a[0] + a[1] < (uintptr_t)a[0])
			a[1] = (word)((uintptr_t)victim + VICTIM_BYTES - (uintptr_t)a[0]);
		return 1;
	case MMAP:
		a[3] &= ~(word)MAP_FIXED;
		return 1;
	case MREMAP:
		a[0] = (word)(uintptr_t)victim;
		a[1] = (word)((next() % (VICTIM_BYTES / PAGE) + 1) * PAGE);
		a[3] &= ~(word)MREMAP_FIXED;
		return 1;
	case BRK:
		if (a[0] < initial_brk)
			a[0] = 0;
		else if (a[0] - initial_brk > BRK_SPAN && a[0] < USER_END)
			a[0] = initial_brk + a[0] % BRK_SPAN;
		return 1;
	case FD_TARGET0:
		return !protected_fd(a[0]);
	case FD_TARGET1:
		return !protected_fd(a[1]);
	case FCNTL:
		/* F_SETFL keeps O_NONBLOCK on: a socket stays non-blocking */
		if (a[1] == 4)
			a[2] |= 04000;
		return a[1] != F_SETLKW && a[1] != F_OFD_SETLKW && a[1] != F_SETLKW64;
	case SOCKET:
		a[0] = 2; /* AF_INET */
		a[1] = (a[1] & 0xf) | 04000 | (a[1] & 02000000);
		return 1;
	case ACCEPT4:
		a[3] |= 04000;
		return 1;
	case IOCTL:
		return a[1] != 0x5421; /* FIONBIO could make a socket blocking */
	case POLL:
		a[2] = 0;
		return 1;
	case PRLIMIT:
		a[2] = 0;
		return 1;
	case CLONE:
		a[0] = clone_flags();
		return 1;
	case CLONE3:
		a[0] = clone3_args(a[1]);
		a[1] = clone3_size();
		return 1;
	case FUTEX:
		steer_futex(a);
		return 1;
	case FORK:
		return 1;
	case WAIT:
		/* waitid(idtype, id, infop, options, ru); wait4 and waitpid
		 * (pid, status, options, ...): any child half the time, so
		 * that the zombies of forked children are reaped. */
		if (nr == SYS_waitid) {
			if (next() % 2)
				a[0] = 0; /* P_ALL */
			a[3] |= 1;  /* WNOHANG */
		} else {
			if (next() % 2)
				a[0] = (word)-1;
			a[2] |= 1;
		}
		return 1;
	case KILL:
		a[0] = pid_arg();
		a[1] = harmless_signal();
		return 1;
	case TKILL:
		a[0] = tid_arg();
		a[1] = harmless_signal();
		return 1;
	case TGKILL:
		a[0] = pid_arg();
		a[1] = tid_arg();
		a[2] = harmless_signal();
		return 1;
	case SIGACTION:
		/* A new action the kernel can read gets SIG_DFL or SIG_IGN:
		 * a handler at a random address would end the fuzzer at the
		 * first signal it sends itself. */
		if (in_scratch(a[1], sizeof(word))) {
			/* SIGPIPE stays ignored: a send on a socket raises it */
			word h = (word)(a[0] == 13 ? 1 : next() % 2);
			__builtin_memcpy((void *)(uintptr_t)a[1], &h, sizeof h);
		} else {
			a[1] = unreadable_pointer();
		}
		return 1;
	case SIGNAL:
		/* i386 signal(): SIG_DFL or SIG_IGN (SIGPIPE: ignored) */
		a[1] = (word)(a[0] == 13 ? 1 : next() % 2);
		return 1;
	}
	return 0;
}

static int guest_consent(char **envp)
{
	static const char want[] = "PERCH_FUZZ_GUEST=1";
	for (char **e = envp; *e; e++) {
		size_t i = 0;
		while (want[i] && (*e)[i] == want[i])
			i++;
		if (!want[i] && !(*e)[i])
			return 1;
	}
	return 0;
}

static int is_root_without_consent(char **envp)
{
	return SYS0(SYS_getuid) == 0 && !guest_consent(envp);
}

static unsigned char *map(size_t bytes, int prot)
{
	long p = raw(
#if defined(__x86_64__)
		SYS_mmap,
#else
		SYS_mmap2,
#endif
		0, (word)bytes, (word)prot, MAP_PRIVATE | MAP_ANONYMOUS, (word)-1, 0);
	return (p < 0 && p > -4096) ? NULL : (unsigned char *)(uintptr_t)p;
}

/* rt_sigreturn over a forged frame (see the top); never returns. */
static void forge(uint64_t seed)
{
	word *frame = (word *)(uintptr_t)(scratch + SCRATCH_BYTES / 2);
#if defined(__x86_64__)
	/* pretcode, uc_flags, uc_link, uc_stack (3 words), sigcontext */
	uint64_t *mc = &frame[6];
	uint64_t *fpu = (uint64_t *)(uintptr_t)(scratch + SCRATCH_BYTES / 4);
	frame[1] = 6;      /* UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS */
	frame[4] = 2;      /* SS_DISABLE */
	mc[15] = (uint64_t)(uintptr_t)(scratch + SCRATCH_BYTES / 8);
	mc[16] = (uint64_t)(uintptr_t)finish;
	mc[18] = 0x33 | (0x2bull << 48);
	mc[23] = 0;
	fpu[3] = 0x1f80;   /* MXCSR */
	switch (seed % 6) {
	case 0: mc[16] = next() | (1ull << 63); break;
	case 1: mc[16] = 0xffffffff80100000ull + (next() % 0x100000); break;
	case 2: mc[18] = (mc[18] & ~0xffffull) | ((next() % 0x10000) & ~0x30ull); break;
	case 3: mc[18] = (mc[18] & 0xffff) | ((next() % 0x10000) & ~0x28ull) << 48; break;
	case 4: mc[23] = (uint64_t)(uintptr_t)fpu; fpu[3] = 0x1f80 | (1ull << (16 + next() % 16)); break;
	default: mc[23] = (uint64_t)unreadable_pointer() | 8; break;
	}
	__asm__ volatile("mov %0, %%rsp; mov $15, %%eax; syscall"
			 : : "r"(&frame[1]) : "memory", "rax", "rcx", "r11");
#else
	(void)seed;
	__asm__ volatile("mov %0, %%esp; mov $173, %%eax; int $0x80"
			 : : "r"(&frame[1]) : "memory", "eax");
#endif
	put(console, "fuzz: the forged frame was taken\n");
	finish(1);
}

int main(int argc, char **argv, char **envp)
{
	if (argc < 2) {
		put(2, "usage: fuzz CALLS [SEED]\n");
		return 2;
	}
	if (is_root_without_consent(envp)) {
		put(2, "fuzz: refusing to fuzz a host's system calls as root "
		       "(set PERCH_FUZZ_GUEST=1 where the calls reach only the runtime)\n");
		return 2;
	}
	in_guest = guest_consent(envp);
	uint64_t calls = parse_u64(argv[1]);
	rng = argc > 2 ? parse_u64(argv[2]) : 1;
	if (rng == 0)
		rng = 1;
	uint64_t seed = rng;
	char num[24];
	put(1, "fuzz: " ABI_NAME ", ");
	put(1, utoa(num + sizeof num, calls));
	put(1, " calls, seed ");
	put(1, utoa(num + sizeof num, rng));
	put(1, "\n");

	unsigned char *area = map(SCRATCH_BYTES + 2 * PAGE, PROT_NONE);
	victim = map(VICTIM_BYTES, PROT_READ | PROT_WRITE);
	if (!area || !victim ||
	    SYS3(SYS_mprotect, area + PAGE, SCRATCH_BYTES, PROT_READ | PROT_WRITE) != 0) {
		put(2, "fuzz: cannot map the scratch buffer\n");
		return 1;
	}
	scratch = area + PAGE;
	for (size_t i = 0; i < SCRATCH_BYTES; i++)
		scratch[i] = (unsigned char)next();
	for (size_t i = 0; i < NPATHS; i++) {
		size_t n = len_of(paths[i]);
		for (size_t j = 0; j <= n; j++)
			scratch[i * PATH_SLOT + j] = (unsigned char)paths[i][j];
	}
	/* A sockaddr_in of 127.0.0.1:7000 after the paths, for the socket
	 * calls' address pointers to hit now and then. */
	static const unsigned char loopback[16] = {2, 0, 0x1b, 0x58, 127, 0, 0, 1};
	for (size_t j = 0; j < sizeof loopback; j++)
		scratch[NPATHS * PATH_SLOT + j] = loopback[j];
	initial_brk = (word)SYS0(SYS_brk);
	self_pid = SYS0(SYS_getpid);
	self_tid = SYS0(SYS_gettid);
	build_table();
	/* SIGPIPE ignored: a send on a shut socket says EPIPE, not death */
	{
		word act[6] = {1, 0, 0, 0, 0, 0};
		raw(SYS_rt_sigaction, 13, (word)(uintptr_t)act, 0, 8, 0, 0);
	}

	/* Keep the console as `console`; fds 0-2 become /dev/null. */
	static const int console_fds[] = {100, 64, 32, 20};
	for (size_t i = 0; i < sizeof console_fds / sizeof console_fds[0] && console < 0; i++)
		if (SYS3(SYS_dup2, 1, console_fds[i], 0) == console_fds[i])
			console = console_fds[i];
	if (console < 0)
		console = (int)SYS3(SYS_dup, 1, 0, 0);
	long null = raw(SYS_openat, (word)AT_FDCWD, (word)(uintptr_t)"/dev/null", O_RDWR, 0, 0, 0);
	if (console < 0 || null < 0) {
		put(2, "fuzz: cannot set up descriptors\n");
		return 1;
	}
	for (int fd = 0; fd <= 2; fd++)
		SYS3(SYS_dup2, null, fd, 0);

	uint64_t made = 0;
	while (made < calls) {
		word nr = syscall_number();
		word a[6];
		for (int i = 0; i < 6; i++)
			a[i] = arg();
		if (!steer(nr, a))
			continue;
		long ret;
		if (nr < NR_SPAN && table[nr] == FORK) {
			ret = fork_child(nr);
		} else if (nr < NR_SPAN && (table[nr] == CLONE || table[nr] == CLONE3)) {
			ret = spawn(nr, a, robust_list());
			if (ret > 0) {
				children[nextchild++ % 8] = (word)ret;
				if (nchildren < 8)
					nchildren++;
			}
		} else {
			ret = raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		}
		made++;
		/* Give back what mmap made, so that memory stays bounded over
		 * a million calls (the unmap is not counted). */
		if (table[nr < NR_SPAN ? nr : 0] == MMAP && nr < NR_SPAN && (ret >= 0 || ret < -4095))
			SYS3(SYS_munmap, ret, a[1], 0);
	}
	put(console, "fuzz: ");
	put(console, utoa(num + sizeof num, made));
	put(console, " calls made\nfuzz done\n");
	if (argc > 3 && argv[3][0] == 'f')
		forge(seed);
	finish(0);
}
