/*
 * attack: one hostile act per process, for Perch's isolation tests
 * (tests/tests/isolation.rs).
 *
 *   attack NAME [ADDR]
 *
 * It prints `attack: NAME` (and the address it uses, if any), then does it.
 * An attack that must be stopped is followed by `attack: NAME: NOT STOPPED`
 * when the CPU or the kernel let it through, and exit status 1; on Linux and
 * under the runtime these end with SIGSEGV instead. The few acts Linux
 * allows (mprotect(PROT_EXEC) of anonymous memory, opening descriptors until
 * EMFILE) print their result and exit 0.
 *
 * Privileged instructions (#GP at CPL 3): cli, hlt, in, out (to QEMU's exit
 * port 0xf4), rdmsr, wrmsr, mov-cr3, lgdt, lidt, invlpg, wbinvd.
 * Descriptor and page tables: sgdt-write and sidt-write (write where the
 * instruction says the table is; with UMIP the instruction itself faults),
 * write ADDR (the test passes the runtime's GDT, its page tables, the direct
 * map, each through its upper-half and its direct-map address).
 * Control transfers: ret-noncanonical, jmp-noncanonical, sigreturn-forged
 * (rt_sigreturn over a frame with a non-canonical RIP and ring-0 CS/SS),
 * sigret-rip-rt, sigret-cs, sigret-ss, sigret-mxcsr (x86-64: a good frame
 * but for a RIP in the runtime's text, ring-0 CS, ring-0 SS, reserved MXCSR
 * bits), sigret-ok (the good frame: it resumes where it says),
 * handler-noncan, handler-rt, restorer-noncan (x86-64: a signal whose
 * handler or restorer is outside user space), altstack-wild (x86-64: a
 * handler on an alternate stack that is not mapped),
 * ljmp-ring0 (far jump to the kernel code selector), ljmp-tss, ljmp-ldt,
 * mov-ss-null, mov-ss-ring0, mov-ds-ring0.
 * Segments (i386): tls-ss, tls-fs, tls-ss-clear, tls-fs-clear (below), and
 * gs-empty-tls: a handler's sigcontext names, as GS, a TLS slot it emptied;
 * the kernel's reload of GS at rt_sigreturn must not fault in ring 0 (Linux
 * loads null, and so must the runtime).
 * Execution of data (NX): exec-stack, exec-heap, exec-mprotect (allowed).
 * Exhaustion: fds (open /dev/null until EMFILE, then say how many),
 * recurse (unbounded recursion: a stack overflow).
 *
 * Built with `musl-gcc -static` (x86-64) and `gcc -m32 -static` (i386,
 * compat mode: the attacks without a 64-bit meaning are refused there).
 * `-fno-stack-protector`, so the forged frames stay as written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sched.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>
#if defined(__i386__)
#include <asm/ldt.h>

static unsigned forged_gs;

static void set_gs(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_GS] = forged_gs;
}
#endif

static const char *name;

static int not_stopped(void)
{
	printf("attack: %s: NOT STOPPED\n", name);
	return 1;
}

struct __attribute__((packed)) dtr {
	uint16_t limit;
	uintptr_t base;
};

/* A far pointer for `ljmp *mem`: offset, then selector. */
struct __attribute__((packed)) farptr {
#if defined(__x86_64__)
	uint64_t offset;
#else
	uint32_t offset;
#endif
	uint16_t selector;
};

/* Where a forged rt_sigreturn frame resumes (x86-64): only the good one
 * may get here. */
static void __attribute__((noreturn, used)) resumed(void)
{
	if (!strcmp(name, "sigret-ok")) {
		printf("attack: %s: resumed\n", name);
		_exit(0);
	}
	not_stopped();
	_exit(1);
}

/* A signal handler that returns (to whatever restorer it was given). */
static void __attribute__((used)) on_signal(int sig)
{
	(void)sig;
}

static void far_jump(uint16_t selector)
{
	struct farptr p = {0, selector};
#if defined(__x86_64__)
	__asm__ volatile("rex64 ljmp *%0" : : "m"(p) : "memory");
#else
	__asm__ volatile("ljmp *%0" : : "m"(p) : "memory");
#endif
}

static volatile int depth_sink;

/* Recursion with no end the compiler can see: it stops only when `limit`
 * (always 0 here) is reached. */
static int __attribute__((noinline)) recurse(int n, int limit)
{
	volatile char pad[256];
	pad[0] = (char)n;
	depth_sink = pad[0];
	if (n == limit)
		return 0;
	return recurse(n + 1, limit) + pad[0];
}

static int write_at(uintptr_t addr)
{
	printf("attack: %s: writing 0x%llx\n", name, (unsigned long long)addr);
	*(volatile uint64_t *)addr = 0x5a5a5a5a5a5a5a5aull;
	return not_stopped();
}

