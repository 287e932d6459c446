/*
 * hotspots: a deterministic CPU-bound program with six hot functions of
 * different weights, for the agreement test (tests/tests/agreement.rs): its
 * per-function instruction shares under callgrind and its per-symbol sample
 * shares under `perch record --icount` must agree.
 *
 * `hotspots ROUNDS` runs ROUNDS rounds; each round calls every hot function
 * once on a small state it owns (no system calls, no string instructions,
 * no library calls inside the hot code), then it prints one checksum line.
 * The same ROUNDS gives the same instructions and the same line everywhere.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HOT __attribute__((noinline, noclone))

static uint32_t table[256];
static uint8_t bytes[4096];
static uint32_t words[512];
static uint8_t sieve_marks[8192];

/* Table-driven CRC-32 over the byte buffer. */
HOT static uint32_t crc_bytes(uint32_t crc)
{
	for (unsigned i = 0; i < sizeof bytes; i++)
		crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
	return crc;
}

/* FNV-1a over the words, one byte at a time. */
HOT static uint32_t fnv_words(uint32_t h)
{
	for (unsigned i = 0; i < 384; i++) {
		uint32_t w = words[i];
		for (int b = 0; b < 4; b++) {
			h ^= (w >> (8 * b)) & 0xff;
			h *= 16777619u;
		}
	}
	return h;
}

/* Insertion sort of a scrambled copy of 96 words. */
HOT static uint32_t sort_words(uint32_t seed)
{
	uint32_t a[96];
	for (int i = 0; i < 96; i++)
		a[i] = words[i] ^ (seed * (uint32_t)(i + 1));
	for (int i = 1; i < 96; i++) {
		uint32_t v = a[i];
		int j = i - 1;
		while (j >= 0 && a[j] > v) {
			a[j + 1] = a[j];
			j--;
		}
		a[j + 1] = v;
	}
	return a[seed % 96] ^ a[95];
}

/* Collatz step counts of a run of numbers. */
HOT static uint32_t collatz(uint32_t start)
{
	uint32_t steps = 0;
	for (uint32_t n0 = start; n0 < start + 24; n0++) {
		uint64_t n = n0 | 1;
		while (n != 1) {
			n = (n & 1) ? 3 * n + 1 : n / 2;
			steps++;
		}
	}
	return steps;
}

/* Sieve of Eratosthenes below limit (at most 8192); returns the prime count. */
HOT static uint32_t sieve(uint32_t limit)
{
	uint32_t count = 0;
	for (uint32_t i = 0; i < limit; i++)
		sieve_marks[i] = 1;
	for (uint32_t i = 2; i < limit; i++) {
		if (!sieve_marks[i])
			continue;
		count++;
		for (uint32_t j = i * 2; j < limit; j += i)
			sieve_marks[j] = 0;
	}
	return count;
}

/* A 6x6 integer matrix power step. */
HOT static uint32_t matmul(uint32_t seed)
{
	uint32_t m[6][6], r[6][6];
	for (int i = 0; i < 6; i++)
		for (int j = 0; j < 6; j++)
			m[i][j] = seed + (uint32_t)(i * 7 + j);
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 6; i++)
			for (int j = 0; j < 6; j++) {
				uint32_t s = 0;
				for (int x = 0; x < 6; x++)
					s += m[i][x] * m[x][j];
				r[i][j] = s;
			}
		for (int i = 0; i < 6; i++)
			for (int j = 0; j < 6; j++)
				m[i][j] = r[i][j] >> 3;
	}
	return m[seed % 6][(seed >> 3) % 6];
}

static void setup(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
		table[i] = c;
	}
	uint32_t x = 0x2545f491u;
	for (unsigned i = 0; i < sizeof bytes; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		bytes[i] = (uint8_t)(x >> 24);
	}
	for (unsigned i = 0; i < 512; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		words[i] = x;
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: hotspots ROUNDS\n");
		return 2;
	}
	long rounds = strtol(argv[1], NULL, 10);
	setup();
	uint32_t sum = 0;
	for (long r = 0; r < rounds; r++) {
		sum ^= crc_bytes(sum);
		sum ^= fnv_words(sum);
		sum ^= sort_words(sum);
		sum ^= collatz((uint32_t)r * 24 + 1);
		sum ^= sieve(2560);
		sum ^= matmul(sum);
	}
	printf("hotspots: %ld rounds, checksum %08x\n", rounds, sum);
	return 0;
}
