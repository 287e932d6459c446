/*
 * workers: a deterministic multi-threaded CPU-bound program for the
 * agreement test (tests/tests/agreement.rs): four pthreads, each running its
 * own hot function for its own number of rounds (different amounts of
 * work), joined by the main thread. Callgrind runs the threads one at a time
 * and sums each function's self instructions over all threads; a profile of
 * all the process's threads must give the same per-function shares.
 *
 * `workers ROUNDS` gives worker I (0..3) ROUNDS * (4 - I) / 4 rounds of its
 * function (no locks, no system calls in the hot code: the only
 * synchronisation is pthread_create and pthread_join), then prints each
 * worker's checksum in worker order and "workers: ROUNDS rounds done".
 * The same ROUNDS gives the same instructions and the same lines
 * everywhere, in any interleaving.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HOT __attribute__((noinline, noclone))
#define WORKERS 4

struct worker {
	pthread_t thread;
	unsigned index;
	long rounds;
	uint32_t checksum;
	uint32_t state[256];
};

static struct worker workers[WORKERS];

/* xorshift fill of a worker's own state. */
static void fill(struct worker *w)
{
	uint32_t x = 0x2545f491u ^ (w->index * 0x9e3779b9u);
	for (int i = 0; i < 256; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		w->state[i] = x;
	}
}

/* Worker 0: bitwise CRC-32 over the state bytes. */
HOT static uint32_t crc_round(const uint32_t *s, uint32_t crc)
{
	for (int i = 0; i < 64; i++) {
		crc ^= s[i];
		for (int k = 0; k < 32; k++)
			crc = (crc & 1) ? 0xedb88320u ^ (crc >> 1) : crc >> 1;
	}
	return crc;
}

/* Worker 1: FNV-1a over the state, one byte at a time. */
HOT static uint32_t fnv_round(const uint32_t *s, uint32_t h)
{
	for (int i = 0; i < 256; i++)
		for (int b = 0; b < 4; b++) {
			h ^= (s[i] >> (8 * b)) & 0xff;
			h *= 16777619u;
		}
	return h;
}

/* Worker 2: Collatz step counts from a seed. */
HOT static uint32_t collatz_round(uint32_t seed)
{
	uint32_t steps = 0;
	for (uint32_t n0 = seed; n0 < seed + 16; n0++) {
		uint64_t n = n0 | 1;
		while (n != 1) {
			n = (n & 1) ? 3 * n + 1 : n / 2;
			steps++;
		}
	}
	return steps;
}

/* Worker 3: insertion sort of a scrambled copy of 64 words. */
HOT static uint32_t sort_round(const uint32_t *s, uint32_t seed)
{
	uint32_t a[64];
	for (int i = 0; i < 64; i++)
		a[i] = s[i] ^ (seed * (uint32_t)(i + 1));
	for (int i = 1; i < 64; i++) {
		uint32_t v = a[i];
		int j = i - 1;
		while (j >= 0 && a[j] > v) {
			a[j + 1] = a[j];
			j--;
		}
		a[j + 1] = v;
	}
	return a[seed % 64] ^ a[63];
}

static void *work(void *arg)
{
	struct worker *w = arg;
	uint32_t h = 2166136261u;
	fill(w);
	for (long r = 0; r < w->rounds; r++) {
		switch (w->index) {
		case 0:
			h = crc_round(w->state, h);
			break;
		case 1:
			h = fnv_round(w->state, h);
			break;
		case 2:
			h += collatz_round((uint32_t)r * 16 + 1);
			break;
		default:
			h ^= sort_round(w->state, h + (uint32_t)r);
			break;
		}
	}
	w->checksum = h;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: workers ROUNDS\n");
		return 2;
	}
	long rounds = strtol(argv[1], NULL, 10);
	for (unsigned i = 0; i < WORKERS; i++) {
		workers[i].index = i;
		workers[i].rounds = rounds * (WORKERS - i) / WORKERS;
		if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) {
			printf("workers: pthread_create %u failed\n", i);
			return 1;
		}
	}
	for (unsigned i = 0; i < WORKERS; i++)
		if (pthread_join(workers[i].thread, NULL) != 0) {
			printf("workers: pthread_join %u failed\n", i);
			return 1;
		}
	for (unsigned i = 0; i < WORKERS; i++)
		printf("worker %u: %ld rounds, checksum %08x\n", i, workers[i].rounds,
		       (unsigned)workers[i].checksum);
	printf("workers: %ld rounds done\n", rounds);
	return 0;
}
