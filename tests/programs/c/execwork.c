/* The program tests/programs/c/exec.c runs with execve:
 * `execwork NAME ROUNDS STATUS [OPEN_FD CLOSED_FD]` prints its argv, its
 * WORKER variable, a checksum of ROUNDS rounds of work (`crunch`, the
 * function a profile names) and, when given two descriptors, whether each
 * is still open after the exec (the second had close-on-exec); then exits
 * with STATUS. Run as a script's interpreter it gets the `#!` line's
 * argument and the script's path before the script's own arguments. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* xorshift64 folded into a sum: CPU-bound, no system calls. */
__attribute__((noinline)) static uint64_t crunch(uint64_t seed, long rounds)
{
	uint64_t x = seed | 1, sum = 0;
	for (long r = 0; r < rounds; r++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		sum += x >> 3;
	}
	return sum;
}

static const char *fd_state(const char *arg)
{
	return fcntl(atoi(arg), F_GETFD) < 0 ? "closed" : "open";
}

int main(int argc, char **argv)
{
	printf("execwork: argc %d:", argc);
	for (int i = 1; i < argc; i++)
		printf(" [%s]", argv[i]);
	printf("\n");
	const char *w = getenv("WORKER");
	printf("execwork: WORKER=%s, %d-bit\n", w ? w : "(unset)", (int)(8 * sizeof(void *)));
	if (argc < 4)
		return 2;
	long rounds = atol(argv[2]);
	printf("execwork %s: %016llx\n", argv[1],
	       (unsigned long long)crunch((uint64_t)rounds * 2654435761u, rounds));
	if (argc >= 6)
		printf("execwork %s: fd %s %s, fd %s %s\n", argv[1], argv[4], fd_state(argv[4]),
		       argv[5], fd_state(argv[5]));
	fflush(stdout);
	return atoi(argv[3]);
}
