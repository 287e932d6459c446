/*
 * efault: system calls handed a runtime pointer or an unmapped pointer must
 * fail with EFAULT (and never fault the kernel or the runtime).
 *
 * Raw system calls (libc's wrappers may touch the buffer themselves), one
 * line per call: `NAME: ERRNAME`. The same lines on Linux and under the
 * runtime. Built with `gcc -static` (x86-64; the "runtime pointer" is the
 * runtime's upper half) and `gcc -m32 -static` (i386; there a 32-bit
 * pointer cannot reach the runtime, so the top page of the 4 GiB space
 * stands in for it). On x86-64 also good buffers with lengths that run past
 * the end of user space (EFAULT too: Linux checks the whole range first).
 * Exits with status 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__)
#define KERNEL_PTR ((void *)0xffffffff80100000ull)
#define ABI "x86_64"
/* A length no buffer has: from any user address it runs past user space. */
#define HUGE (1ull << 62)
#else
#define KERNEL_PTR ((void *)0xfffff000u)
#define ABI "i386"
#endif
#define UNMAPPED ((void *)8)

static void report(const char *what, long ret)
{
	const char *name;
	if (ret >= 0)
		name = "no error";
	else if (-ret == EFAULT)
		name = "EFAULT";
	else if (-ret == ENOSYS)
		name = "ENOSYS";
	else if (-ret == EBADF)
		name = "EBADF";
	else if (-ret == EINVAL)
		name = "EINVAL";
	else if (-ret == ENOENT)
		name = "ENOENT";
	else
		name = "another error";
	printf("%s: %s\n", what, name);
}

/* syscall() returns -1 and sets errno; fold it into one value. */
static long sys(long r)
{
	return r == -1 ? -errno : r;
}

int main(void)
{
	printf("efault: " ABI "\n");
	report("write(1, runtime pointer, 16)", sys(syscall(SYS_write, 1, KERNEL_PTR, 16)));
	report("write(1, unmapped pointer, 16)", sys(syscall(SYS_write, 1, UNMAPPED, 16)));
	int fd = open("data/input.txt", O_RDONLY);
	if (fd < 0) {
		printf("efault: cannot open data/input.txt\n");
		return 1;
	}
	report("read(file, unmapped pointer, 16)", sys(syscall(SYS_read, fd, UNMAPPED, 16)));
	report("read(file, runtime pointer, 16)", sys(syscall(SYS_read, fd, KERNEL_PTR, 16)));
	struct iovec iov = {KERNEL_PTR, 16};
	report("writev(1, iovec of a runtime pointer)", sys(syscall(SYS_writev, 1, &iov, 1)));
	report("writev(1, runtime pointer as iovec)", sys(syscall(SYS_writev, 1, KERNEL_PTR, 1)));
#if defined(__x86_64__)
	report("newfstatat(path, runtime pointer)",
	       sys(syscall(SYS_newfstatat, AT_FDCWD, "data/input.txt", KERNEL_PTR, 0)));
	report("newfstatat(unmapped path)", sys(syscall(SYS_newfstatat, AT_FDCWD, UNMAPPED, KERNEL_PTR, 0)));
	report("fstat(file, runtime pointer)", sys(syscall(SYS_fstat, fd, KERNEL_PTR)));
#else
	report("stat64(path, runtime pointer)", sys(syscall(SYS_stat64, "data/input.txt", KERNEL_PTR)));
	report("stat64(unmapped path)", sys(syscall(SYS_stat64, UNMAPPED, KERNEL_PTR)));
	report("fstat64(file, runtime pointer)", sys(syscall(SYS_fstat64, fd, KERNEL_PTR)));
#endif
	report("openat(runtime pointer path)", sys(syscall(SYS_openat, AT_FDCWD, KERNEL_PTR, O_RDONLY)));
	report("getcwd(runtime pointer, 64)", sys(syscall(SYS_getcwd, KERNEL_PTR, 64)));
	report("uname(unmapped pointer)", sys(syscall(SYS_uname, UNMAPPED)));
	report("clock_gettime(MONOTONIC, runtime pointer)",
	       sys(syscall(SYS_clock_gettime, 1, KERNEL_PTR)));
	report("getrandom(runtime pointer, 16)", sys(syscall(SYS_getrandom, KERNEL_PTR, 16, 0)));
#if defined(__x86_64__)
	/* Good buffers with lengths that run past the end of user space. (An
	 * i386 process's range is checked against the 64-bit limit by Linux, so
	 * there such a write goes through up to the first unmapped page.) */
	char small[16];
	report("write(1, stack buffer, huge)", sys(syscall(SYS_write, 1, small, HUGE)));
	report("read(file, stack buffer, huge)", sys(syscall(SYS_read, fd, small, HUGE)));
	report("read(file, runtime pointer, huge)", sys(syscall(SYS_read, fd, KERNEL_PTR, HUGE)));
#endif
	/* A good call still works afterwards. */
	char buf[6] = {0};
	long n = pread(fd, buf, 5, 0);
	printf("pread64(file, good buffer, 5): %ld bytes \"%s\"\n", n, n == 5 ? buf : "");
	close(fd);
	printf("efault: done\n");
	return 0;
}
