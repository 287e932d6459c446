/*
 * storm: a program that keeps the runtime busy while NMIs rain on it, for
 * Perch's NMI-storm test (tests/tests/storm.rs).
 *
 *   storm sys ROUNDS      system calls: open, read, close the input file,
 *                         getpid, clock_gettime, write to /dev/null, and a
 *                         sched_yield every 8 rounds (task switches)
 *   storm fault ROUNDS    page faults: map 64 KiB, touch every page (each
 *                         touch a demand fault), sum, unmap
 *   storm compute ROUNDS  arithmetic only (preempted by the timer)
 *   storm die ROUNDS      compute, then write to address 0: killed by SIGSEGV
 *   storm exit ROUNDS S   compute, then exit with status S
 *   storm threads ROUNDS  four threads: each computes, then hands a token
 *                         round the ring of threads through a mutex and a
 *                         condition variable (futex waits and wakes), and
 *                         faults in a page of its own; joined at the end
 *
 * Every mode prints a line every ROUNDS/4 rounds and a last line with a
 * checksum of what it did, the same on Linux and under the runtime (no
 * pids, times or addresses). Built with `gcc -static`.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static uint64_t compute(uint64_t h, long i)
{
	for (int k = 0; k < 2000; k++)
		h = (h ^ (uint64_t)(i + k)) * 0x100000001b3ull;
	return h;
}

static void progress(const char *mode, long i, long rounds, uint64_t h)
{
	if (rounds >= 4 && (i + 1) % (rounds / 4) == 0)
		printf("storm %s: %ld/%ld rounds, checksum %016llx\n", mode, i + 1, rounds,
		       (unsigned long long)h);
}

#define THREADS 4
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_turn = PTHREAD_COND_INITIALIZER;
static int turn;
static long ring_rounds;
static uint64_t ring_sums[THREADS];

/* One thread of `storm threads`: its own checksum, passed on in turn. */
static void *ring_thread(void *arg)
{
	int me = (int)(intptr_t)arg;
	uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)me;
	for (long i = 0; i < ring_rounds; i++) {
		h = compute(h, i);
		volatile unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
						 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED) {
			p[0] = (unsigned char)i;
			h = (h ^ p[0]) * 0x100000001b3ull;
			munmap((void *)p, 4096);
		}
		pthread_mutex_lock(&ring_lock);
		while (turn != me)
			pthread_cond_wait(&ring_turn, &ring_lock);
		turn = (turn + 1) % THREADS;
		pthread_cond_broadcast(&ring_turn);
		pthread_mutex_unlock(&ring_lock);
	}
	ring_sums[me] = h;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: storm sys|fault|compute|die|exit|threads ROUNDS [STATUS]\n");
		return 2;
	}
	/* Line-buffered: what a killed process printed is out before it dies. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *mode = argv[1];
	long rounds = strtol(argv[2], NULL, 10);
	uint64_t h = 0xcbf29ce484222325ull;
	if (!strcmp(mode, "sys")) {
		int null = open("/dev/null", O_WRONLY);
		for (long i = 0; i < rounds; i++) {
			unsigned char buf[4096];
			int fd = open("data/input.txt", O_RDONLY);
			if (fd < 0 || null < 0) {
				printf("storm sys: open failed\n");
				return 1;
			}
			ssize_t n;
			while ((n = read(fd, buf, sizeof buf)) > 0)
				h = fnv(h, buf, (size_t)n);
			close(fd);
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			h ^= getpid() > 0;
			if (write(null, buf, 64) != 64) {
				printf("storm sys: write failed\n");
				return 1;
			}
			if (i % 8 == 0)
				sched_yield();
			progress(mode, i, rounds, h);
		}
	} else if (!strcmp(mode, "fault")) {
		const size_t len = 64 << 10;
		for (long i = 0; i < rounds; i++) {
			volatile unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
							 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED) {
				printf("storm fault: mmap failed\n");
				return 1;
			}
			for (size_t o = 0; o < len; o += 4096)
				p[o] = (unsigned char)(i + o / 4096);
			for (size_t o = 0; o < len; o += 4096)
				h = (h ^ p[o]) * 0x100000001b3ull;
			munmap((void *)p, len);
			progress(mode, i, rounds, h);
		}
	} else if (!strcmp(mode, "compute") || !strcmp(mode, "die") || !strcmp(mode, "exit")) {
		for (long i = 0; i < rounds; i++) {
			h = compute(h, i);
			progress(mode, i, rounds, h);
		}
		if (!strcmp(mode, "die")) {
			printf("storm die: writing to 0\n");
			*(volatile int *)0 = 1;
			printf("storm die: NOT KILLED\n");
		}
		if (!strcmp(mode, "exit"))
			return argc > 3 ? atoi(argv[3]) : 0;
	} else if (!strcmp(mode, "threads")) {
		pthread_t t[THREADS];
		ring_rounds = rounds;
		for (int k = 0; k < THREADS; k++)
			if (pthread_create(&t[k], NULL, ring_thread, (void *)(intptr_t)k)) {
				printf("storm threads: pthread_create failed\n");
				return 1;
			}
		for (int k = 0; k < THREADS; k++) {
			pthread_join(t[k], NULL);
			h = fnv(h, (const unsigned char *)&ring_sums[k], sizeof ring_sums[k]);
			printf("storm threads: thread %d checksum %016llx\n", k,
			       (unsigned long long)ring_sums[k]);
		}
	} else {
		fprintf(stderr, "storm: unknown mode %s\n", mode);
		return 2;
	}
	printf("storm %s: done, checksum %016llx\n", mode, (unsigned long long)h);
	return 0;
}
