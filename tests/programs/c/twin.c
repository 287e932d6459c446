/*
 * twin: run twice in one appliance under two names, both linked at the
 * same address (static, non-PIE, 0x400000), to show that each process has
 * its own address space.
 *
 *   twin TAG ROUNDS
 *
 * Each round stores a value derived from TAG in a global, yields, spins a
 * while (so the other twin is likely to run in between, preempted or not)
 * and checks that the global still holds its own value. If the two shared
 * memory, one would see the other's value. It prints the global's address
 * (the same in both: same link address) and the outcome; nothing that
 * depends on the pid or on timing.
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile uint64_t shared_looking;

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: twin TAG ROUNDS\n");
		return 2;
	}
	uint64_t tag = 0;
	for (const char *c = argv[1]; *c; c++)
		tag = tag * 131 + (unsigned char)*c;
	long rounds = strtol(argv[2], NULL, 10);
	printf("twin %s: main at %p, global at %p\n", argv[1], (void *)&main,
	       (void *)&shared_looking);
	long clobbered = 0;
	volatile uint64_t spin = 0;
	for (long r = 0; r < rounds; r++) {
		uint64_t mine = tag * 1000003u + (uint64_t)r;
		shared_looking = mine;
		sched_yield();
		for (int i = 0; i < 20000; i++)
			spin += (uint64_t)i;
		if (shared_looking != mine)
			clobbered++;
	}
	printf("twin %s: %ld rounds, global clobbered in %ld\n", argv[1], rounds, clobbered);
	return clobbered ? 1 : 0;
}