static int exec_at(unsigned char *code)
{
	code[0] = 0xc3; /* ret */
	printf("attack: %s: calling 0x%llx\n", name, (unsigned long long)(uintptr_t)code);
	((void (*)(void))code)();
	return not_stopped();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 2) {
		fprintf(stderr, "usage: attack NAME [ADDR]\n");
		return 2;
	}
	name = argv[1];
	uintptr_t addr = argc > 2 ? (uintptr_t)strtoull(argv[2], NULL, 16) : 0;
	printf("attack: %s\n", name);

	if (!strcmp(name, "cli"))
		__asm__ volatile("cli");
	else if (!strcmp(name, "hlt"))
		__asm__ volatile("hlt");
	else if (!strcmp(name, "in")) {
		unsigned char v;
		__asm__ volatile("inb $0x80, %0" : "=a"(v));
	} else if (!strcmp(name, "out"))
		/* isa-debug-exit: if this went through, QEMU would stop. */
		__asm__ volatile("outl %0, $0xf4" : : "a"(0x11));
	else if (!strcmp(name, "rdmsr")) {
		uint32_t lo, hi;
		__asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(0xc0000080));
	} else if (!strcmp(name, "wrmsr"))
		/* LSTAR := 0: the next SYSCALL would jump to page 0 in ring 0. */
		__asm__ volatile("wrmsr" : : "a"(0), "d"(0), "c"(0xc0000082));
	else if (!strcmp(name, "mov-cr3"))
		__asm__ volatile("mov %0, %%cr3" : : "r"((uintptr_t)0) : "memory");
	else if (!strcmp(name, "lgdt")) {
		struct dtr d = {0, 0};
		__asm__ volatile("lgdt %0" : : "m"(d));
	} else if (!strcmp(name, "lidt")) {
		struct dtr d = {0, 0};
		__asm__ volatile("lidt %0" : : "m"(d));
	} else if (!strcmp(name, "invlpg"))
		__asm__ volatile("invlpg (%0)" : : "r"(&name) : "memory");
	else if (!strcmp(name, "wbinvd"))
		__asm__ volatile("wbinvd");
	else if (!strcmp(name, "sgdt-write") || !strcmp(name, "sidt-write")) {
		struct dtr d = {0, 0};
		if (name[1] == 'g')
			__asm__ volatile("sgdt %0" : "=m"(d));
		else
			__asm__ volatile("sidt %0" : "=m"(d));
		printf("attack: %s: table at 0x%llx, limit %u\n", name,
		       (unsigned long long)d.base, d.limit);
		return write_at(d.base);
	} else if (!strcmp(name, "write"))
		return write_at(addr);
