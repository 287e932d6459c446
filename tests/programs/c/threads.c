/*
 * threads: a pthreads program for the thread tests (tests/tests/threads.rs).
 *
 * `threads [N [ROUNDS]]` (N 1..16, default 4; ROUNDS default 60) starts N
 * worker threads. Each names itself "worker-I" with pthread_setname_np, says
 * it is ready and waits at a start gate (a mutex and two condition variables:
 * the main thread waits until all are ready, then broadcasts the start). Each
 * worker then runs ROUNDS rounds of the same amount of CPU work on its own
 * data (a sieve over a segment and an FNV-1a hash of a xorshift stream), so
 * the workers get similar shares of the CPU; after each round it adds its
 * result to a shared accumulator under a mutex. The main thread joins them
 * all and prints, in worker order, each worker's checksum, then the shared
 * total and the number of locked updates, then "threads done"; exit status 0.
 *
 * Every line is deterministic: no pids, tids, times or addresses, and the
 * total is a sum (the same in any interleaving).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORKERS 16
#define SEGMENT 16384

#define HOT __attribute__((noinline))

struct worker {
	pthread_t thread;
	unsigned index;
	unsigned rounds;
	uint32_t checksum;
	uint8_t marks[SEGMENT];
};

static struct worker workers[MAX_WORKERS];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t start_cond = PTHREAD_COND_INITIALIZER;
static unsigned ready;
static int started;
static uint64_t total;
static unsigned long updates;
static unsigned name_failures;

/* The primes in [base, base + SEGMENT), marked by trial division by odd
 * numbers (plain arithmetic, no library calls); returns their count and
 * folds them into *h. */
HOT static uint32_t sieve_segment(struct worker *w, uint32_t base, uint32_t *h)
{
	uint32_t count = 0;
	memset(w->marks, 1, sizeof w->marks);
	for (uint32_t p = 2; p * p < base + SEGMENT; p++) {
		uint32_t first = (base + p - 1) / p * p;
		if (first < p * p)
			first = p * p;
		for (uint32_t m = first; m < base + SEGMENT; m += p)
			w->marks[m - base] = 0;
	}
	for (uint32_t i = 0; i < SEGMENT; i++) {
		if (w->marks[i] && base + i >= 2) {
			count++;
			*h = (*h ^ (base + i)) * 16777619u;
		}
	}
	return count;
}

/* FNV-1a over 4096 words of a xorshift stream seeded by the worker and round. */
HOT static uint32_t hash_stream(uint32_t seed, uint32_t h)
{
	uint32_t x = seed | 1;
	for (int i = 0; i < 4096; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		for (int b = 0; b < 4; b++) {
			h ^= (x >> (8 * b)) & 0xff;
			h *= 16777619u;
		}
	}
	return h;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	char name[16];
	snprintf(name, sizeof name, "worker-%u", w->index);
	int named = pthread_setname_np(pthread_self(), name);

	pthread_mutex_lock(&lock);
	if (named != 0)
		name_failures++;
	ready++;
	pthread_cond_signal(&ready_cond);
	while (!started)
		pthread_cond_wait(&start_cond, &lock);
	pthread_mutex_unlock(&lock);

	uint32_t h = 2166136261u;
	for (unsigned r = 0; r < w->rounds; r++) {
		/* The same segment size for everyone: balanced work. */
		uint32_t base = 1000000u + (w->index * 1000u + r) * 64u;
		uint32_t primes = sieve_segment(w, base, &h);
		h = hash_stream(w->index * 0x9e3779b9u + r, h);
		h ^= primes;
		pthread_mutex_lock(&lock);
		total += h;
		updates++;
		pthread_mutex_unlock(&lock);
	}
	w->checksum = h;
	return NULL;
}

int main(int argc, char **argv)
{
	unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 4;
	unsigned rounds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 60;
	if (n < 1 || n > MAX_WORKERS) {
		fprintf(stderr, "threads: N must be 1..%d\n", MAX_WORKERS);
		return 2;
	}
	printf("threads: %u workers, %u rounds\n", n, rounds);
	fflush(stdout);
	for (unsigned i = 0; i < n; i++) {
		workers[i].index = i;
		workers[i].rounds = rounds;
		int e = pthread_create(&workers[i].thread, NULL, work, &workers[i]);
		if (e != 0) {
			printf("threads: pthread_create %u failed: %s\n", i, strerror(e));
			return 1;
		}
	}
	pthread_mutex_lock(&lock);
	while (ready < n)
		pthread_cond_wait(&ready_cond, &lock);
	started = 1;
	pthread_cond_broadcast(&start_cond);
	pthread_mutex_unlock(&lock);
	printf("threads: all %u workers ready\n", n);

	for (unsigned i = 0; i < n; i++) {
		int e = pthread_join(workers[i].thread, NULL);
		if (e != 0) {
			printf("threads: pthread_join %u failed: %s\n", i, strerror(e));
			return 1;
		}
	}
	for (unsigned i = 0; i < n; i++)
		printf("worker-%u: checksum %08x\n", i, (unsigned)workers[i].checksum);
	printf("total %016llx after %lu updates\n", (unsigned long long)total, updates);
	printf("names set: %s\n", name_failures == 0 ? "yes" : "no");
	printf("threads done\n");
	return 0;
}
