/*
 * shootdown: memory one thread takes away while another thread, running at
 * the same time (on another CPU under the runtime's sched=spread), keeps
 * using it. Every change must reach the other thread at once, as Linux's
 * TLB shootdowns make it: a CPU that kept a stale translation would let the
 * reader go on reading a page that is gone, or writing one made read-only.
 *
 * `shootdown [ROUNDS]` (default 20) runs ROUNDS rounds of each check:
 * - unmap: a reader thread spins reading a fresh page; the main thread
 *   unmaps it once the reader has read it many times. The reader's next
 *   reads must fault (SIGSEGV, caught with siglongjmp).
 * - protect: a writer thread spins writing a fresh page; the main thread
 *   makes it read-only. The writer's next writes must fault.
 * munmap and mprotect return only once every CPU dropped the old
 * translation, so the first access after the change faults; a thread that
 * goes on for 10,000 accesses after it reports a stale mapping. One line per check; `shootdown done`;
 * exit status 0, or 1 when a check failed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STALE_LIMIT 10000UL

static volatile uint64_t *page;
static volatile int phase;	/* 0 not started, 1 touching, 2 changed */
static volatile uint64_t touches;
static __thread sigjmp_buf env;
static __thread volatile int faulting;

static void on_segv(int sig)
{
	(void)sig;
	if (faulting)
		siglongjmp(env, 1);
	_exit(3);
}

/* Returns 0 when the change reached the thread (it faulted), 1 otherwise. */
static void *toucher(void *arg)
{
	int write = arg != NULL;
	unsigned long after = 0;
	faulting = 1;
	if (sigsetjmp(env, 1))
		return (void *)0;
	for (;;) {
		if (write)
			page[1] = touches;
		else
			(void)page[0];
		touches++;
		if (phase == 0)
			phase = 1;
		if (phase == 2 && ++after > STALE_LIMIT)
			return (void *)1;
	}
}

static int round_of(int write)
{
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	page[0] = 42;
	phase = 0;
	touches = 0;
	pthread_t t;
	if (pthread_create(&t, NULL, toucher, write ? (void *)1 : NULL) != 0) {
		fprintf(stderr, "pthread_create failed\n");
		exit(1);
	}
	/* Let the toucher use the page for a while. */
	while (phase == 0 || touches < 100000)
		;
	int r = write ? mprotect((void *)page, 4096, PROT_READ)
		      : munmap((void *)page, 4096);
	if (r != 0) {
		perror(write ? "mprotect" : "munmap");
		exit(1);
	}
	phase = 2;
	void *stale;
	pthread_join(t, &stale);
	if (write)
		munmap((void *)page, 4096);
	return stale != NULL;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	if (rounds < 1 || rounds > 1000) {
		fprintf(stderr, "usage: shootdown [ROUNDS 1..1000]\n");
		return 2;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_segv;
	sigaction(SIGSEGV, &sa, NULL);
	int failed = 0;
	for (int write = 0; write < 2; write++) {
		int stale = 0;
		for (int i = 0; i < rounds; i++)
			stale += round_of(write);
		printf("%s: %d of %d rounds faulted after the change\n",
		       write ? "protect" : "unmap", rounds - stale, rounds);
		failed |= stale != 0;
	}
	printf("shootdown done\n");
	return failed;
}