#if defined(__x86_64__)
	else if (!strcmp(name, "ret-noncanonical"))
		__asm__ volatile("push %0; ret" : : "r"(0x0000800000000000ull));
	else if (!strcmp(name, "jmp-noncanonical"))
		__asm__ volatile("jmp *%0" : : "r"(0xdead000000401000ull));
	else if (!strcmp(name, "sigreturn-forged")) {
		/* An rt_sigframe as Linux lays it out would start with the return
		 * address; what matters is the ucontext after it: RIP, CS, SS. A
		 * kernel that restored it would iretq to ring 0 or fault there. */
		static uint64_t frame[64];
		for (int i = 0; i < 64; i++)
			frame[i] = 0x0000800000000000ull;
		frame[5 + 16] = 0x0000800000000000ull; /* uc_mcontext.rip */
		frame[5 + 18] = 0x0000000000000008ull; /* cs/gs/fs/ss: ring-0 code */
		__asm__ volatile("mov %0, %%rsp; mov $15, %%eax; syscall"
				 : : "r"(&frame[1]) : "memory", "rax", "rcx", "r11");
	}
	else if (!strncmp(name, "sigret-", 7)) {
		/* A frame as a handler would return with, good but for one
		 * thing: sigret-rip-rt resumes at the runtime's text,
		 * sigret-cs with ring-0 code, sigret-ss with a ring-0 stack
		 * segment (under UC_STRICT_RESTORE_SS), sigret-mxcsr with
		 * reserved MXCSR bits in the FPU state; sigret-ok is the good
		 * frame, which resumes in `resumed`. */
		static uint64_t frame[64];
		static uint64_t stack[512] __attribute__((aligned(16)));
		static uint8_t fpu[512] __attribute__((aligned(64)));
		uint64_t *mc = &frame[6]; /* pretcode, uc_flags, uc_link, stack_t */
		uint32_t mxcsr = 0x1f80;
		uint16_t fcw = 0x37f;
		frame[1] = 6;             /* UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS */
		frame[4] = 2;             /* uc_stack.ss_flags: SS_DISABLE */
		mc[15] = (uint64_t)(uintptr_t)&stack[501]; /* as after a call */
		mc[16] = (uint64_t)(uintptr_t)resumed;
		mc[17] = 0x202;
		mc[18] = 0x33 | (0x2bull << 48);
		mc[23] = (uint64_t)(uintptr_t)fpu;
		if (!strcmp(name, "sigret-rip-rt"))
			mc[16] = 0xffffffff80100000ull;
		else if (!strcmp(name, "sigret-cs"))
			mc[18] = 0x08 | (0x2bull << 48);
		else if (!strcmp(name, "sigret-ss"))
			mc[18] = 0x33 | (0x10ull << 48);
		else if (!strcmp(name, "sigret-mxcsr"))
			mxcsr = 0xffff1f80u;
		else if (strcmp(name, "sigret-ok")) {
			printf("attack: %s: no such attack on this ABI\n", name);
			return 2;
		}
		memcpy(fpu, &fcw, sizeof fcw);
		memcpy(fpu + 24, &mxcsr, sizeof mxcsr);
		memcpy(fpu + 28, &(uint32_t){0xffff}, 4); /* MXCSR_MASK */
		__asm__ volatile("mov %0, %%rsp; mov $15, %%eax; syscall"
				 : : "r"(&frame[1]) : "memory", "rax", "rcx", "r11");
	}
	else if (!strncmp(name, "handler-", 8) || !strncmp(name, "restorer-", 9) ||
		 !strcmp(name, "altstack-wild")) {
		/* A SIGUSR1 action with a handler (or restorer) outside user
		 * space, or a good one on an alternate stack that is not
		 * mapped; then the signal. */
		struct {
			uint64_t handler, flags, restorer, mask;
		} act = {(uint64_t)(uintptr_t)on_signal, 0x04000000 /* SA_RESTORER */,
			 (uint64_t)(uintptr_t)on_signal, 0};
		if (!strcmp(name, "handler-noncan"))
			act.handler = 0x0000800000000000ull;
		else if (!strcmp(name, "handler-rt"))
			act.handler = 0xffffffff80100000ull;
		else if (!strcmp(name, "restorer-noncan"))
			act.restorer = 0x0000800000000000ull;
		else if (!strcmp(name, "altstack-wild")) {
			struct {
				uint64_t sp;
				int flags;
				uint64_t size;
			} ss = {0xdead0000ull, 0, 65536};
			if (syscall(SYS_sigaltstack, &ss, NULL)) {
				printf("attack: %s: sigaltstack failed\n", name);
				return 1;
			}
			act.flags |= 0x08000000; /* SA_ONSTACK */
		} else {
			printf("attack: %s: no such attack on this ABI\n", name);
			return 2;
		}
		if (syscall(SYS_rt_sigaction, 10, &act, NULL, 8)) {
			printf("attack: %s: rt_sigaction failed\n", name);
			return 1;
		}
		syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), 10);
	}
