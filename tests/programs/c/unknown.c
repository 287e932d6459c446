/*
 * unknown: makes system calls the runtime does not implement, so that the
 * run's summary must name them: acct (x86-64 163, i386 51) three times and
 * the number 1000, which Linux does not have, twice. Under the runtime each
 * returns ENOSYS; it prints one line per kind. Built for both ABIs.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *result(long n, long nr, long arg)
{
	static char buf[32];
	int all_enosys = 1;
	for (long i = 0; i < n; i++) {
		errno = 0;
		long r = syscall(nr, arg);
		if (!(r == -1 && errno == ENOSYS))
			all_enosys = 0;
	}
	if (all_enosys)
		return "ENOSYS";
	snprintf(buf, sizeof buf, "not ENOSYS (errno %d)", errno);
	return buf;
}

int main(void)
{
	printf("acct(NULL) x3: %s\n", result(3, SYS_acct, 0));
	printf("syscall 1000 x2: %s\n", result(2, 1000, 0));
	return 0;
}