#else
	else if (!strcmp(name, "gs-empty-tls")) {
		struct user_desc d = {0};
		d.entry_number = (unsigned)-1;
		d.limit = 0xfffff;
		d.seg_32bit = 1;
		d.limit_in_pages = 1;
		if (syscall(SYS_set_thread_area, &d)) {
			printf("attack: %s: set_thread_area failed\n", name);
			return 1;
		}
		unsigned n = d.entry_number;
		memset(&d, 0, sizeof d);
		d.entry_number = n;
		d.read_exec_only = 1;
		d.seg_not_present = 1;
		if (syscall(SYS_set_thread_area, &d)) {
			printf("attack: %s: emptying the slot failed\n", name);
			return 1;
		}
		forged_gs = n * 8 + 3;
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = set_gs;
		sa.sa_flags = SA_SIGINFO;
		sigaction(SIGUSR1, &sa, 0);
		/* kill(getpid(), SIGUSR1) by hand: glibc's own calls go through
		 * GS, which reads the forged value until it is put back. */
		unsigned gs, after;
		long r;
		__asm__ volatile("mov %%gs, %0" : "=r"(gs));
		__asm__ volatile("int $0x80; mov %%gs, %1; mov %2, %%gs"
				 : "=a"(r), "=&r"(after)
				 : "r"(gs), "a"(SYS_kill), "b"(getpid()), "c"(SIGUSR1)
				 : "memory");
		printf("attack: %s: kill returned %ld, gs after sigreturn 0x%x\n", name, r, after);
		return 0;
	}
	else if (!strncmp(name, "tls-", 4)) {
		/* tls-ss, tls-fs: load a TLS segment of our own into SS (or FS;
		 * i386 glibc's TLS is GS), then make that GDT slot not present
		 * (Linux refuses: EINVAL). tls-ss-clear, tls-fs-clear: delete the
		 * slot instead (allowed). Either way the kernel's return to user
		 * mode (iret reloads SS) or its next reload of FS meets a bad
		 * descriptor: that must end the process, not the kernel. */
		int fs = name[4] == 'f', clear = strstr(name, "-clear") != NULL;
		struct user_desc d = {0};
		d.entry_number = (unsigned)-1;
		d.limit = 0xfffff;
		d.seg_32bit = 1;
		d.limit_in_pages = 1;
		d.useable = 1;
		if (syscall(SYS_set_thread_area, &d)) {
			printf("attack: %s: set_thread_area failed\n", name);
			return 1;
		}
		unsigned sel = d.entry_number * 8 + 3;
		printf("attack: %s: selector 0x%x\n", name, sel);
		if (clear) {
			unsigned n = d.entry_number;
			memset(&d, 0, sizeof d);
			d.entry_number = n;
			d.read_exec_only = 1;
			d.seg_not_present = 1;
		} else {
			d.seg_not_present = 1;
		}
		long r;
		if (!fs)
			__asm__ volatile("mov %1, %%ss; int $0x80"
					 : "=a"(r) : "r"(sel), "a"(SYS_set_thread_area), "b"(&d)
					 : "memory");
		else
			__asm__ volatile("mov %1, %%fs; int $0x80"
					 : "=a"(r) : "r"(sel), "a"(SYS_set_thread_area), "b"(&d)
					 : "memory");
		printf("attack: %s: set_thread_area returned %ld\n", name, r);
		sched_yield();
		unsigned now;
		__asm__ volatile("mov %%fs, %0" : "=r"(now));
		printf("attack: %s: after a yield, fs 0x%x\n", name, now);
		return 0;
	}
	else if (!strcmp(name, "sigreturn-forged")) {
		static uint32_t frame[64];
		for (int i = 0; i < 64; i++)
			frame[i] = 0x8; /* every segment: ring-0 code */
		__asm__ volatile("mov %0, %%esp; mov $173, %%eax; int $0x80"
				 : : "r"(&frame[1]) : "memory", "eax");
	}
#endif
	else if (!strcmp(name, "ljmp-ring0"))
		far_jump(0x08 | 3);
	else if (!strcmp(name, "ljmp-tss"))
		far_jump(0x30 | 3);
	else if (!strcmp(name, "ljmp-ldt"))
		far_jump(0x04 | 3);
	else if (!strcmp(name, "mov-ss-null"))
		__asm__ volatile("mov %0, %%ss" : : "r"(0));
	else if (!strcmp(name, "mov-ss-ring0"))
		__asm__ volatile("mov %0, %%ss" : : "r"(0x10));
	else if (!strcmp(name, "mov-ds-ring0"))
		__asm__ volatile("mov %0, %%ds; mov (%1), %%eax"
				 : : "r"(0x10 | 3), "r"(&name) : "eax");
	else if (!strcmp(name, "exec-stack")) {
		unsigned char code[64];
		return exec_at(code);
	} else if (!strcmp(name, "exec-heap"))
		return exec_at(malloc(64));
	else if (!strcmp(name, "exec-mprotect")) {
		unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			printf("attack: %s: mmap failed\n", name);
			return 1;
		}
		/* mov eax, 42; ret */
		static const unsigned char code[] = {0xb8, 42, 0, 0, 0, 0xc3};
		memcpy(p, code, sizeof code);
		if (mprotect(p, 4096, PROT_READ | PROT_EXEC)) {
			printf("attack: %s: mprotect failed: %s\n", name, strerror(errno));
			return 1;
		}
		int v = ((int (*)(void))p)();
		printf("attack: %s: code made executable returned %d\n", name, v);
		return v == 42 ? 0 : 1;
	} else if (!strcmp(name, "fds")) {
		int n = 0, fd, first = -1;
		while ((fd = open("/dev/null", O_RDONLY)) >= 0) {
			if (first < 0)
				first = fd;
			n++;
		}
		int err = errno;
		printf("attack: %s: opened %d, then %s\n", name, n,
		       err == EMFILE ? "EMFILE" : strerror(err));
		/* They are all still usable: close them, then one more open works. */
		for (int i = first; i < first + n; i++)
			if (close(i)) {
				printf("attack: %s: close(%d) failed\n", name, i);
				return 1;
			}
		fd = open("/dev/null", O_RDONLY);
		printf("attack: %s: after closing them, open gives %d\n", name, fd);
		return err == EMFILE && fd == first ? 0 : 1;
	} else if (!strcmp(name, "recurse"))
		return recurse(1, 0);
	else {
		printf("attack: %s: no such attack on this ABI\n", name);
		return 2;
	}
	return not_stopped();
}
